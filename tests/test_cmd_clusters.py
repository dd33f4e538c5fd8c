"""``planner clusters``: the preset table and its JSON."""

from __future__ import annotations

import json

from click.testing import CliRunner

from planner.cli import main


def test_clusters_json_lists_presets() -> None:
    r = CliRunner().invoke(main, ["clusters", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    names = {c["name"] for c in doc["clusters"]}
    assert {"pipepar-4x2-2080ti", "pipedream-4x4-10g", "a100-8x8-nvlink-ib", "h100-8x8-nvlink-ib",
            "mixed-a100-v100-2080ti"} <= names
    for c in doc["clusters"]:
        assert c["kind"] == "cluster" and c["nodes"] and "intra_node" in c["links"]


def test_clusters_table() -> None:
    r = CliRunner().invoke(main, ["clusters"])
    assert r.exit_code == 0
    assert "pipepar-4x2-2080ti" in r.output


def test_clusters_table_shows_the_16_bit_peak_beside_fp32() -> None:
    """An LLM plan computes in bf16: the table gives that peak too (312 for the A100), not fp32 alone."""
    r = CliRunner().invoke(main, ["clusters"])
    assert r.exit_code == 0
    assert "19.5 fp32, 312 bf16" in r.output and "13.4 fp32, 53.8 fp16" in r.output

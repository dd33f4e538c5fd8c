"""calibrate: this machine as a cluster JSON that the rest of planner reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner import ir
from planner.calibrate import calibrate, cluster_doc, measure_flops, measure_memory_bandwidth
from planner.errors import UsageError
from tests.conftest import make_profile_dict


def test_flops_benchmark_is_positive_and_finite() -> None:
    got = measure_flops(1)
    assert 1e8 < got["flops"] < 1e14
    assert min(got["matmul_flops"], got["conv_flops"]) <= got["flops"] <= max(got["matmul_flops"], got["conv_flops"])


@pytest.mark.slow
def test_calibrated_cluster_is_a_valid_cluster_of_p_devices() -> None:
    cluster, meta = calibrate(2, 1)
    doc = cluster_doc(cluster, meta)
    back = ir.Cluster.from_dict(doc)
    assert [g.name for g in back.gpus] == ["cpu0", "cpu1"]
    link = back.link("intra_node")
    assert link.bandwidth_Bps > 1e6 and 0 < link.latency_s < 0.1
    assert meta["allreduce_s"] > 0 and meta["flops_source"] == "benchmark"
    assert {g.memory_bandwidth_Bps for g in back.gpus} == {meta["memory_bandwidth_Bps"]}


def test_memory_bandwidth_benchmark_is_plausible() -> None:
    assert 1e8 < measure_memory_bandwidth(1, mib=8) < 1e13


@pytest.mark.slow
def test_match_profile_takes_the_profiles_flops() -> None:
    profile = ir.ModelProfile.from_dict(make_profile_dict(device_flops=3.5e10))
    cluster, meta = calibrate(2, 1, name="x", profile=profile)
    assert {g.flops for g in cluster.gpus} == {3.5e10} and meta["flops_source"] == "profile"


def test_one_process_is_refused() -> None:
    with pytest.raises(UsageError, match="--nproc"):
        calibrate(1)


@pytest.mark.slow
def test_cli_writes_a_cluster_file(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from planner.cli import main

    out = tmp_path / "cluster.json"
    res = CliRunner().invoke(main, ["calibrate", "-o", str(out), "--nproc", "2", "--threads", "1"])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["kind"] == "cluster" and len(doc["nodes"][0]["gpus"]) == 2

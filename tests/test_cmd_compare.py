"""planner compare: table, --json per the contract, --plot, and bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from planner.cli import main
from tests.conftest import make_cluster_dict, make_profile_dict


def _write(tmp_path: Path, name: str, doc: Any) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return str(path)


@pytest.fixture
def files(tmp_path: Path) -> tuple[str, str]:
    return (_write(tmp_path, "p.json", make_profile_dict(8, batch_size=16)),
            _write(tmp_path, "c.json", make_cluster_dict(2, 2)))


def _run(*args: str) -> Any:
    return CliRunner().invoke(main, ["compare", *args])


def test_json_lists_every_strategy_with_the_contract_keys(files: tuple[str, str]) -> None:
    profile, cluster = files
    result = _run(profile, "--cluster", cluster, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    names = [s["name"] for s in doc["strategies"]]
    for name in ("dp", "planner", "gpipe-uniform", "deepspeed", "accpar", "pipedream", "torchgpipe"):
        assert name in names
    for row in doc["strategies"]:
        assert {"name", "iteration_s", "samples_per_s", "fits", "config", "speedup_over_dp",
                "peak_memory_bytes", "reason", "setting", "settings"} <= set(row)
        assert row["setting"] in [s["setting"] for s in row["settings"]]  # the row names one of its settings
    assert "speedup" not in result.stdout.split("{", 1)[0]  # nothing but JSON on stdout


def test_table_goes_to_stderr_and_plot_is_a_png(files: tuple[str, str], tmp_path: Path) -> None:
    profile, cluster = files
    png = tmp_path / "cmp.png"
    result = _run(profile, "--cluster", cluster, "--plot", str(png), "--strategies", "dp,planner,gpipe-uniform")
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert "planner" in result.stderr and "gpipe-uniform" in result.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".cmp.png")]  # no temporary left


def test_options_reach_the_comparison(files: tuple[str, str]) -> None:
    profile, cluster = files
    result = _run(profile, "--cluster", cluster, "--json", "--microbatches", "4", "--schedule", "gpipe",
                  "--optimizer", "adam")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    planner = next(s for s in doc["strategies"] if s["name"] == "planner")
    assert planner["microbatches"] == 4 and planner["schedule"] == "gpipe"
    assert doc["optimizer"] == "adam"


@pytest.mark.parametrize(("args", "code", "needle"), [
    (["--microbatches", "3"], 2, "divide"),
    (["--microbatches", "zero"], 2, "auto"),
    (["--strategies", "dp,alpa"], 2, "alpa"),
    (["--schedule", "nope"], 2, "nope"),
])
def test_bad_options_are_usage_errors(files: tuple[str, str], args: list[str], code: int, needle: str) -> None:
    profile, cluster = files
    result = _run(profile, "--cluster", cluster, *args)
    assert result.exit_code == code, result.output
    assert needle in result.output
    assert "Traceback" not in result.output


def test_bad_files_exit_1_with_one_line(tmp_path: Path, files: tuple[str, str]) -> None:
    profile, cluster = files
    bad = _write(tmp_path, "bad.json", "{not json")
    wrong_kind = _write(tmp_path, "wk.json", make_cluster_dict())
    for args, needle in (([bad, "--cluster", cluster], "not valid JSON"),
                         ([wrong_kind, "--cluster", cluster], "kind"),
                         ([str(tmp_path / "missing.json"), "--cluster", cluster], "no such file"),
                         ([profile, "--cluster", "no-such-preset"], "no-such-preset")):
        result = _run(*args)
        assert result.exit_code == 1, result.output
        assert needle in result.output and "Traceback" not in result.output


def test_rerank_zero_shows_the_analytic_optimum(files: tuple[str, str]) -> None:
    profile, cluster = files
    result = _run(profile, "--cluster", cluster, "--json", "--rerank", "0", "--strategies", "planner")
    assert result.exit_code == 0, result.output
    names = [s["name"] for s in json.loads(result.stdout)["strategies"]]
    assert names == ["dp", "planner"]  # dp is always there: it is the yardstick


def test_bad_cluster_values_exit_1_naming_the_field(tmp_path: Path, files: tuple[str, str]) -> None:
    profile, _ = files
    doc = make_cluster_dict(2, 2)
    doc["links"]["inter_node"]["bandwidth_Bps"] = 0
    result = _run(profile, "--cluster", _write(tmp_path, "zero.json", doc))
    assert result.exit_code == 1, result.output
    assert "bandwidth_Bps" in result.output and "Traceback" not in result.output


def test_nothing_fits_exits_3_after_the_table(tmp_path: Path) -> None:
    profile = _write(tmp_path, "p.json", make_profile_dict(4, batch_size=8))
    cluster = _write(tmp_path, "tiny.json", make_cluster_dict(1, 2, memory_bytes=1_000_000))
    result = _run(profile, "--cluster", cluster, "--plot", str(tmp_path / "x.png"))
    assert result.exit_code == 3, result.output
    assert "no strategy fits" in result.stderr and "dp does not fit" in result.stderr
    assert not (tmp_path / "x.png").exists()


def test_unwritable_plot_leaves_nothing_behind(files: tuple[str, str], tmp_path: Path) -> None:
    profile, cluster = files
    result = _run(profile, "--cluster", cluster, "--plot", str(tmp_path / "nope" / "x.png"))
    assert result.exit_code == 1
    assert "does not exist" in result.output
    assert not (tmp_path / "nope").exists()

"""``planner simulate PLAN``: the contract JSON, trace, picture, and bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from planner.cli import main
from tests.test_simulate import make_plan


def run(*args: str) -> Result:
    return CliRunner().invoke(main, ["simulate", *args])


def write(path: Path, doc: dict[str, Any] | str) -> Path:
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


@pytest.fixture
def plan_doc() -> dict[str, Any]:
    return make_plan("1f1b", 4).to_dict()


def test_json_contract(tmp_path: Path, plan_doc: dict[str, Any]) -> None:
    result = run(str(write(tmp_path / "plan.json", plan_doc)), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["kind"] == "simulation" and doc["version"] == 1
    assert doc["iteration_s"] > 0 and 0 <= doc["bubble_fraction"] < 1
    assert [d["device"] for d in doc["devices"]] == ["n0.g0", "n1.g0"]
    for d in doc["devices"]:
        assert d["busy_s"] > 0 and d["peak_memory_bytes"] > 0
    assert doc["schedule"] == "1f1b" and doc["config"] == "1-1"
    assert "│" in result.stderr and "iteration" in result.stderr  # the text Gantt and summary go to stderr


def test_every_schedule_runs(tmp_path: Path) -> None:
    plans = [make_plan(name, 4) for name in ("gpipe", "1f1b", "pipedream", "zb-h1")]
    plans.append(make_plan("interleaved", 4, 4, 2, [((0, 1), ("n0.g0",)), ((1, 2), ("n1.g0",)),
                                                    ((2, 3), ("n0.g0",)), ((3, 4), ("n1.g0",))]))
    for i, plan in enumerate(plans):
        result = run(str(write(tmp_path / f"p{i}.json", plan.to_dict())), "--json", "--table", "--width", "40")
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["schedule"] == plan.schedule
        assert "Step 00:" in result.stderr


def test_a_trace_onto_the_plan_itself_is_refused_and_the_plan_kept(tmp_path: Path, plan_doc: dict[str, Any]) -> None:
    plan = write(tmp_path / "plan.json", plan_doc)
    before = plan.read_text()
    result = run(str(plan), "--trace", str(plan))
    assert result.exit_code == 2 and "is the command's input" in result.stderr
    assert plan.read_text() == before and sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_a_plan_that_overflows_memory_says_so_in_a_warning(tmp_path: Path, plan_doc: dict[str, Any]) -> None:
    for node in plan_doc["cluster"]["nodes"]:
        for gpu in node["gpus"]:
            gpu["memory_bytes"] = 1000
    result = run(str(write(tmp_path / "plan.json", plan_doc)), "--json")
    assert result.exit_code == 0, result.output
    warnings = json.loads(result.stdout)["warnings"]
    assert any("the plan does not fit: 2 of 2 devices" in w for w in warnings)
    assert "the plan does not fit" in result.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e308"])  # 1e308 MiB: SimOptions.bucket_bytes inf, unnamed
def test_a_number_option_that_is_not_finite_is_bad_usage(tmp_path: Path, plan_doc: dict[str, Any], value: str) -> None:
    result = run(str(write(tmp_path / "plan.json", plan_doc)), "--overlap-allreduce", "--bucket-mb", value)
    assert result.exit_code == 2 and "--bucket-mb" in result.stderr


def test_trace_and_plot(tmp_path: Path, plan_doc: dict[str, Any]) -> None:
    trace, png = tmp_path / "t.json", tmp_path / "g.png"
    result = run(str(write(tmp_path / "plan.json", plan_doc)), "--trace", str(trace), "--plot", str(png),
                 "--overlap-allreduce", "-q")
    assert result.exit_code == 0, result.output
    assert result.stdout == "" and result.stderr == ""
    doc = json.loads(trace.read_text())
    events = doc["traceEvents"]
    assert any(e["ph"] == "X" and e["name"] == "0F0" for e in events)
    threads = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"n0.g0", "n1.g0"} <= threads and any(t.endswith(" fwd") for t in threads)
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.png", "plan.json", "t.json"]


@pytest.mark.parametrize("name", ["g.svg", "g.JPG", "g.pdf", "g.txt", "plan2.json"])
def test_a_plot_named_as_another_format_is_refused_before_anything_is_written(
        tmp_path: Path, plan_doc: dict[str, Any], name: str) -> None:
    """The picture is drawn as PNG: under an .svg or .jpg name it was PNG bytes a viewer of that format cannot
    open, and under a .txt or .json name (a plan named by mistake) it overwrote the file. Usage error (exit 2),
    the fix names the .png, nothing written; a name without a suffix is taken as given."""
    result = run(str(write(tmp_path / "plan.json", plan_doc)), "--trace", str(tmp_path / "t.json"),
                 "--plot", str(tmp_path / name))
    assert result.exit_code == 2, result.output
    assert "the picture is drawn as PNG" in result.stderr and "Traceback" not in result.output
    assert Path(name).stem + ".png" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]
    assert run(str(tmp_path / "plan.json"), "--plot", str(tmp_path / "G.PNG"), "-q").exit_code == 0
    assert run(str(tmp_path / "plan.json"), "--plot", str(tmp_path / "gantt"), "-q").exit_code == 0
    assert (tmp_path / "gantt").read_bytes()[:4] == b"\x89PNG"


def leaves_nothing(tmp_path: Path, result: Result, message: str) -> None:
    assert result.exit_code == 1, result.output
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.output
    assert not (tmp_path / "t.json").exists() and not (tmp_path / "g.png").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def outputs(tmp_path: Path) -> list[str]:
    return ["--trace", str(tmp_path / "t.json"), "--plot", str(tmp_path / "g.png"), "--json"]


def test_truncated_plan(tmp_path: Path, plan_doc: dict[str, Any]) -> None:
    text = json.dumps(plan_doc)
    result = run(str(write(tmp_path / "plan.json", text[: len(text) // 2])), *outputs(tmp_path))
    leaves_nothing(tmp_path, result, "not valid JSON")
    assert result.stdout == ""


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.update(kind="profile"), "field 'kind' is 'profile', expected 'plan'"),
    (lambda d: d.update(version=7), "'version' is 7"),
    (lambda d: d.update(schedule="zigzag"), "unknown schedule 'zigzag'"),
    (lambda d: d["stages"][1].update(layers=[3, 4], forms=["dp"]), "layer 2 in no stage"),
    (lambda d: d["stages"][1].update(layers=[1, 4], forms=["dp"] * 3), "layer 1 is in two stages"),
    (lambda d: d["stages"][1].update(devices=["n7.g3"]), "device 'n7.g3', which is not in cluster"),
    (lambda d: d["stages"][0].update(forms=["dp"]), "1 forms for 2 layers"),
    (lambda d: d.pop("stages"), "missing field 'stages'"),
    (lambda d: d.update(microbatches=3), "do not divide the batch size"),
])
def test_bad_plans_exit_1_and_leave_nothing(tmp_path: Path, plan_doc: dict[str, Any], edit: Any,
                                            message: str) -> None:
    edit(plan_doc)
    result = run(str(write(tmp_path / "plan.json", plan_doc)), *outputs(tmp_path))
    leaves_nothing(tmp_path, result, message)


def test_missing_plan_file_and_output_folder(tmp_path: Path, plan_doc: dict[str, Any]) -> None:
    result = run(str(tmp_path / "none.json"))
    assert result.exit_code == 1 and "no such file" in result.stderr
    plan = write(tmp_path / "plan.json", plan_doc)
    result = run(str(plan), "--trace", str(tmp_path / "missing" / "t.json"))
    assert result.exit_code == 1 and "does not exist" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_simulate_explains_the_plan(tmp_path: Path, plan_doc: dict[str, Any]) -> None:
    result = run(str(write(tmp_path / "plan.json", plan_doc)), "--json", "--explain")
    assert result.exit_code == 0, result.output
    e = json.loads(result.stdout)["explanation"]
    assert e["judged"] is False and e["bound"] in ("compute", "transfers", "all-reduce", "optimizer", "bubble")
    assert len(e["stages"]) == 2
    assert "why this plan" in result.stderr and "where the" in result.stderr and "memory headroom" in result.stderr

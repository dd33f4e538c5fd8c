"""The hostile battery: every generated case (tests/hostile.py) ends clean; fuzzed JSON never crashes the readers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner import ir
from planner.errors import PlannerError
from planner.jsonio import read_json
from tests import hostile

CASES = hostile.all_cases()


def test_the_battery_is_large_and_covers_every_command() -> None:
    assert len(CASES) >= 200
    assert len({c.id for c in CASES}) == len(CASES)
    commands = {c.args[0] for c in CASES}
    assert commands == {"search", "simulate", "compare", "export", "run", "calibrate", "profile"}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_case_is_clean(case: hostile.Case, tmp_path: Path) -> None:
    outcome = hostile.run_case(case, tmp_path)
    assert outcome.verdict == "clean", (outcome.why, outcome.exit_code, outcome.stderr[-600:])


def test_a_failed_run_keeps_the_file_it_would_have_replaced(tmp_path: Path) -> None:
    _, _, plan = hostile.base_docs()
    (tmp_path / "plan.json").write_bytes(hostile.encode(plan))
    (tmp_path / "t.json").write_text("previous")
    case = hostile.Case(("simulate", "{tmp}/plan.json", "--trace", "{tmp}/t.json", "--plot", "{tmp}/no/g.png"),
                        message="does not exist", outputs=("t.json",), id="keep")
    outcome = hostile.run_case(case, tmp_path)
    assert outcome.verdict == "clean", outcome.why
    assert (tmp_path / "t.json").read_text() == "previous"


def test_a_link_is_written_through(tmp_path: Path) -> None:
    case = next(c for c in CASES if c.id == "simulate-trace-link-to-file")
    assert hostile.run_case(case, tmp_path).verdict == "clean"
    assert (tmp_path / "lf").is_symlink() and json.loads((tmp_path / "real").read_text())["traceEvents"]


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
                    max_leaves=20)


def _mutated(base: dict[str, Any], data: st.DataObject) -> dict[str, Any]:
    """``base`` with one value somewhere replaced by arbitrary JSON."""
    doc = json.loads(json.dumps(base))
    node: Any = doc
    while isinstance(node, (dict, list)) and node and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(sorted(node) if isinstance(node, dict) else list(range(len(node)))))
        if not isinstance(node[key], (dict, list)) or not node[key]:
            break
        node = node[key]
    if isinstance(node, dict) and node:
        node[data.draw(st.sampled_from(sorted(node)))] = data.draw(JSON)
    return doc


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), kind=st.sampled_from(["profile", "cluster", "plan"]))
def test_fuzzed_documents_load_or_fail_cleanly(tmp_path: Path, data: st.DataObject, kind: str) -> None:
    profile, cluster, plan = hostile.base_docs()
    doc = _mutated({"profile": profile, "cluster": cluster, "plan": plan}[kind], data)
    path = tmp_path / f"{kind}.json"
    path.write_text(json.dumps(doc))
    from planner.cluster import cluster_from_dict
    from planner.consistency import load_plan

    try:
        if kind == "plan":
            load_plan(path)
        elif kind == "cluster":
            cluster_from_dict(read_json(path, "cluster"), str(path))
        else:
            ir.ModelProfile.from_dict(read_json(path, "profile"), str(path))
    except PlannerError as exc:
        assert "\n" not in exc.cause


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_fuzzed_bytes_never_crash_the_reader(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / "x.json"
    path.write_bytes(raw)
    with pytest.raises(PlannerError):
        read_json(path, "profile")


def test_a_crash_while_printing_leaves_no_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import planner.render.search

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("printing failed")

    monkeypatch.setattr(planner.render.search, "print_plan", broken)
    case = next(c for c in CASES if c.id == "search-o-existing-file")
    outcome = hostile.run_case(case, tmp_path)
    assert outcome.exit_code == 1 and "internal error: RuntimeError: printing failed" in outcome.stderr
    assert (tmp_path / "old").read_text() == "previous" and sorted(p.name for p in tmp_path.iterdir()) == [
        "c.json", "old", "p.json"]


def _planner(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    return subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=120)


def test_in_a_real_process_names_cannot_drive_the_terminal(tmp_path: Path) -> None:
    profile, cluster, _ = hostile.base_docs()
    (tmp_path / "p.json").write_bytes(hostile.encode(hostile.mutate(profile, ("model",), "\x1b]0;pwned\x07[/]")))
    (tmp_path / "c.json").write_bytes(hostile.encode(cluster))
    hostile.device("full", 7)(tmp_path)
    done = _planner("search", "p.json", "--cluster", "c.json", "--rerank", "0", "-o", "full", cwd=tmp_path)
    assert done.returncode == 1 and "not a regular file" in done.stderr and "Traceback" not in done.stderr
    done = _planner("search", "p.json", "--cluster", "c.json", "--rerank", "0", "-o", "plan.json", cwd=tmp_path)
    assert done.returncode == 0 and "\x1b" not in done.stderr and "\\x1b]0;pwned\\x07[/]" in done.stderr


def test_in_a_real_process_a_printing_factory_keeps_json_clean(tmp_path: Path) -> None:
    code = ("import os\nfrom torch import nn\nos.write(1, b'fd-level noise\\n')\ndef build():\n"
            "    print('python-level noise')\n    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))\n")
    (tmp_path / "noisy_model.py").write_text(code)
    done = _planner("profile", "noisy_model:build", "--mode", "analytic", "--input-shape", "4", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["kind"] == "profile"
    assert "fd-level noise" in done.stderr and "python-level noise" in done.stderr

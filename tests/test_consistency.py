"""consistency: a plan file must agree with itself; suspicious but simulable plans come back as warnings."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from planner import consistency
from planner.consistency import load_plan, prediction_gap
from planner.errors import PlannerError
from tests import hostile


def _write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    path = tmp_path / "plan.json"
    path.write_bytes(hostile.encode(doc))
    return path


def test_a_plan_from_search_loads_without_warnings(tmp_path: Path) -> None:
    _, _, doc = hostile.base_docs()
    plan, warnings = load_plan(_write(tmp_path, doc))
    assert warnings == [] and plan.config == "2-2" and plan.batch_size == 16


@pytest.mark.parametrize(("path", "value", "message"), [
    (("batch_size",), 32, "'batch_size' is 32 but the plan's profile gives 16"),
    (("model",), "other", "'model' is 'other'"),
    (("engine",), "tensorflow", "unknown engine 'tensorflow'"),
    (("solver",), "magic", "'solver' is 'magic'"),
    (("config",), "1-3", "'config' is '1-3' but the stages give '2-2'"),
    (("stages", 0, "dp"), 1, "stages[0].dp is 1 but its 2 devices at tp 1 give 2"),
    (("stages", 1, "micro_batch_size"), 4, "stages[1].micro_batch_size is 4 but batch 16 / (4 micro-batches x dp 2)"),
    (("stages", 1, "devices"), ["n0.g0", "n9.g0"], "'n9.g0', which is not in cluster"),
    (("microbatches",), 3, "3 micro-batches do not divide the batch size 16"),
])
def test_hand_edits_are_refused(tmp_path: Path, path: tuple[str | int, ...], value: Any, message: str) -> None:
    _, _, doc = hostile.base_docs()
    with pytest.raises(PlannerError) as err:
        load_plan(_write(tmp_path, hostile.mutate(doc, path, value)))
    assert message in err.value.cause


@pytest.mark.parametrize(("path", "value", "message"), [
    (("stages", 1, "layers"), [1, 3], "layer 1 is in two stages"),
    (("stages", 1, "devices"), ["n0.g0", "n0.g1"], "device 'n0.g0' is in stage 0 and stage 1"),
    (("stages", 1, "devices"), ["n9.g0", "n1.g1"], "'n9.g0', which is not in cluster"),
])
def test_refusals_of_the_plans_checks_name_the_file(tmp_path: Path, path: tuple[str | int, ...], value: Any,
                                                    message: str) -> None:
    """The simulator's checks (layer cover, devices) know no file: loading one names it, as every other refusal."""
    _, _, doc = hostile.base_docs()
    file = _write(tmp_path, hostile.mutate(doc, path, value))
    with pytest.raises(PlannerError) as err:
        load_plan(file)
    assert err.value.cause.startswith(f"{file}: ") and message in err.value.cause


def test_edited_times_are_a_warning_beyond_the_tolerance(tmp_path: Path) -> None:
    _, _, doc = hostile.base_docs()
    predicted = doc["predicted"]["iteration_s"]
    for factor, warned in ((1.01, False), (1.03, True), (0.5, True)):
        edited = hostile.mutate(doc, ("predicted", "iteration_s"), predicted * factor)
        _, warnings = load_plan(_write(tmp_path, edited))
        assert bool(warnings) == warned, (factor, warnings)
    _, warnings = load_plan(_write(tmp_path, hostile.mutate(doc, ("predicted", "iteration_s"), predicted * 2)),
                            check_prediction=False)
    assert warnings == []


def test_an_edited_peak_memory_is_a_warning_beyond_the_tolerance(tmp_path: Path) -> None:
    """A peak of 10**15 bytes written into a plan on 11.8 GiB devices drew no warning from any command."""
    _, _, doc = hostile.base_docs()
    peak = doc["predicted"]["peak_memory_bytes"]
    for value, warned in ((peak, False), (int(peak * 1.01), False), (int(peak * 1.5), True), (10**15, True),
                          (peak // 3, True)):
        _, warnings = load_plan(_write(tmp_path, hostile.mutate(doc, ("predicted", "peak_memory_bytes"), value)))
        assert any("the plan predicts a peak of" in w for w in warnings) == warned, (value, warnings)


def test_a_plan_whose_devices_overflow_their_memory_is_a_warning(tmp_path: Path) -> None:
    """simulate, export and run all read plans through load_plan: each warns of a plan that does not fit."""
    _, _, shared = hostile.base_docs()
    doc = copy.deepcopy(shared)
    for node in doc["cluster"]["nodes"]:
        for gpu in node["gpus"]:
            gpu["memory_bytes"] = 1000
    _, warnings = load_plan(_write(tmp_path, doc))
    assert any("the plan does not fit: 4 of 4 devices need more memory than they have" in w for w in warnings)


def test_settings_that_change_nothing_are_a_warning(tmp_path: Path) -> None:
    _, _, doc = hostile.base_docs()
    edited = hostile.mutate(hostile.mutate(doc, ("stages", 0, "sequence_parallel"), True), ("stages", 1, "recompute"),
                            "selective")
    _, warnings = load_plan(_write(tmp_path, edited), check_prediction=False)
    assert any("stage 0 sets sequence_parallel at tp 1, which changes nothing" in w for w in warnings)
    blocks = any(layer.get("block") for layer in doc["profile"]["layers"])
    assert any("stage 1 recomputes 'selective'" in w for w in warnings) == (not blocks)
    assert not blocks  # a model of no block: sequence parallelism changes nothing at tp 2 either
    widths = [len(st["devices"]) for st in doc["stages"]]
    assert widths[0] == 2
    tp2 = hostile.mutate(hostile.mutate(doc, ("stages", 0, "sequence_parallel"), True), ("stages", 0, "tp"), 2)
    for key, value in (("dp", 1), ("zero", 0), ("micro_batch_size", 4)):  # one tensor group of 2: batch 16 / M 4
        tp2 = hostile.mutate(tp2, ("stages", 0, key), value)
    _, warnings = load_plan(_write(tmp_path, tp2), check_prediction=False)
    assert any("stage 0 sets sequence_parallel with no transformer block in the 'tp' form" in w for w in warnings)


def test_prediction_gap_wording() -> None:
    assert prediction_gap(1.0, 1.019, "p") == [] and prediction_gap(1.0, 0.981, "p") == []
    [warning] = prediction_gap(0.010, 10.0, "p")
    assert "predicts 10 ms" in warning and "simulates to 1e+04 ms" in warning and "1e+03x" in warning


def test_a_prediction_of_zero_is_a_warning(tmp_path: Path) -> None:
    """A plan predicting 0 s drew no warning (the check skipped predictions of 0) and simulate showed no prediction."""
    assert prediction_gap(0.0, 0.0, "p") == []
    [warning] = prediction_gap(0.0, 0.0123, "p")
    assert "predicts 0 ms per iteration but simulates to 12.3 ms (no time at all predicted)" in warning
    _, _, doc = hostile.base_docs()
    _, warnings = load_plan(_write(tmp_path, hostile.mutate(doc, ("predicted", "iteration_s"), 0)))
    assert any("predicts 0 ms per iteration" in w for w in warnings)


def test_an_edited_stage_memory_is_a_warning(tmp_path: Path) -> None:
    """A stage's memory_bytes (what planner run reports as each rank's predicted memory) set to 1 byte drew no warning:
    only the plan's overall peak was checked."""
    _, _, doc = hostile.base_docs()
    memory = doc["stages"][1]["memory_bytes"]
    for value, warned in ((memory, False), (int(memory * 1.01), False), (1, True), (memory * 2, True)):
        _, warnings = load_plan(_write(tmp_path, hostile.mutate(doc, ("stages", 1, "memory_bytes"), value)))
        assert any("stage 1 predicts" in w and "its memory_bytes may have been edited" in w
                   for w in warnings) == warned, (value, warnings)


def test_known_solvers_name_each_once() -> None:
    """'dp' is a solver and a baseline: the hint listed it twice."""
    solvers = consistency.known_solvers()
    assert len(solvers) == len(set(solvers)) and "dp" in solvers and "brute" in solvers


def test_a_plan_its_engine_cannot_run_is_a_warning(tmp_path: Path) -> None:
    _, _, doc = hostile.base_docs()
    _, warnings = load_plan(_write(tmp_path, hostile.mutate(hostile.mutate(doc, ("engine",), "deepspeed"),
                                                            ("schedule",), "gpipe")))
    assert any("cannot run on deepspeed" in w and "gpipe" in w for w in warnings)


def test_big_plans_skip_the_simulated_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, doc = hostile.base_docs()
    monkeypatch.setattr(consistency, "MAX_SIMULATED_ACTIONS", 1)
    edited = hostile.mutate(doc, ("predicted", "iteration_s"), doc["predicted"]["iteration_s"] * 5)
    assert load_plan(_write(tmp_path, edited))[1] == []


def test_simulate_and_export_report_warnings_in_json(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from planner.cli import main

    _, _, doc = hostile.base_docs()
    path = _write(tmp_path, hostile.mutate(doc, ("predicted", "iteration_s"), doc["predicted"]["iteration_s"] * 3))
    result = CliRunner().invoke(main, ["simulate", str(path), "--json"])
    assert result.exit_code == 0 and "warning: " in result.stderr
    assert len(json.loads(result.stdout)["warnings"]) == 1


def test_a_plan_searched_for_no_engine_that_none_runs_is_a_warning(tmp_path: Path) -> None:
    """The search's warning comes back wherever the plan file is read (simulate, export, run): three processes on one
    server and one on the other, which no engine's launcher starts."""
    from planner import ir
    from planner.search import search
    from tests.conftest import make_cluster_dict, make_profile_dict

    profile = make_profile_dict(6, batch_size=16)
    for layer in profile["layers"][:2]:
        layer["param_bytes"], layer["param_count"] = 100_000_000, 25_000_000
    cluster = make_cluster_dict(2, 3)
    cluster["nodes"][1]["gpus"] = cluster["nodes"][1]["gpus"][:1]
    plan = search(ir.ModelProfile.from_dict(profile), ir.Cluster.from_dict(cluster))
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.to_dict()))
    _, warnings = load_plan(path)
    assert [w for w in warnings if "no engine runs this plan (deepspeed, torch: the plan runs different" in w], warnings
    _, warnings = load_plan(_write(tmp_path, hostile.base_docs()[2]))  # a plan DeepSpeed and torch run: none
    assert warnings == []

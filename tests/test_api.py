"""planner.api: the steps as library functions, from values or from their JSON files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import planner
from planner import ir
from planner.errors import UsageError
from planner.search import search
from planner.simulate import simulate
from tests.conftest import make_cluster_dict, make_profile_dict


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    prof, clus = tmp_path / "p.json", tmp_path / "c.json"
    prof.write_text(json.dumps(make_profile_dict(8, batch_size=8)))
    clus.write_text(json.dumps(make_cluster_dict(2, 2)))
    return prof, clus


def test_search_plan_from_files_is_the_search(files: tuple[Path, Path]) -> None:
    prof, clus = files
    plan = planner.search_plan(prof, str(clus), microbatches=4)
    profile = planner.load_profile(prof)
    cluster = ir.Cluster.from_dict(make_cluster_dict(2, 2))
    assert plan == search(profile, cluster, microbatches=4)
    assert planner.load_profile(profile) is profile


def test_search_plan_interleaved_defaults_to_two_chunks(files: tuple[Path, Path]) -> None:
    prof, clus = files
    plan = planner.search_plan(prof, str(clus), schedule="interleaved", microbatches=4, config=(1, 1))
    assert plan.virtual_stages == 2 and len(plan.stages) == 4
    assert plan.config == "1-1"  # per device group, as --config takes it: not one entry per chunk
    with pytest.raises(UsageError, match="needs --schedule interleaved"):
        planner.search_plan(prof, str(clus), virtual_stages=2)


def test_plan_steps_from_a_plan_file(files: tuple[Path, Path], tmp_path: Path) -> None:
    prof, clus = files
    plan = planner.search_plan(prof, str(clus), microbatches=4, candidates=0)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.to_dict()))
    assert planner.load_plan(path) == plan
    sim = planner.simulate_plan(path)
    assert sim.to_dict() == simulate(plan).to_dict()
    judged = planner.judge_plan(path)
    assert judged.fits and judged.prediction.iteration_s == pytest.approx(sim.iteration_s)


def test_compare_strategies(files: tuple[Path, Path]) -> None:
    prof, clus = files
    c = planner.compare_strategies(prof, str(clus), strategies=["dp", "gpipe-uniform"], microbatches=4)
    assert [s.name for s in c.strategies] == ["dp", "gpipe-uniform"]


def test_profile_model_analytic() -> None:
    pytest.importorskip("torch")
    prof = planner.profile_model("mlp", batch_size=8, mode="analytic", device_flops="v100")
    assert prof.batch_size == 8 and prof.layers


def test_profile_model_takes_config_overrides_as_planner_profile_set_does() -> None:
    pytest.importorskip("torch")
    prof = planner.profile_model("llama-tiny", batch_size=2, mode="analytic", input_shape=(16,), device_flops="a100",
                                 overrides={"num_hidden_layers": 3})
    assert sum(layer.block is not None for layer in prof.layers) == 3


def test_export_plan_writes_the_program(files: tuple[Path, Path], tmp_path: Path) -> None:
    pytest.importorskip("torch")
    prof, clus = files
    plan: Any = planner.search_plan(prof, str(clus), microbatches=2, engine="torch", config=(2, 2), candidates=0)
    written = planner.export_plan(plan, "torch", tmp_path / "out")
    assert {p.name for p in written} >= {"train.py", "plan.json", "README.md"}


@pytest.mark.parametrize("value", [5, {"kind": "profile"}, None, 1.5])
def test_a_value_that_is_neither_the_type_nor_a_path_is_a_usage_error(value: Any) -> None:
    """It was a TypeError from deep in the file reader."""
    with pytest.raises(UsageError, match=rf"a profile must be a planner\.ir\.ModelProfile or the path of its JSON "
                                         rf"file, got {type(value).__name__}"):
        planner.load_profile(value)
    with pytest.raises(UsageError, match=r"a plan must be a planner\.ir\.Plan or the path"):
        planner.load_plan(value)
    with pytest.raises(UsageError, match=r"a cluster must be a planner\.ir\.Cluster or the path of its JSON file or a "
                                         r"preset's name"):
        planner.search_plan(ir.ModelProfile.from_dict(make_profile_dict(4)), value)


@pytest.mark.parametrize(("option", "value"), [("tp", "2"), ("tp", 2.0), ("tp", True), ("micro_batch_size", "4"),
                                                ("max_blocks", 1.5)])
def test_whole_number_options_given_as_something_else_are_usage_errors(files: tuple[Path, Path], option: str,
                                                                         value: Any) -> None:
    prof, clus = files
    with pytest.raises(UsageError, match=f"must be a whole number, got {value!r}"):
        planner.search_plan(prof, str(clus), **{option: value})


def test_hand_built_values_obey_their_files_rules(files: tuple[Path, Path]) -> None:
    """A GPU with negative FLOP/s searched a plan, a stage with ZeRO 7 was a KeyError, tp "2" a TypeError."""
    import dataclasses as dc

    prof, clus = files
    cluster = ir.Cluster.from_dict(make_cluster_dict(2, 2))
    node = cluster.nodes[0]
    bad = dc.replace(cluster, nodes=(dc.replace(node, gpus=(dc.replace(node.gpus[0], flops=-1e12), *node.gpus[1:])),
                                     *cluster.nodes[1:]))
    with pytest.raises(planner.PlannerError, match=r"gpus\[0\]\.flops is -1000000000000\.0, below the minimum 1000"):
        planner.search_plan(prof, bad)
    plan = planner.search_plan(prof, str(clus), candidates=0)
    for change, message in (({"zero": 7}, r"unknown stages\[0\]\.zero 7"), ({"tp": "2"}, "malformed field"),
                            ({"recompute": "x"}, r"stages\[0\]\.recompute")):
        wrong = dc.replace(plan, stages=(dc.replace(plan.stages[0], **change), *plan.stages[1:]))
        with pytest.raises(planner.PlannerError, match=message):
            planner.simulate_plan(wrong)
    assert planner.load_plan(plan) is plan


@pytest.mark.parametrize(("field", "value", "message"), [
    ("flops", 1e-300, r"flops is 1e-300, below the minimum 1000 \(FLOP/s\)"),  # was exit 3: "no plan fits in memory"
    ("memory_bandwidth_Bps", 1e-300, "memory_bandwidth_Bps is 1e-300, below the minimum 1000"),  # a plan of 1e305 s
    ("memory_bytes", 10**40, "memory_bytes is 1" + "0" * 40 + r", above the maximum 1e\+15"),
    ("flops", float("inf"), "flops is inf: not a finite number")])
def test_hand_built_values_obey_their_files_bounds(files: tuple[Path, Path], field: str, value: Any,
                                                   message: str) -> None:
    """A value built in Python was read back by from_dict only, not through the schema a file meets: a GPU of 1e-300
    FLOP/s searched to exit 3 "no plan fits in the devices' memory (40 GiB per device)", one of 1e-300 bytes/s
    memory bandwidth to a plan predicting 2.3e305 s."""
    import dataclasses as dc

    prof, _ = files
    cluster = ir.Cluster.from_dict(make_cluster_dict(2, 2))
    node = cluster.nodes[0]
    bad = dc.replace(cluster, nodes=(dc.replace(node, gpus=(dc.replace(node.gpus[0], **{field: value}),
                                                            *node.gpus[1:])), *cluster.nodes[1:]))
    with pytest.raises(planner.FormatError, match=r"cluster value: nodes\[0\]\.gpus\[0\]\." + message):
        planner.search_plan(prof, bad)


def test_a_hand_built_plan_meets_the_checks_of_a_plan_file(files: tuple[Path, Path]) -> None:
    """An unknown solver, engine or a prediction of 1e300 s were simulated as given."""
    import dataclasses as dc

    prof, clus = files
    plan = planner.search_plan(prof, str(clus), candidates=0)
    for wrong, message in ((dc.replace(plan, solver="magic"), "'solver' is 'magic'"),
                           (dc.replace(plan, engine="tensorflow"), "unknown engine 'tensorflow'"),
                           (dc.replace(plan, predicted=dc.replace(plan.predicted, iteration_s=1e300)),
                            r"predicted\.iteration_s is 1e\+300, above the maximum")):
        with pytest.raises(planner.PlannerError, match=message):
            planner.simulate_plan(wrong)
    assert planner.judge_plan(plan).fits


@pytest.mark.parametrize(("call", "message"), [
    ({"candidates": "2"}, "candidates must be a whole number"), ({"candidates": -1}, "candidates must be"),
    ({"progress": "yes"}, "progress must be a function"), ({"alternatives": ()}, "alternatives must be a list"),
    ({"config": 21}, "is not a sequence of devices per stage"), ({"zero": 1.0}, "unknown --zero 1.0"),
    ({"zero": True}, "unknown --zero True"), ({"max_blocks": 0}, "max_blocks must be at least 1")])
def test_search_arguments_of_the_wrong_kind_are_usage_errors(files: tuple[Path, Path], call: dict[str, Any],
                                                            message: str) -> None:
    prof, clus = files
    with pytest.raises(UsageError, match=message):
        planner.search_plan(prof, str(clus), **call)


def test_other_arguments_of_the_wrong_kind_are_usage_errors(files: tuple[Path, Path], tmp_path: Path) -> None:
    prof, clus = files
    plan = planner.search_plan(prof, str(clus), candidates=0)
    with pytest.raises(UsageError, match=r"options must be a planner\.simulate\.SimOptions"):
        planner.simulate_plan(plan, {"duplex": False})  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="recompute must be True or False"):
        planner.judge_plan(plan, recompute="yes")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="NUL character"):
        planner.load_plan("a\0b")


def test_memory_headroom_keeps_a_share_of_every_gpu_free_as_the_cli_does(files: tuple[Path, Path]) -> None:
    prof, clus = files
    plan = planner.search_plan(prof, str(clus), microbatches=4, memory_headroom=0.25)
    whole = make_cluster_dict(2, 2)["nodes"][0]["gpus"][0]["memory_bytes"]
    assert {g.memory_bytes for g in plan.cluster.gpus} == {int(whole * 0.75)}
    assert plan.cluster.memory_kept_free == 0.25
    c = planner.compare_strategies(prof, str(clus), strategies=["dp"], microbatches=4, memory_headroom=0.25)
    assert c.strategies[0].plan is not None and c.strategies[0].plan.cluster.memory_kept_free == 0.25
    for bad in (-0.1, 0.95, "0.1", True, float("nan")):
        with pytest.raises(UsageError, match="memory_headroom must be a number in"):
            planner.search_plan(prof, str(clus), memory_headroom=bad)

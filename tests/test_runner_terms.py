"""runner.terms: a step's time per term, measured (profiler events by name) and predicted (the simulator)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest

from planner import ir
from planner.runner.terms import MEASURED, AsRun, as_run_prediction, classify, predicted_terms, stage_terms, term_of
from planner.simulate import simulate
from tests.test_validate import make_plan


@dataclass
class Ev:
    name: str
    seconds: float
    cpu_children: list[Ev] = field(default_factory=list)


@pytest.mark.parametrize(("name", "term"), [
    ("aten::linear", "compute"), ("autograd::engine::evaluate_function: AddmmBackward0", "compute"),
    ("c10d::send", "transfers"), ("c10d::recv_", "transfers"), ("c10d::broadcast_", "transfers"),
    ("c10d::allreduce_", "allreduce"), ("Optimizer.step#SGD.step", "optimizer"), ("ProfilerStep#1", None),
])
def test_operators_are_put_in_their_term_by_name(name: str, term: str | None) -> None:
    assert term_of(name) == term


def test_classify_counts_top_level_operators_looks_into_ranges_and_leaves_the_rest_to_other() -> None:
    events = [Ev("aten::linear", 0.010, [Ev("aten::addmm", 0.009)]), Ev("gloo:send", 0.5),
              Ev("DeepSpeedEngine.step", 0.008, [Ev("Optimizer.step#SGD.step", 0.006), Ev("c10d::allreduce_", 0.001)]),
              Ev("c10d::recv_", 0.004)]
    got = classify(events, 0.030, lambda e: e.seconds)
    assert set(got) == set(MEASURED)
    assert got["compute"] == pytest.approx(0.010) and got["transfers"] == pytest.approx(0.004)
    assert got["optimizer"] == pytest.approx(0.006) and got["allreduce"] == pytest.approx(0.001)
    assert got["other"] == pytest.approx(0.030 - 0.021)


def test_predicted_terms_add_up_to_the_simulated_iteration_per_stage() -> None:
    plan = make_plan("1f1b", 4)
    sim = simulate(plan)
    terms = predicted_terms(plan, "torch")
    assert len(terms) == 2 and all(t["engine"] == 0 for t in terms)
    for lane, t in enumerate(terms):
        busy = sim.lane_result(lane).busy_s
        assert t["compute"] + t["allreduce"] + t["optimizer"] == pytest.approx(busy)
        assert t["idle"] == pytest.approx(sim.iteration_s - busy)
    assert terms[0]["transfers"] == pytest.approx(terms[1]["transfers"])
    assert terms[0]["transfers"] > 0


def test_the_engine_term_is_what_its_overheads_add() -> None:
    plan = make_plan("1f1b", 4)
    over = ir.EngineOverhead(1e-3, 2e-3, 5e-3)
    known = dataclasses.replace(plan, cluster=dataclasses.replace(plan.cluster, engine_overheads=(("torch", over),)))
    terms = predicted_terms(known, "torch")
    # each stage: 4 micro-batches x (2 actions + 1 send) + one step
    assert [t["engine"] for t in terms] == pytest.approx([4 * (2e-3 + 2e-3) + 5e-3] * 2)
    assert predicted_terms(known, "deepspeed") == predicted_terms(plan, "deepspeed")
    rows = stage_terms(known, "torch", [dict.fromkeys(MEASURED, 1.0), dict.fromkeys(MEASURED, 3.0)], [0, 1])
    assert [r["measured"]["compute"] for r in rows] == [1.0, 3.0] and rows[0]["predicted"] == terms[0]
    assert stage_terms(known, "torch", None, [0, 1])[1]["measured"] is None


def test_on_shared_cores_the_terms_but_transfers_add_up_to_the_iteration_per_stage() -> None:
    """Processes sharing cores compute faster while fewer compute: the terms are the explanation's,
    compute as played, so busy and idle still make up the iteration."""
    plan = make_plan("1f1b", 4)
    nodes = tuple(dataclasses.replace(n, concurrent_devices=1.0, sharing_efficiency=0.9) for n in plan.cluster.nodes)
    over = ir.EngineOverhead(1e-3, 2e-3, 5e-3)
    shared = dataclasses.replace(plan, cluster=dataclasses.replace(plan.cluster, nodes=nodes,
                                                                   engine_overheads=(("torch", over),)))
    sim = simulate(dataclasses.replace(shared, engine="torch"))
    for t in predicted_terms(shared, "torch"):
        assert sum(v for k, v in t.items() if k != "transfers") == pytest.approx(sim.iteration_s)


def test_a_plan_the_cost_model_cannot_cost_has_no_prediction() -> None:
    plan = make_plan("1f1b", 4)
    bad = dataclasses.replace(plan, stages=(dataclasses.replace(plan.stages[0], forms=("split_out", "dp")),
                                            plan.stages[1]))
    rows = stage_terms(bad, "torch", [dict.fromkeys(MEASURED, 1.0)] * 2, [0, 1])
    assert [r["predicted"] for r in rows] == [None, None] and rows[1]["measured"]["other"] == 1.0


def test_a_run_on_another_engine_than_the_plans_is_predicted_as_that_engine_runs_it() -> None:
    """A plan searched without --engine (or for another engine) run by DeepSpeed: predicted_iteration_s was the
    plan's own (11.5 ms for mlp on 2 CPU processes) while its per-stage terms, the plan as DeepSpeed runs it, added
    up to 17.9 ms; the run's prediction is now those terms' total, with a warning that says both."""
    plan = make_plan("1f1b", 4)
    over = ir.EngineOverhead(1e-3, 2e-3, 5e-3)
    overheads = (("deepspeed", over),)
    known = dataclasses.replace(plan, cluster=dataclasses.replace(plan.cluster, engine_overheads=overheads))
    own_sim = simulate(known)  # as the search predicts a plan for any engine
    known = dataclasses.replace(known, predicted=ir.Prediction(own_sim.iteration_s, 8 / own_sim.iteration_s,
                                                               own_sim.bubble_fraction, own_sim.peak_memory_bytes))
    assert known.engine == "any"
    got = as_run_prediction(known, "deepspeed")
    sim = simulate(dataclasses.replace(known, engine="deepspeed"))
    assert got.iteration_s == sim.iteration_s > known.predicted.iteration_s
    assert got.peak_memory_bytes == {d.device: d.peak_memory_bytes for d in sim.devices}
    for t in predicted_terms(known, "deepspeed"):
        assert sum(v for k, v in t.items() if k != "transfers") == pytest.approx(got.iteration_s)
    assert got.warning is not None and "searched for any engine (no --engine), not deepspeed" in got.warning
    assert "--engine deepspeed" in got.warning
    own = as_run_prediction(dataclasses.replace(known, engine="deepspeed"), "deepspeed")
    assert own == AsRun(known.predicted.iteration_s, {}, None)  # the plan's own: searched for this engine

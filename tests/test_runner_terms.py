"""runner.terms: a step's time per term, measured (profiler events by name) and predicted (the simulator)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner import ir
from planner.runner.terms import (
    MEASURED,
    STEP_RANGE,
    AsRun,
    Span,
    as_run_prediction,
    classify,
    predicted_terms,
    stage_terms,
    term_of,
    timeline_terms,
)
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


def _s(name: str, start_ms: float, end_ms: float, *children: Span, thread: int = 1) -> Span:
    return Span(name, thread, start_ms * 1e-3, end_ms * 1e-3, children)


def test_on_the_cpu_the_wait_for_gloos_work_is_in_the_term_of_that_work() -> None:
    """As profiled on 2 gloo processes: DeepSpeed's gradient all-reduce returned from ``c10d::allreduce_``
    in 0.03 ms and waited 3 ms for gloo's thread outside any event (measured allreduce 0.145 ms, other 10 ms);
    FSDP's ZeRO-3 pre-backward gather waited inside autograd's function (counted compute: 21.6 ms of a
    38.8 ms step); a receive's wait is gloo's ``gloo:recv`` on the step's thread, outside the step's events."""
    step = _s(STEP_RANGE, 0, 20,
              _s("aten::linear", 0, 1),
              _s("c10d::allreduce_", 1, 1.03),  # hands the work to gloo, then waits with no event until 4
              _s("aten::mul_", 4, 4.5),
              _s("autograd::engine::evaluate_function: AddmmBackward0", 5, 10,
                 _s("FSDP::pre_backward", 5, 9.5, _s("c10d::_allgather_base_", 5, 5.2)),  # its wait: to 9
                 _s("AddmmBackward0", 9.5, 10, _s("aten::mm", 9.5, 10))),
              _s("Optimizer.step#ZeroRedundancyOptimizer.step", 11, 13, _s("c10d::broadcast_", 11.5, 12)),
              # 13..16: a receive's wait (gloo:recv below); 16..20: nothing in flight
              )
    gloo = [_s("gloo:all_reduce", 1.01, 3.99, thread=3), _s("gloo:all_gather", 5.1, 9, thread=2),
            _s("gloo:broadcast", 11.6, 12, thread=2), _s("gloo:recv", 13, 16, thread=1)]
    got = timeline_terms(step, gloo, 0.021)
    assert got["allreduce"] == pytest.approx(0.03e-3 + 2.96e-3 + 3.8e-3 + 0.2e-3)
    assert got["transfers"] == pytest.approx(3e-3)
    assert got["optimizer"] == pytest.approx(2e-3)
    assert got["compute"] == pytest.approx(1e-3 + 0.5e-3 + 0.5e-3 + 0.5e-3)  # linear, mul_, mm, the hook's own
    assert got["other"] == pytest.approx(0.021 - sum(got[t] for t in MEASURED if t != "other"))
    assert got["other"] == pytest.approx((0.01 + 0.5 + 1 + 4 + 1) * 1e-3)  # gaps with nothing in flight; past the range


_times = st.lists(st.tuples(st.floats(0, 10), st.floats(0, 2)), max_size=6)


@given(_times, _times, st.sampled_from(["aten::add", "autograd::x", "c10d::send", "user", "Optimizer.step#S"]))
def test_the_cpu_terms_divide_the_steps_wall_time(ops: list[tuple[float, float]], flight: list[tuple[float, float]],
                                                  name: str) -> None:
    """Each instant of the step is counted in one term: with the rest in ``other`` they add up to the wall time."""
    cursor, kids = 0.0, []
    for gap, length in ops:  # disjoint children, as on one thread
        kids.append(_s(name, cursor + gap, cursor + gap + length))
        cursor += gap + length
    step = _s(STEP_RANGE, 0, cursor + 1, *kids)
    gloo = [_s("gloo:all_reduce" if i % 2 else "gloo:recv", a, a + b, thread=2) for i, (a, b) in enumerate(flight)]
    got = timeline_terms(step, gloo, (cursor + 1) * 1e-3)
    assert all(v >= 0 for v in got.values())
    assert sum(got.values()) == pytest.approx((cursor + 1) * 1e-3)

"""judge: one verdict for a plan (validate, simulate, memory, prediction), recomputation on overflow."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest

from planner import ir
from planner.costmodel import stage_costs
from planner.errors import PlanError
from planner.judge import Judged, fastest, judge, memory_text, verdict
from planner.simulate import simulate
from tests.conftest import make_cluster_dict, make_profile_dict


def _plan(memory_bytes: int = 10**10, schedule: str = "1f1b", m: int = 4, **kw: Any) -> ir.Plan:
    profile = ir.ModelProfile.from_dict(make_profile_dict(4, batch_size=8))
    cluster = ir.Cluster.from_dict(make_cluster_dict(2, 1, memory_bytes))
    stages = (ir.Stage((0, 2), ("n0.g0",), ("dp", "dp"), 0), ir.Stage((2, 4), ("n1.g0",), ("dp", "dp"), 0))
    return ir.Plan(profile, cluster, schedule, m, "adam", stages, ir.Prediction(0.0, 0.0, 0.0, 0), **kw)


def test_judged_plan_carries_its_simulation() -> None:
    plan = _plan()
    judged = judge(plan)
    sim = simulate(plan)
    assert judged.fits and judged.reason is None
    assert judged.prediction == judged.plan.predicted
    assert judged.prediction == ir.Prediction.of(sim.iteration_s, 8, sim.bubble_fraction, sim.peak_memory_bytes)
    for s in judged.plan.stages:
        assert s.memory_bytes == sim.device(s.devices[0]).peak_memory_bytes > 0
    assert judged.plan.stages[0].layers == plan.stages[0].layers


def test_judge_uses_the_callers_costs() -> None:
    plan = _plan()
    slow = tuple(dataclasses.replace(c, forward_s=10 * c.forward_s) for c in stage_costs(plan))
    assert judge(plan, costs=slow).prediction.iteration_s > judge(plan).prediction.iteration_s


def test_speedup_over_dp_from_the_plans_dp_time() -> None:
    base = judge(_plan()).prediction.iteration_s
    judged = judge(_plan(dp_iteration_s=2 * base))
    assert judged.plan.speedup_over_dp == pytest.approx(2.0)
    assert judge(_plan()).plan.speedup_over_dp is None


def test_overflow_names_the_device_and_recompute_retries() -> None:
    need = judge(_plan()).prediction.peak_memory_bytes
    tight = _plan(memory_bytes=need - 1)
    plain = judge(tight)
    assert not plain.fits and plain.reason is not None
    assert "which has" in plain.reason and "recomputation" not in plain.reason
    assert all(s.recompute == "none" for s in plain.plan.stages)
    retried = judge(tight, recompute=True)
    assert any(s.recompute == "full" for s in retried.plan.stages)
    assert retried.fits or "(with recomputation)" in (retried.reason or "")
    assert retried.prediction.peak_memory_bytes < need


def test_nothing_fits_in_a_tiny_memory() -> None:
    judged = judge(_plan(memory_bytes=1000), recompute=True)
    assert not judged.fits
    assert judged.reason is not None and judged.reason.endswith("(with recomputation)")
    assert re.search(r"needs \d+\.\d\d MiB on \S+, which has 1000 bytes", judged.reason)  # sizes in units


def test_invalid_plan_is_a_plan_error() -> None:
    with pytest.raises(PlanError, match="do not divide the batch size"):
        judge(_plan(m=3))
    with pytest.raises(PlanError, match="unknown schedule"):
        judge(_plan(schedule="nope"))


def test_verdict_is_judge_without_the_simulation() -> None:
    plan = _plan()
    assert verdict(plan, simulate(plan)) == judge(plan)


def test_fastest_prefers_fitting_then_least_memory() -> None:
    fit = judge(_plan())
    slow = dataclasses.replace(fit, prediction=dataclasses.replace(fit.prediction, iteration_s=1.0))
    over = Judged(fit.plan, dataclasses.replace(fit.prediction, iteration_s=1e-9), False, "too big")
    assert fastest([slow, over, fit]) is fit
    small = Judged(fit.plan, dataclasses.replace(fit.prediction, peak_memory_bytes=1), False, "x")
    assert fastest([over, small]) is small
    assert fastest([]) is None


def test_memory_text_keeps_its_digits_at_every_scale() -> None:
    assert memory_text(80 * 1024**3) == "80.00 GiB"
    assert memory_text(1.5 * 2**30) == "1.50 GiB"
    assert memory_text(900_000) == "878.91 KiB"
    assert memory_text(500_000_000) == "476.84 MiB"
    assert memory_text(50) == "50 bytes"

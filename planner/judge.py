"""Judging a plan: validate, simulate, memory verdict, prediction (pure: no torch, click or rich).

The one place a plan is weighed by the event simulator. ``planner compare`` judges every
strategy with it, the interleaved search its chunked plans, and the search's final re-rank
its candidates. :func:`judge`:

1. checks the plan (:func:`planner.validate.validate_plan`);
2. simulates it (:func:`planner.simulate.simulate_costs` over
   :func:`planner.costmodel.stage_costs`, or over costs the caller already has), without
   recording events;
3. gives the memory verdict: the plan fits when every device's simulated peak is within
   its own memory; with ``recompute=True`` the stages on overflowing devices get full
   re-materialisation (as the search would do) and the plan is simulated once more;
4. returns a :class:`Judged`: the plan with each stage's ``memory_bytes`` (the simulated
   peak of its devices; for interleaved chunks, of their device group, all chunks
   together), its ``predicted`` (:meth:`planner.ir.Prediction.of` of the simulation) and,
   when the plan knows its pure data-parallel time, ``speedup_over_dp``; whether it fits,
   and when it does not, why (the device, the memory it needs and the memory it has).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from planner import ir
from planner.costmodel import stage_costs
from planner.simulate import SimOptions, SimResult, plan_options, simulate_costs
from planner.validate import validate_plan

GIB = 1024**3

QUIET = SimOptions(record_events=False)
"""The judge's simulation options: the defaults (those of the analytic cost model), no event record."""


@dataclass(frozen=True)
class Judged:
    """A plan after judging: ``plan`` with stage memory and ``predicted`` filled in
    (``prediction`` is ``plan.predicted``), whether every device fits, and why not."""

    plan: ir.Plan
    prediction: ir.Prediction
    fits: bool
    reason: str | None = None


def memory_text(nbytes: float) -> str:
    """A memory for a message, in the unit that keeps its digits: ``80.00 GiB``, ``858.31 MiB``, ``4.88 KiB``."""
    for unit, size in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(nbytes) >= size:
            return f"{nbytes / size:.2f} {unit}"
    return f"{nbytes:.0f} bytes"


def overflowing(plan: ir.Plan, result: SimResult) -> list[tuple[str, int, int]]:
    """(device, simulated peak bytes, its memory) of every device over its memory, the
    furthest over (peak / memory) first."""
    capacity = {g.name: g.memory_bytes for g in plan.cluster.gpus}
    peaks = {d.device: int(d.peak_memory_bytes) for d in result.devices}
    return [(d, peaks[d], capacity[d]) for d in sorted(peaks, key=lambda x: -peaks[x] / capacity[x])
            if peaks[d] > capacity[d]]


def simulate_plan(plan: ir.Plan, costs: Sequence[ir.StageCost] | None = None,
                  options: SimOptions = QUIET) -> SimResult:
    """``plan`` checked and simulated (over ``costs`` when given, else its stage costs)."""
    validate_plan(plan)
    costs = stage_costs(plan) if costs is None else costs
    return simulate_costs(costs, plan.schedule, plan.microbatches, plan.virtual_stages, plan_options(plan, options))


def verdict(plan: ir.Plan, result: SimResult) -> Judged:
    """The Judged of ``plan`` from its simulation ``result`` (module doc, step 4)."""
    peaks = {d.device: int(d.peak_memory_bytes) for d in result.devices}
    stages = tuple(dataclasses.replace(s, memory_bytes=max(peaks.get(d, 0) for d in s.devices))
                   for s in plan.stages)
    t = result.iteration_s
    prediction = ir.Prediction.of(t, plan.batch_size, result.bubble_fraction, result.peak_memory_bytes)
    dp_s = plan.dp_iteration_s
    speedup = dp_s / t if dp_s is not None and t > 0 else plan.speedup_over_dp
    judged = dataclasses.replace(plan, stages=stages, predicted=prediction, speedup_over_dp=speedup)
    over = overflowing(plan, result)
    if not over:
        return Judged(judged, prediction, True)
    device, need, have = over[0]
    recomputes = " (with recomputation)" if any(s.recomputes for s in plan.stages) else ""
    return Judged(judged, prediction, False, f"needs {memory_text(need)} on {device}, which has {memory_text(have)}"
                  + recomputes)


def with_recompute(plan: ir.Plan, devices: set[str]) -> ir.Plan:
    """``plan`` with full recomputation on every stage that uses one of ``devices``."""
    stages = tuple(dataclasses.replace(s, recompute="full") if devices & set(s.devices) else s for s in plan.stages)
    return dataclasses.replace(plan, stages=stages)


def judge(plan: ir.Plan, *, costs: Sequence[ir.StageCost] | None = None, recompute: bool = False,
          options: SimOptions = QUIET) -> Judged:
    """``plan`` judged by the simulator (module doc); ``costs``: its stage costs if the
    caller has them; ``recompute``: retry once with recomputation on overflowing devices."""
    result = simulate_plan(plan, costs, options)
    over = overflowing(plan, result)
    if over and recompute:
        retry = with_recompute(plan, {d for d, _, _ in over})
        if retry.stages != plan.stages:
            plan, result = retry, simulate_plan(retry, None, options)
    return verdict(plan, result)


def fastest(judged: Sequence[Judged]) -> Judged | None:
    """The fastest that fits (first wins ties); if none fits, the one needing the least memory."""
    fitting = [j for j in judged if j.fits]
    if fitting:
        return min(fitting, key=lambda j: j.prediction.iteration_s)
    if not judged:
        return None
    return min(judged, key=lambda j: j.prediction.peak_memory_bytes)

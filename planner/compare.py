"""``planner compare``: every baseline and the planner's plan, judged on the same footing.

Pure (no torch, click, rich or matplotlib). Each strategy of
:mod:`planner.search.baselines` becomes one or more candidate plans on the same cluster; the
same judge (:func:`planner.judge.judge`: the cost model's stage costs played by the
simulator) weighs every one of them: iteration time and the peak memory of every device.
The planner's own plan is judged by the same simulator, not by its search's prediction.

Rules of the judge, the same for every strategy:

* A candidate fits when every device's simulated peak memory is within its capacity. A
  stage that overflows gets GPipe re-materialisation (``recompute``), as the search would
  do, and the candidate is simulated again; if it still overflows it does not fit, and
  the reason names the device, the memory it needs and the memory it has.
* Where a strategy leaves a choice to its user (the micro-batch count when ``auto``, the
  pipeline depth of DeepSpeed's grid), every choice is simulated and the fastest that
  fits is kept: each baseline is shown at its best.
* The ``planner`` row is the default ``planner search``: the search's best distinct plans
  under its analytic objective (``--rerank``, default :data:`planner.search.RERANK`) and its
  structured seeds (the equal-width pipeline x data-parallel grids of its own space, pure
  data parallel among them), re-ranked by this same simulator (planner.search.rerank). So
  it is never slower than a baseline whose plan lies in the search's space and schedule.
  When the user names no schedule (``schedule=None``, the CLI's default), the planner is
  searched for ``1f1b`` and for ``gpipe`` and the faster plan is kept, so that GPipe's
  fill-then-drain, which can win when transfers dominate, is in its space too.
  ``rerank=0`` shows the analytic optimum alone (no seeds).
* A strategy that cannot run at all (more stages than layers, no fitting choice) is a
  :class:`StrategyResult` with ``fits=False`` and a reason; it never stops the comparison.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from planner import ir
from planner.errors import PlannerError, UsageError
from planner.jsonio import SUPPORTED_VERSION
from planner.judge import Judged, fastest, judge
from planner.runnable import is_runnable, problems
from planner.search import baselines as bl

RERANK = 16
"""How many of the search's best plans the simulator re-ranks for the ``planner`` row
(the search's own default, planner.search.RERANK)."""

PLANNER_SCHEDULES = ("1f1b", "gpipe")
"""The schedules the ``planner`` row tries when the user names none; the faster is kept."""


@dataclass(frozen=True)
class StrategyResult:
    """One strategy judged: its time and memory, or why it does not fit.

    ``plan`` is the judged plan (stages with memory, prediction from the simulator); for
    a strategy that does not fit it is the closest candidate, or None when none could
    even be built.
    """

    name: str
    fits: bool
    iteration_s: float | None
    samples_per_s: float | None
    config: str | None
    schedule: str | None
    microbatches: int | None
    peak_memory_bytes: int | None
    speedup_over_dp: float | None
    reason: str | None
    plan: ir.Plan | None = dataclasses.field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "iteration_s": self.iteration_s, "samples_per_s": self.samples_per_s,
                "fits": self.fits, "config": self.config, "speedup_over_dp": self.speedup_over_dp,
                "peak_memory_bytes": self.peak_memory_bytes, "schedule": self.schedule,
                "microbatches": self.microbatches, "reason": self.reason}


@dataclass(frozen=True)
class Comparison:
    """Every strategy on one profile and cluster (the ``compare`` JSON)."""

    model: str
    batch_size: int
    cluster: str
    optimizer: str
    strategies: tuple[StrategyResult, ...]

    def get(self, name: str) -> StrategyResult:
        for s in self.strategies:
            if s.name == name:
                return s
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "comparison", "version": SUPPORTED_VERSION, "model": self.model,
                "batch_size": self.batch_size, "cluster": self.cluster, "optimizer": self.optimizer,
                "strategies": [s.to_dict() for s in self.strategies]}


# ----------------------------------------------------------------------------- the judge


def best_of(candidates: Sequence[ir.Plan]) -> Judged | None:
    """The fastest candidate that fits (each judged with recomputation on overflowing
    devices, :func:`planner.judge.judge`); if none fits, the one needing the least memory."""
    return fastest([judge(p, recompute=True) for p in candidates])


# ----------------------------------------------------------------------------- strategies


def microbatch_choices(batch_size: int, microbatches: int | str) -> tuple[int, ...]:
    """``auto``: every divisor of the batch; a number: that number (it must divide the batch)."""
    from planner.search import microbatch_candidates

    return tuple(microbatch_candidates(batch_size, microbatches))


def _layouts(name: str, profile: ir.ModelProfile, cluster: ir.Cluster, choices: tuple[int, ...],
             optimizer: str) -> list[bl.Layout] | bl.NotFitting:
    if name == "dp":
        return [bl.dp_layout(profile, cluster)]
    if name == "accpar":
        return [bl.accpar_layout(profile, cluster, optimizer)]
    if name.startswith("deepspeed-"):
        return bl.deepspeed_layouts(profile, cluster, name.split("-", 1)[1], choices)
    builders: dict[str, Callable[..., bl.Layout | bl.NotFitting]] = {
        "gpipe-uniform": bl.gpipe_uniform_layout, "torchgpipe": bl.torchgpipe_layout,
        "pipedream": bl.pipedream_layout,
    }
    one = builders[name](profile, cluster, choices)
    return one if isinstance(one, bl.NotFitting) else [one]


def _result(name: str, judged: Judged | None, reason: str | None = None) -> StrategyResult:
    if judged is None:
        return StrategyResult(name, False, None, None, None, None, None, None, None, reason)
    p = judged.plan
    return StrategyResult(
        name=name, fits=judged.fits, iteration_s=p.predicted.iteration_s if judged.fits else None,
        samples_per_s=p.predicted.samples_per_s if judged.fits else None, config=p.config,
        schedule=p.schedule, microbatches=p.microbatches, peak_memory_bytes=p.predicted.peak_memory_bytes,
        speedup_over_dp=None, reason=judged.reason, plan=p,
    )


def _planner(profile: ir.ModelProfile, cluster: ir.Cluster, *, microbatches: int | str, schedule: str | None,
             optimizer: str, rerank: int) -> StrategyResult:
    """The ``planner`` row: the default search (its best plans and seeds re-ranked by the
    simulator), for ``schedule``, or for each of :data:`PLANNER_SCHEDULES`, the faster kept."""
    from planner.search import search

    best: StrategyResult | None = None
    failure: PlannerError | None = None
    for sched in (schedule,) if schedule is not None else PLANNER_SCHEDULES:
        try:
            plan = search(profile, cluster, microbatches=microbatches, schedule=sched, optimizer=optimizer,
                          candidates=rerank)
        except PlannerError as exc:
            failure = failure or exc
            continue
        row = _result("planner", judge(plan, recompute=True))
        if best is None or _faster(row, best):
            best = row
    if best is None:
        assert failure is not None
        raise failure
    return best


def _faster(a: StrategyResult, b: StrategyResult) -> bool:
    if a.fits != b.fits:
        return a.fits
    return a.iteration_s is not None and b.iteration_s is not None and a.iteration_s < b.iteration_s


def run_strategy(name: str, profile: ir.ModelProfile, cluster: ir.Cluster, *, microbatches: int | str,
                 schedule: str | None, optimizer: str, rerank: int = RERANK) -> StrategyResult:
    """Build and judge one strategy; a strategy that cannot run comes back with its reason.

    ``planner`` is ``planner search --rerank N`` (see the module doc; 0: the analytic
    optimum alone); ``schedule`` is the planner's (None: the faster of 1f1b and gpipe).
    """
    choices = microbatch_choices(profile.batch_size, microbatches)
    try:
        if name == "planner":
            return _planner(profile, cluster, microbatches=microbatches, schedule=schedule, optimizer=optimizer,
                            rerank=rerank)
        layouts = _layouts(name, profile, cluster, choices, optimizer)
        if isinstance(layouts, bl.NotFitting):
            return _result(name, None, layouts.reason)
        candidates = [layout.plan(profile, cluster, m, optimizer) for layout in layouts
                      for m in layout.microbatches]
        runnable = [p for p in candidates if is_runnable(p)]
        if candidates and not runnable:
            return _result(name, None, f"cannot run: {problems(candidates[0])[0]}")
        return _result(name, best_of(runnable))
    except PlannerError as exc:  # infeasible, or a layout the engine cannot run: listed, never fatal
        return _result(name, None, exc.cause)


def compare(profile: ir.ModelProfile, cluster: ir.Cluster, *, microbatches: int | str = "auto",
            schedule: str | None = None, optimizer: str = "sgd",
            strategies: Sequence[str] = bl.STRATEGIES, rerank: int = RERANK) -> Comparison:
    """Run every strategy on ``profile`` and ``cluster``; speedups are over ``dp`` when it fits."""
    unknown = [s for s in strategies if s not in bl.STRATEGIES]
    if unknown:
        raise UsageError(f"unknown strategy {unknown[0]!r}", f"choose from {', '.join(bl.STRATEGIES)}")
    microbatch_choices(profile.batch_size, microbatches)  # a bad value is a usage error, not a row
    names = list(dict.fromkeys(["dp", *strategies]))  # dp is always judged: it is the yardstick
    results = {n: run_strategy(n, profile, cluster, microbatches=microbatches, schedule=schedule,
                               optimizer=optimizer, rerank=rerank) for n in names}
    base = results["dp"].iteration_s

    def speedup(r: StrategyResult) -> float | None:
        return base / r.iteration_s if base and r.iteration_s else None

    rows = tuple(dataclasses.replace(r, speedup_over_dp=speedup(r))
                 for n, r in ((n, results[n]) for n in bl.STRATEGIES if n in results))
    return Comparison(profile.model, profile.batch_size, cluster.name, optimizer, rows)

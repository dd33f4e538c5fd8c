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
* Where a system documents several settings (PipeDream with and without its activation
  term, ``--straight_pipeline`` and ``--use_fewer_machines``, DeepSpeed's ``partition_method``,
  torchgpipe's balance by time or by size, Megatron-LM's tensor degrees, the schedules a
  system runs: :func:`planner.search.settings.strategy_settings`), each
  setting is judged alike and the best one is the strategy's row, named in ``setting``; the
  row is never slower than any of its settings, and ``settings`` lists each one's verdict.
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
from planner.runnable import engines_running, is_runnable, problems
from planner.search import baselines as bl
from planner.search.options import check_hooks
from planner.search.rerank import fits_under
from planner.search.settings import Setting, strategy_settings

RERANK = 16
"""How many of the search's best plans the simulator re-ranks for the ``planner`` row
(the search's own default, planner.search.RERANK)."""

PLANNER_SCHEDULES = ("1f1b", "gpipe")
"""The schedules the ``planner`` row tries when the user names none; the faster is kept."""


@dataclass(frozen=True)
class SettingResult:
    """One setting of a strategy judged: its best layout and micro-batch count, or why none fits."""

    setting: str
    schedule: str | None
    fits: bool
    iteration_s: float | None
    config: str | None
    microbatches: int | None
    reason: str | None
    virtual_stages: int | None = None
    """Model chunks per device group (an interleaved plan's v; 1 otherwise, None where nothing was judged)."""
    flags: str = ""
    """The system's own options for the layout judged best beyond the setting's (Megatron-LM's uneven first and last
    pipeline stages; :attr:`planner.search.layout.Layout.flags`), '' where none."""

    def to_dict(self) -> dict[str, Any]:
        return {"setting": self.setting, "flags": self.flags, "schedule": self.schedule, "fits": self.fits,
                "iteration_s": self.iteration_s, "config": self.config, "microbatches": self.microbatches,
                "virtual_stages": self.virtual_stages, "reason": self.reason}


@dataclass(frozen=True)
class StrategyResult:
    """One strategy judged at its best setting: its time and memory, or why it does not fit.

    ``plan`` is the judged plan (stages with memory, prediction from the simulator); for
    a strategy that does not fit it is the closest candidate, or None when none could
    even be built. ``setting`` names the setting of the row, ``flags`` the options its layout adds
    (:class:`SettingResult`), ``settings`` every setting judged.
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
    setting: str | None = None
    settings: tuple[SettingResult, ...] = ()
    flags: str = ""

    @property
    def virtual_stages(self) -> int | None:
        """Model chunks per device group of the row's plan (an interleaved plan's v), None without a plan."""
        return None if self.plan is None else self.plan.virtual_stages

    @property
    def engines(self) -> list[str] | None:
        """The engines that run the row's plan (planner.runnable) and in whose own memory it fits
        (planner.search.rerank.fits_under: every row is judged for no engine, and an engine's buffers and copies can
        overflow a plan that fits so), None without a plan: PipePar's stages of different widths, say, none."""
        if self.plan is None:
            return None
        plan = self.plan
        return [e for e in engines_running(plan) if plan.engine == e or fits_under(plan, e)]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "iteration_s": self.iteration_s, "samples_per_s": self.samples_per_s,
                "fits": self.fits, "config": self.config, "speedup_over_dp": self.speedup_over_dp,
                "peak_memory_bytes": self.peak_memory_bytes, "schedule": self.schedule,
                "microbatches": self.microbatches, "virtual_stages": self.virtual_stages, "reason": self.reason,
                "setting": self.setting, "flags": self.flags, "settings": [x.to_dict() for x in self.settings],
                "engines": self.engines}

    def as_setting(self) -> SettingResult:
        """This result as one setting of its strategy."""
        return SettingResult(self.setting or "", self.schedule, self.fits, self.iteration_s, self.config,
                             self.microbatches, self.reason, self.virtual_stages, self.flags)


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
    devices, :func:`planner.judge.judge`); if none fits, the one needing the least memory.

    Candidates are judged in the order of their lower bound (:func:`planner.search.rerank.lower_bound_s`), and
    once one fits, those whose bound exceeds the fastest fitting time are not simulated: the simulator cannot play
    them faster, so the answer (first wins ties, in the candidates' order) is the one judging them all gives."""
    from planner.costmodel import stage_costs
    from planner.search.rerank import lower_bound_s
    from planner.validate import validate_plan

    if not candidates:
        return None
    costs = []
    for plan in candidates:
        validate_plan(plan)
        costs.append(stage_costs(plan))
    floors = [lower_bound_s(p, c) for p, c in zip(candidates, costs, strict=True)]
    judged: dict[int, Judged] = {}
    best: float | None = None
    for i in sorted(range(len(candidates)), key=lambda x: floors[x]):
        if best is not None and floors[i] > best:
            break
        judged[i] = judge(candidates[i], costs=costs[i], recompute=True)
        if judged[i].fits and (best is None or judged[i].prediction.iteration_s < best):
            best = judged[i].prediction.iteration_s
    return fastest([judged[i] for i in sorted(judged)])


# ----------------------------------------------------------------------------- strategies


def microbatch_choices(batch_size: int, microbatches: int | str) -> tuple[int, ...]:
    """``auto``: every divisor of the batch; a number: that number (it must divide the batch)."""
    from planner.search import microbatch_candidates

    return tuple(microbatch_candidates(batch_size, microbatches))


def _result(name: str, judged: Judged | None, reason: str | None = None, setting: str | None = None
            ) -> StrategyResult:
    if judged is None:
        return StrategyResult(name, False, None, None, None, None, None, None, None, reason, setting=setting)
    p = judged.plan
    return StrategyResult(
        name=name, fits=judged.fits, iteration_s=p.predicted.iteration_s if judged.fits else None,
        samples_per_s=p.predicted.samples_per_s if judged.fits else None, config=p.config,
        schedule=p.schedule, microbatches=p.microbatches, peak_memory_bytes=p.predicted.peak_memory_bytes,
        speedup_over_dp=None, reason=judged.reason, plan=p, setting=setting,
    )


def _better(a: StrategyResult, b: StrategyResult) -> bool:
    """Whether ``a`` beats ``b``: it fits and ``b`` does not, or both fit and ``a`` is faster, or
    neither fits and ``a`` needs less memory."""
    if a.fits != b.fits:
        return a.fits
    if a.fits:
        return a.iteration_s is not None and b.iteration_s is not None and a.iteration_s < b.iteration_s
    return a.peak_memory_bytes is not None and (b.peak_memory_bytes is None
                                                or a.peak_memory_bytes < b.peak_memory_bytes)


def best_setting(rows: Sequence[StrategyResult]) -> StrategyResult:
    """The best of one strategy's settings (:func:`_better`; the first wins ties), with every
    setting's verdict in ``settings``."""
    best = rows[0]
    for row in rows[1:]:
        if _better(row, best):
            best = row
    return dataclasses.replace(best, settings=tuple(r.as_setting() for r in rows))


def _judge_setting(name: str, setting: Setting, profile: ir.ModelProfile, cluster: ir.Cluster,
                   optimizer: str) -> StrategyResult:
    """One setting judged: every runnable layout x micro-batch count, the fastest that fits kept."""
    if setting.reason is not None:
        return _result(name, None, setting.reason, setting.label)
    try:
        candidates = [layout.plan(profile, cluster, m, optimizer) for layout in setting.layouts
                      for m in layout.microbatches]
        runnable = [p for p in candidates if is_runnable(p)]
        if candidates and not runnable:
            return _result(name, None, f"cannot run: {problems(candidates[0])[0]}", setting.label)
        judged = best_of(runnable)
        return dataclasses.replace(_result(name, judged, None, setting.label), flags=_flags(setting, judged))
    except PlannerError as exc:  # infeasible, or a layout the engine cannot run: listed, never fatal
        return _result(name, None, exc.cause, setting.label)


def _flags(setting: Setting, judged: Judged | None) -> str:
    """The options of the setting's layout judged best, where it has its own (Megatron-LM's uneven first and last
    stages), else ''."""
    if judged is None:
        return ""
    cut = [(s.layers, s.devices) for s in judged.plan.stages]
    return next((lay.flags for lay in setting.layouts if [(layers, devices) for layers, devices, _ in lay.stages]
                 == cut), "")


def _planner(profile: ir.ModelProfile, cluster: ir.Cluster, *, microbatches: int | str, schedule: str | None,
             optimizer: str, rerank: int) -> StrategyResult:
    """The ``planner`` row: the default search (its best plans and seeds re-ranked by the
    simulator), for ``schedule``, or for each of :data:`PLANNER_SCHEDULES`, the faster kept."""
    from planner.search import search

    rows: list[StrategyResult] = []
    failure: PlannerError | None = None
    for sched in (schedule,) if schedule is not None else PLANNER_SCHEDULES:
        try:
            plan = search(profile, cluster, microbatches=microbatches, schedule=sched, optimizer=optimizer,
                          candidates=rerank)
        except PlannerError as exc:
            failure = failure or exc
            continue
        rows.append(_result("planner", judge(plan, recompute=True), None,
                            f"search --schedule {sched} --rerank {rerank}"))
    if not rows:
        assert failure is not None
        raise failure
    return best_setting(rows)


def run_strategy(name: str, profile: ir.ModelProfile, cluster: ir.Cluster, *, microbatches: int | str,
                 schedule: str | None, optimizer: str, rerank: int = RERANK) -> StrategyResult:
    """Build and judge one strategy at its best setting; one that cannot run comes back with its reason.

    ``planner`` is ``planner search --rerank N`` (see the module doc; 0: the analytic
    optimum alone); ``schedule`` is the planner's (None: the faster of 1f1b and gpipe).
    """
    choices = microbatch_choices(profile.batch_size, microbatches)
    try:
        if name == "planner":
            return _planner(profile, cluster, microbatches=microbatches, schedule=schedule, optimizer=optimizer,
                            rerank=rerank)
        settings = strategy_settings(name, profile, cluster, choices, optimizer)
    except PlannerError as exc:  # no plan at all (the search found none that fits): a row, never fatal
        return _result(name, None, exc.cause)
    return best_setting([_judge_setting(name, s, profile, cluster, optimizer) for s in settings])


def _check_options(schedule: object, optimizer: object, strategies: object, progress: object) -> None:
    """UsageError for a library caller's option of the wrong kind (the CLI's choices check them there)."""
    from planner.costmodel.precision import check_optimizer
    from planner.schedule import SCHEDULES

    check_optimizer(optimizer)  # type: ignore[arg-type]
    if schedule is not None and schedule not in SCHEDULES:
        raise UsageError(f"unknown schedule {schedule!r:.40}", f"use one of {', '.join(SCHEDULES)}, or None")
    if isinstance(strategies, str) or not isinstance(strategies, Sequence):
        raise UsageError(f"strategies must be a list of names, got {strategies!r:.40}",
                         f"e.g. strategies=[{', '.join(map(repr, bl.STRATEGIES[:2]))}]")


def compare(profile: ir.ModelProfile, cluster: ir.Cluster, *, microbatches: int | str = "auto",
            schedule: str | None = None, optimizer: str = "sgd",
            strategies: Sequence[str] = bl.STRATEGIES, rerank: int = RERANK,
            progress: Callable[[str], None] | None = None) -> Comparison:
    """Run every strategy on ``profile`` and ``cluster``; speedups are over ``dp`` when it fits.

    ``progress``: called with ``"i/n name"`` before each strategy is judged."""
    _check_options(schedule, optimizer, strategies, progress)
    check_hooks(rerank, progress, None)
    unknown = [s for s in strategies if s not in bl.STRATEGIES]
    if unknown:
        raise UsageError(f"unknown strategy {unknown[0]!r}", f"choose from {', '.join(bl.STRATEGIES)}")
    microbatch_choices(profile.batch_size, microbatches)  # a bad value is a usage error, not a row
    names = list(dict.fromkeys(["dp", *strategies]))  # dp is always judged: it is the yardstick
    results = {}
    for i, n in enumerate(names):
        if progress is not None:
            progress(f"{i + 1}/{len(names)} {n}")
        results[n] = run_strategy(n, profile, cluster, microbatches=microbatches, schedule=schedule,
                                  optimizer=optimizer, rerank=rerank)
    base = results["dp"].iteration_s

    def speedup(r: StrategyResult) -> float | None:
        return base / r.iteration_s if base and r.iteration_s else None

    rows = tuple(dataclasses.replace(r, speedup_over_dp=speedup(r))
                 for n, r in ((n, results[n]) for n in bl.STRATEGIES if n in results))
    return Comparison(profile.model, profile.batch_size, cluster.name, optimizer, rows)

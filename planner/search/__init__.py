"""planner search: the fastest plan that fits, by HPP (forms) inside SP (stages on tp x dp grids).

:func:`search` is the entry point (pure: no torch, click or rich). The options are checked
and turned into problems by :mod:`planner.search.options`; the space (groups, tensor
degrees, forms, recomputation, ZeRO) by :mod:`planner.search.space` and
:mod:`planner.search.tables`; the stage DP and its objective in :mod:`planner.search.sp`;
HPP in :mod:`planner.search.hpp`; the exhaustive oracle in :mod:`planner.search.brute`; a solution
as a plan (forms, memory, prediction) in :mod:`planner.search.solutions`.
Every plan it returns passes :func:`planner.runnable.check_runnable` for its engine.

Two layers (planner.search.rerank):

1. The solver (``dp`` or ``brute``, the same space) minimises the analytic objective
   (planner.costmodel.analytic_iteration) exactly, per micro-batch count; dp == brute is a
   property of this layer (``candidates=0`` returns its optimum with its analytic
   prediction, for exactness studies).
2. By default the event simulator (planner.simulate) judges the :data:`RERANK` best
   distinct plans the solver met (``--rerank N``; best by their analytic prediction over
   every stage cost, tied weights' all-reduce between stages included, which the DP's
   objective leaves out: planner.search.solutions.distinct) and the structured seeds, and the
   fastest wins; ``predicted``, ``dp_iteration_s`` and ``speedup_over_dp`` are then the
   simulator's. The analytic objective is 30-100% optimistic on slow links (1f1b holds
   only K - s micro-batches in flight on stage s, so a slow boundary is not hidden;
   stage 0's all-reduce follows the iteration's last backward), so its ranking alone
   can miss the simulator's best plan. The seeds, for every micro-batch count: the
   equal-width pipeline x data-parallel grids (K stages of GPUs/K consecutive GPUs, every
   K dividing the GPU count; DeepSpeed's space) with DeepSpeed's uniform and
   parameter-balanced splits and torchgpipe's time-balanced split, ``dp`` forms; K = 1
   is pure data parallel, also seeded under HPP's forms (AccPar's layout); and PipeDream's
   partitions as ``planner compare`` runs them (small inputs). A seed is
   kept only when its groups are ones the solver may form (and its widths obey
   ``--config``/``--engine``) and it fits in memory (recomputation where a stage
   overflows, as the solver does). So the planner is never slower, under the simulator,
   than a baseline whose plan lies in its space and schedule (tests/test_compare.py).

The problems (one per micro-batch count, or per engine grid) are framed first, with a lower
bound on their objective (planner.search.framed). Those whose bound is below the best
unconstrained plan's objective met are tabulated and solved best unconstrained plan first
(planner.search.descent.open_problem); the others after, best bound first. A problem whose bound,
or a branch of its branch and bound, cannot beat the larger of the best analytic objective met
and the best simulated time of the problems' optima so far is closed (not tabulated at all): the
optimum is unchanged, and plans that may still win the simulator's re-rank are met (the analytic
objective is optimistic). Seeds come from the problems tabulated.

An engine whose launcher starts as many processes on every server (torchrun, DeepSpeed's hostfile), on a
cluster of uneven servers and without ``--config``, is searched on each even sub-cluster
(planner.search.servers) and the fastest plan kept; its cluster is that sub-cluster.

Schedules: ``gpipe`` and ``1f1b`` are planned with their own objective and in-flight
memory; ``zb-h1`` is planned like 1f1b in time (its smaller bubble is left to the
simulator) with each stage held to the most micro-batches in flight it could have
(min(K, M) for every K it could be part of); ``pipedream`` with the asynchronous steady state and weight
stashes; ``interleaved`` is planned here with one model chunk per device (v = 1, which is
1f1b's timeline with interleaved's in-flight memory); with v > 1 chunks per device group,
:mod:`planner.search.interleave` re-cuts these K-stage plans into K*v chunks and judges them
by the simulator. The simulator is the final judge.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any

from planner import ir
from planner.cluster import uneven_servers
from planner.costmodel import dp_iteration
from planner.errors import InfeasibleError, PlannerError
from planner.judge import Judged
from planner.runnable import ENGINES as ENGINE_LIMITS
from planner.runnable import is_runnable
from planner.search import rerank, seeds
from planner.search.collect import collect, collect_exact, refused_met
from planner.search.counts import counts_for_config, microbatch_candidates
from planner.search.hpp import hpp
from planner.search.options import (
    ENGINES,
    SOLVERS,
    check_hooks,
    check_request,
    parse_config,
    resolve_virtual_stages,
)
from planner.search.servers import even_layouts, even_subclusters, uneven
from planner.search.solutions import analytic_optimum, distinct, first_fitting, solution_plan
from planner.search.sp import Problem, build_problem

__all__ = ["ENGINES", "RERANK", "SOLVERS", "build_problem", "hpp", "microbatch_candidates", "parse_config", "search",
           "solution_plan"]

RERANK = 16
"""How many of the DP's best distinct plans the simulator re-ranks by default (``--rerank``)."""


def search(profile: ir.ModelProfile, cluster: ir.Cluster, *, microbatches: int | str = "auto",
           schedule: str = "1f1b", optimizer: str = "sgd", solver: str = "dp", engine: str = "any",
           config: str | Sequence[int] | None = None, max_blocks: int | None = None,
           progress: Callable[[str], None] | None = None,
           evaluate: Callable[[ir.Plan], float] | None = None, candidates: int = RERANK,
           precision: str | None = None, tp: int | None = None, zero: int | str = "auto",
           recompute: str = "auto", micro_batch_size: int | None = None, virtual_stages: int | None = None,
           alternatives: list[Judged] | None = None, sequence_parallel: bool = True) -> ir.Plan:
    """The fastest plan that fits (see the module doc); InfeasibleError when none does.

    By default the ``candidates`` best distinct plans of the analytic objective (the optimum
    of every micro-batch count and the plans the branch and bound visited, or brute's best)
    and the grid seeds are simulated, and the fastest wins; its ``predicted``,
    ``dp_iteration_s`` and ``speedup_over_dp`` come from the simulator. ``evaluate`` replaces
    the simulator as the ranking (the prediction is still simulated). ``candidates=0``: the
    exact optimum of the analytic objective, with its analytic prediction, and no seeds.
    ``config``: devices per stage, ``(2, 1, 1)`` or PipeDream's ``"2-1-1"``. ``precision``, ``tp``, ``zero``,
    ``recompute``, ``micro_batch_size``, ``sequence_parallel`` (False: tensor-parallel stages keep their norms and
    residual adds whole on every rank): the grid space (planner.search.options); ``virtual_stages`` > 1
    re-cuts plans into chunks (planner.search.interleave). ``alternatives`` receives the simulated
    candidates, fastest first.
    """
    check_hooks(candidates, progress, alternatives, evaluate)
    req = check_request(profile, cluster, schedule=schedule, optimizer=optimizer, solver=solver, engine=engine,
                        config=config, precision=precision, tp=tp, zero=zero, recompute=recompute,
                        micro_batch_size=micro_batch_size, max_blocks=max_blocks, sequence_parallel=sequence_parallel)
    config = req.config  # "2-1-1" or (2, 1, 1), checked
    # the request again, for searches of the parts of the cluster its engine's launcher can start
    options = dict(microbatches=microbatches, schedule=schedule, optimizer=optimizer, solver=solver, engine=engine,
                   max_blocks=max_blocks, progress=progress, evaluate=evaluate, candidates=candidates,
                   precision=precision, tp=tp, zero=zero, recompute=recompute, micro_batch_size=micro_batch_size,
                   virtual_stages=virtual_stages, alternatives=alternatives, sequence_parallel=sequence_parallel)
    if engine in ENGINE_LIMITS and uneven(cluster) and config is None:
        return _on_even_servers(profile, cluster, options)
    v = resolve_virtual_stages(virtual_stages, schedule)
    if v > 1:
        from planner.search.interleave import search_interleaved

        return search_interleaved(profile, cluster, v, microbatches=microbatches, optimizer=optimizer, solver=solver,
                                  engine=engine, config=config, candidates=max(candidates, 1), progress=progress,
                                  precision=precision, tp=tp, zero=zero, recompute=recompute,
                                  micro_batch_size=micro_batch_size, sequence_parallel=sequence_parallel)
    every = microbatch_candidates(profile.batch_size, "auto", micro_batch_size)
    cands = counts_for_config(microbatch_candidates(profile.batch_size, microbatches, micro_batch_size), schedule,
                              engine, config, every)
    found, probs = collect(profile, cluster, req, cands, progress)
    refused = refused_met(found[:max(candidates, 1)], engine, solver) if config is None else None
    if refused is not None:  # a ranked plan the engine refuses: again on exact stage counts (planner.search.counts)
        found, probs = collect_exact(profile, cluster, req, cands, progress, refused, every)
    if candidates <= 0:
        return analytic_optimum(found, engine, solver)
    costed = distinct(found, candidates, engine, solver) + _seeds(probs, engine, solver)
    if _all_uneven(costed, engine) and config is None and not _IN_LAYOUT.get():
        return _on_even_layouts(profile, cluster, options)
    plans = _runnable(costed, engine)
    if not plans:  # every candidate over memory by a cost the DP leaves out (planner.search.solutions), no seed
        plans = [first_fitting(found, engine, solver, "use GPUs with more memory, more devices or more "
                               "micro-batches, or a lighter --optimizer")[2]]
    if evaluate is None:
        best = rerank.best_simulated(plans, alternatives)
    else:
        best = rerank.simulated(*min(plans, key=lambda pc: evaluate(pc[0])))
    return _with_prediction(best.plan, best.prediction)


def _fastest_on(profile: ir.ModelProfile, subs: Sequence[ir.Cluster], options: dict[str, Any]
                ) -> tuple[ir.Plan | None, list[tuple[PlannerError, ir.Cluster]]]:
    """The fastest plan of ``profile`` over the sub-clusters ``subs``, each searched with ``options`` (None when
    none has one), and each failure with its sub-cluster."""
    plans, failures = [], []
    for sub in subs:
        try:
            plans.append(search(profile, sub, **options))
        except PlannerError as exc:
            failures.append((exc, sub))
    return min(plans, key=lambda p: p.predicted.iteration_s, default=None), failures


def _on_even_servers(profile: ir.ModelProfile, cluster: ir.Cluster, options: dict[str, Any]) -> ir.Plan:
    """The fastest plan over the even sub-clusters of ``cluster`` (planner.search.servers), each searched
    with ``options``; when none has a plan, the error of the one needing the least memory (else the first's).
    The plan's cluster is its sub-cluster: the servers and GPUs the engine's launcher starts it on."""
    best, failures = _fastest_on(profile, even_subclusters(cluster), options)
    if best is not None:
        return best
    wheres = [f"{len(sub.gpus)} GPUs ({len(sub.nodes)} x {len(sub.nodes[0].gpus)})" for _, sub in failures]
    failure, where = min(zip((f for f, _ in failures), wheres, strict=True),
                         key=lambda f: getattr(f[0], "needed_bytes", None) or math.inf)
    cause = (f"on {where}: {failure.cause}; --engine {options['engine']} starts as many processes on every "
             f"server, so the uneven servers were searched as {' and '.join(wheres)}")
    if isinstance(failure, InfeasibleError):
        raise InfeasibleError(cause, failure.hint, failure.needed_bytes) from None
    raise type(failure)(cause, failure.hint) from None


_IN_LAYOUT: ContextVar[bool] = ContextVar("_IN_LAYOUT", default=False)
"""Set while :func:`_on_even_layouts` searches a layout, which does not fall back again."""


def _all_uneven(costed: list[rerank.Costed], engine: str) -> bool:
    """Whether ``engine``'s launcher runs none of the candidates: each places different numbers of processes on
    its servers (planner.cluster.uneven_servers)."""
    return engine in ENGINE_LIMITS and bool(costed) and all(uneven_servers(p) is not None for p, _ in costed)


def _on_even_layouts(profile: ir.ModelProfile, cluster: ir.Cluster, options: dict[str, Any]) -> ir.Plan:
    """The fastest plan among the even layouts of the most GPUs that have one (planner.search.servers.even_layouts):
    where every best plan of the whole cluster placed its processes unevenly. The plan's cluster is its layout."""
    token = _IN_LAYOUT.set(True)
    try:
        for group in even_layouts(cluster):
            best, _ = _fastest_on(profile, group, options)
            if best is not None:
                return best
    finally:
        _IN_LAYOUT.reset(token)
    raise InfeasibleError(f"every plan found places different numbers of processes on the servers of "
                          f"{cluster.name!r}, which --engine {options['engine']}'s launcher cannot start, and no "
                          "even layout of fewer GPUs has a plan", "search with --config, more memory or another "
                          "--engine")


def _seeds(probs: list[Problem], engine: str, solver: str) -> list[rerank.Costed]:
    """The structured seed plans of every problem (planner.search.seeds.seed_plans), splits shared."""
    cache = seeds.SeedCache()
    out: list[rerank.Costed] = []
    for prob in probs:
        out += seeds.seed_plans(prob, engine=engine, solver=solver, cache=cache)
    return out


def _runnable(plans: list[rerank.Costed], engine: str) -> list[rerank.Costed]:
    """The plans ``engine`` runs; an InfeasibleError saying why when it runs none of them."""
    kept = [pc for pc in plans if is_runnable(pc[0], engine)]
    if plans and not kept:
        from planner.runnable import problems as limits_broken

        raise InfeasibleError(f"the {len(plans)} best plans found break a limit of --engine {engine}, the best: "
                              f"{limits_broken(plans[0][0], engine)[0]}",
                              "search another --config, cluster or micro-batch count, or another --engine")
    return kept


def _with_prediction(plan: ir.Plan, predicted: ir.Prediction) -> ir.Plan:
    """``plan`` with a simulated prediction, and the simulated data-parallel time beside it."""
    _, _, dp_fits = dp_iteration(plan.profile, plan.cluster, plan.optimizer, plan.precision, plan.engine)
    dp_fits = dp_fits and plan.batch_size % len(plan.cluster.gpus) == 0  # pure data parallel runs
    dp_s = (rerank.dp_simulated_s(plan.profile, plan.cluster, plan.optimizer, plan.precision, plan.engine)
            if dp_fits else None)
    speedup = dp_s / predicted.iteration_s if dp_s is not None and predicted.iteration_s > 0 else None
    return dataclasses.replace(plan, predicted=predicted, dp_iteration_s=dp_s, speedup_over_dp=speedup)

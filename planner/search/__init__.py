"""planner search: the fastest plan that fits, by HPP (forms) inside SP (stages).

:func:`search` is the entry point (pure: no torch, click or rich). The space and the
objective are described in :mod:`planner.search.sp`; HPP in :mod:`planner.search.hpp`;
the exhaustive oracle in :mod:`planner.search.brute`.

Two layers (planner.search.rerank):

1. The solver (``dp`` or ``brute``, the same space) minimises the analytic objective
   (planner.costmodel.analytic_iteration) exactly, per micro-batch count; dp == brute is a
   property of this layer (``candidates=0`` returns its optimum with its analytic
   prediction, for exactness studies).
2. By default the event simulator (planner.simulate) judges the :data:`RERANK` best
   distinct plans the solver met (``--rerank N``) and the structured seeds, and the
   fastest wins; ``predicted``, ``dp_iteration_s`` and ``speedup_over_dp`` are then the
   simulator's. The analytic objective is 30-100% optimistic on slow links (1f1b holds
   only K - s micro-batches in flight on stage s, so a slow boundary is not hidden;
   stage 0's all-reduce follows the iteration's last backward), so its ranking alone
   can miss the simulator's best plan. The seeds, for every micro-batch count: the
   equal-width pipeline x data-parallel grids (K stages of GPUs/K consecutive GPUs, every
   K dividing the GPU count; DeepSpeed's space) with DeepSpeed's uniform and
   parameter-balanced splits and torchgpipe's time-balanced split, ``dp`` forms; K = 1
   is pure data parallel, also seeded under HPP's forms (AccPar's layout). A seed is
   kept only when its groups are ones the solver may form (and its widths obey
   ``--config``/``--engine``) and it fits in memory (recomputation where a stage
   overflows, as the solver does). So the planner is never slower, under the simulator,
   than a baseline whose plan lies in its space and schedule (tests/test_compare.py).

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
from collections.abc import Callable, Sequence

from planner import ir
from planner.cluster import group_of
from planner.costmodel import OPTIMIZER_BYTES_PER_PARAM, LayerTable, layer_table, predict
from planner.costmodel import dp_iteration as _dp_iteration
from planner.errors import UsageError
from planner.schedule import SCHEDULES
from planner.search import rerank
from planner.search.hpp import hpp
from planner.search.sp import Problem, Solution, build_problem, infeasible, solve

SOLVERS = ("dp", "brute")
ENGINES = ("any", "deepspeed", "torch")

__all__ = ["ENGINES", "RERANK", "SOLVERS", "build_problem", "hpp", "microbatch_candidates", "parse_config", "search",
           "solution_plan"]


def parse_config(text: str) -> tuple[int, ...]:
    """PipeDream notation ``2-1-1`` -> (2, 1, 1); UsageError names the value."""
    try:
        widths = tuple(int(x) for x in text.split("-"))
    except ValueError:
        raise UsageError(f"--config {text!r} is not in PipeDream notation", "write devices per stage, e.g. 2-1-1") \
            from None
    if not widths or any(w <= 0 for w in widths):
        raise UsageError(f"--config {text!r} has a stage with no devices", "every stage needs at least one device")
    return widths


def microbatch_candidates(batch_size: int, microbatches: int | str) -> list[int]:
    """``auto``: every divisor of the batch; else the number, which must divide the batch."""
    if microbatches == "auto":
        return [m for m in range(1, batch_size + 1) if batch_size % m == 0]
    if not isinstance(microbatches, int) or isinstance(microbatches, bool) or microbatches <= 0:
        raise UsageError(f"--microbatches must be a positive integer or 'auto', got {microbatches!r}",
                         "e.g. --microbatches 4")
    if batch_size % microbatches:
        raise UsageError(f"--microbatches {microbatches} does not divide the batch size {batch_size}",
                         f"use a divisor of {batch_size}, or 'auto'")
    return [microbatches]


def _check(profile: ir.ModelProfile, cluster: ir.Cluster, schedule: str, optimizer: str, solver: str, engine: str,
           config: Sequence[int] | None) -> None:
    if schedule not in SCHEDULES:
        raise UsageError(f"unknown schedule {schedule!r}", f"use one of {', '.join(SCHEDULES)}")
    if optimizer not in OPTIMIZER_BYTES_PER_PARAM:
        raise UsageError(f"unknown optimizer {optimizer!r}", f"use one of {', '.join(OPTIMIZER_BYTES_PER_PARAM)}")
    if solver not in SOLVERS:
        raise UsageError(f"unknown solver {solver!r}", f"use one of {', '.join(SOLVERS)}")
    if engine not in ENGINES:
        raise UsageError(f"unknown engine {engine!r}", f"use one of {', '.join(ENGINES)}")
    if config is not None:
        n_gpu, n_layers = len(cluster.gpus), len(profile.layers)
        if sum(config) > n_gpu:
            raise UsageError(f"--config {'-'.join(map(str, config))} needs {sum(config)} devices, the cluster "
                             f"{cluster.name!r} has {n_gpu}", "use fewer devices per stage")
        if len(config) > n_layers:
            raise UsageError(f"--config {'-'.join(map(str, config))} has {len(config)} stages, the model has only "
                             f"{n_layers} layers", "use at most one stage per layer")
        if engine != "any" and len(set(config)) > 1:
            raise UsageError(f"--engine {engine} runs stages of one width, --config {'-'.join(map(str, config))} "
                             "mixes widths", "give every stage the same width")


def _engine_widths(cluster: ir.Cluster) -> list[int]:
    sizes = {len(n.gpus) for n in cluster.nodes}
    total = len(cluster.gpus)
    g = min(sizes)
    return [w for w in range(1, total + 1) if w <= max(sizes) or (len(sizes) == 1 and w % g == 0)]


def _problems(profile: ir.ModelProfile, cluster: ir.Cluster, m: int, schedule: str, optimizer: str, engine: str,
              config: Sequence[int] | None, max_blocks: int | None) -> list[Problem]:
    forms = ("dp",) if engine == "deepspeed" else ir.FORMS
    if config is not None:
        return [build_problem(profile, cluster, microbatches=m, schedule=schedule, optimizer=optimizer, forms=forms,
                              config=config, max_blocks=max_blocks)]
    if engine == "any":
        return [build_problem(profile, cluster, microbatches=m, schedule=schedule, optimizer=optimizer,
                              max_blocks=max_blocks)]
    return [build_problem(profile, cluster, microbatches=m, schedule=schedule, optimizer=optimizer, forms=forms,
                          mode="contiguous", widths=[w], max_blocks=max_blocks) for w in _engine_widths(cluster)]


RERANK = 16
"""How many of the DP's best distinct plans the simulator re-ranks by default (``--rerank``)."""


def search(profile: ir.ModelProfile, cluster: ir.Cluster, *, microbatches: int | str = "auto",
           schedule: str = "1f1b", optimizer: str = "sgd", solver: str = "dp", engine: str = "any",
           config: Sequence[int] | None = None, max_blocks: int | None = None,
           progress: Callable[[str], None] | None = None,
           evaluate: Callable[[ir.Plan], float] | None = None, candidates: int = RERANK) -> ir.Plan:
    """The fastest plan that fits (see the module doc); InfeasibleError when none does.

    By default the ``candidates`` best distinct plans of the analytic objective (the optimum
    of every micro-batch count and the plans the branch and bound visited, or brute's best)
    and the grid seeds are simulated, and the fastest wins; its ``predicted``,
    ``dp_iteration_s`` and ``speedup_over_dp`` come from the simulator. ``evaluate`` replaces
    the simulator as the ranking (the prediction is still simulated). ``candidates=0``: the
    exact optimum of the analytic objective, with its analytic prediction, and no seeds.
    """
    _check(profile, cluster, schedule, optimizer, solver, engine, config)
    found, problems = _collect(profile, cluster, schedule, optimizer, solver, engine, config, max_blocks,
                               microbatch_candidates(profile.batch_size, microbatches), progress)
    if candidates <= 0:
        _, _, prob, sol = found[0]
        return solution_plan(prob, sol, engine=engine, solver=solver)
    plans = _distinct(found, candidates, engine, solver)
    split_cache: dict[int, list[list[int]]] = {}
    for prob in problems:
        plans += rerank.seed_plans(prob, engine=engine, solver=solver, split_cache=split_cache)
    if evaluate is None:
        best = rerank.best_simulated(plans)
    else:
        best = rerank.simulated(*min(plans, key=lambda pc: evaluate(pc[0])))
    return _with_prediction(best.plan, best.predicted)


def _collect(profile: ir.ModelProfile, cluster: ir.Cluster, schedule: str, optimizer: str, solver: str,
             engine: str, config: Sequence[int] | None, max_blocks: int | None, cands: list[int],
             progress: Callable[[str], None] | None) -> tuple[list[tuple[float, int, Problem, Solution]],
                                                              list[Problem]]:
    """Every problem (one per micro-batch count, or per engine width) and the solutions met,
    best objective first; InfeasibleError when no plan fits at all."""
    found: list[tuple[float, int, Problem, Solution]] = []
    problems: list[Problem] = []
    for m in cands:
        for prob in _problems(profile, cluster, m, schedule, optimizer, engine, config, max_blocks):
            problems.append(prob)
            pool: list[Solution] = []
            sol = _solve(prob, solver, pool)
            if progress:
                progress(f"M={m}: " + ("no plan fits" if sol is None else f"{sol.objective:.6g} s"))
            for x in ([sol] if sol is not None else []) + pool:
                found.append((x.objective, len(found), prob, x))
    if not found:
        raise infeasible(problems[-1])
    found.sort(key=lambda t: (t[0], t[1]))
    return found, problems


def _distinct(found: list[tuple[float, int, Problem, Solution]], n: int, engine: str, solver: str
              ) -> list[rerank.Costed]:
    """The ``n`` best distinct plans among the solutions met (as plans with memory, and costs)."""
    seen: set[tuple] = set()
    plans: list[rerank.Costed] = []
    tables: dict[tuple[int, int], LayerTable] = {}
    for _, _, prob, sol in found:
        key = (prob.microbatches, tuple((s.a, s.b, s.move.devices, s.recompute) for s in sol.stages))
        if key in seen:
            continue
        seen.add(key)
        plans.append(_memory_plan(prob, sol, engine=engine, solver=solver, tables=tables))
        if len(plans) >= n:
            break
    return plans


def _with_prediction(plan: ir.Plan, predicted: ir.Prediction) -> ir.Plan:
    """``plan`` with a simulated prediction, and the simulated data-parallel time beside it."""
    _, _, dp_fits = _dp_iteration(plan.profile, plan.cluster, plan.optimizer)
    dp_s = rerank.dp_simulated_s(plan.profile, plan.cluster, plan.optimizer) if dp_fits else None
    speedup = dp_s / predicted.iteration_s if dp_s is not None and predicted.iteration_s > 0 else None
    return dataclasses.replace(plan, predicted=predicted, dp_iteration_s=dp_s, speedup_over_dp=speedup)


def _solve(prob: Problem, solver: str, pool: list[Solution] | None = None) -> Solution | None:
    """Solve with the chosen solver (the DP, or brute force over the same space)."""
    from planner.search.brute import brute

    return brute(prob, pool) if solver == "brute" else solve(prob, pool=pool)


def _memory_plan(prob: Problem, sol: Solution, *, engine: str, solver: str,
                 tables: dict[tuple[int, int], LayerTable] | None = None) -> rerank.Costed:
    """A DP solution as a plan: HPP forms per stage, memory filled in; and its stage costs.

    ``tables`` caches layer tables by (problem, group shape) across calls of one search.
    """
    from planner.costmodel import plan_memory, stage_costs

    profile, cluster = prob.profile, prob.cluster
    cache = {} if tables is None else tables
    stages = []
    for ch in sol.stages:
        first, end = int(prob.bounds[ch.a]), int(prob.bounds[ch.b])
        key = (id(prob), ch.move.key)
        if key not in cache:
            group = group_of(cluster, ch.move.devices)
            cache[key] = layer_table(profile, group, prob.microbatches, prob.optimizer, prob.forms)
        table = cache[key]
        forms, _ = hpp(table, first, end, prob.microbatches)
        stages.append(ir.Stage((first, end), ch.move.devices, forms, 0, "full" if ch.recompute else "none"))
    draft = ir.Plan(profile, cluster, prob.schedule, prob.microbatches, prob.optimizer, tuple(stages),
                    ir.Prediction(0.0, 0.0, 0.0, 0), engine=engine, solver=solver)
    costs = stage_costs(draft)
    mem = plan_memory(draft, costs)
    stages = [ir.Stage(s.layers, s.devices, s.forms, m, s.recompute) for s, m in zip(stages, mem, strict=True)]
    return dataclasses.replace(draft, stages=tuple(stages)), costs


def solution_plan(prob: Problem, sol: Solution, *, engine: str = "any", solver: str = "dp") -> ir.Plan:
    """Turn a DP solution into an ``ir.Plan`` with forms, memory, analytic prediction and dp speed-up."""
    draft, _ = _memory_plan(prob, sol, engine=engine, solver=solver)
    pred = predict(draft)
    dp_t, _, dp_fits = _dp_iteration(prob.profile, prob.cluster, prob.optimizer)
    dp_s = dp_t if dp_fits else None
    speedup = dp_t / pred.iteration_s if dp_fits and pred.iteration_s > 0 else None
    return dataclasses.replace(draft, predicted=pred, dp_iteration_s=dp_s, speedup_over_dp=speedup)

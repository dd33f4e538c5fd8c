"""A solution of the stage DP as a plan: its stages' forms (HPP), memory and prediction.

Owns turning what :mod:`planner.search.sp` solved into ``ir.Plan`` values: :func:`solution_stages` (each
stage's HPP forms on its grid), :func:`memory_plan` (every stage's analytic peak memory), :func:`solution_plan`
(with the analytic prediction and the data-parallel speed-up), :func:`distinct` (the re-rank's candidates) and
:func:`analytic_optimum` (``--rerank 0``). Costs the DP's objective leaves out, which depend on a stage's layers
together (a tie's gradient made twice on one stage at M = 1, planner.costmodel.stage.with_tie_accumulation; torch's
ZeRO-1 dealing whole tensors, planner.costmodel.whole_tensors), can put a solution over memory: such plans take
leaner recomputation or are left out, never returned. Pure: no torch, click or rich.
"""

from __future__ import annotations

import dataclasses

from planner import ir
from planner.costmodel import (
    Grid,
    LayerTable,
    analytic_iteration,
    dp_iteration,
    layer_table,
    plan_memory,
    predict,
    stage_costs,
)
from planner.errors import InfeasibleError
from planner.judge import memory_text
from planner.runnable import problems as limits_broken
from planner.search import rerank
from planner.search.hpp import hpp
from planner.search.sp import Problem, Solution

Found = list[tuple[float, int, Problem, Solution]]
"""Solutions met: (objective, order met, problem, solution), best first."""


def distinct(found: Found, n: int, engine: str, solver: str) -> list[rerank.Costed]:
    """The ``n`` best distinct plans among the solutions met (as plans with memory, and costs), ranked by their
    analytic prediction over every stage cost (:func:`planner.costmodel.analytic_iteration`); one over memory by a
    cost the DP leaves out takes leaner recomputation where that fits it (planner.search.rerank.with_memory), or
    is left out.

    Ranked by the whole plan's costs, not the DP's objective, because that objective leaves out what couples
    stages: a tied weight's gradient all-reduce between the stages holding its layers (GPT-2's embedding and head,
    planner.costmodel.stage.with_ties). Every pipeline splitting the tie looks that all-reduce cheaper to the DP,
    so on a slow link the 16 best by its objective were all such pipelines (GPT-2 small, Adam, 4 A100s + 4 V100s
    at 4.6/1.3 GB/s: 43 ms by the objective, 120 ms simulated), and the plan the simulator picks (one tensor
    group of the 4 A100s, 60.7 ms both ways) came 17th."""
    seen: set[tuple] = set()
    ranked: list[tuple[float, int, rerank.Costed]] = []
    tables: dict[tuple[int, int, bool], LayerTable] = {}
    for order, (_, _, prob, sol) in enumerate(found):
        key = (prob.microbatches, tuple((s.a, s.b, s.move.devices, s.move.tp, s.option) for s in sol.stages))
        if key in seen:
            continue
        seen.add(key)
        plan, costs = memory_plan(prob, sol, engine=engine, solver=solver, tables=tables)
        costed = rerank.with_memory(plan, prob.space.recompute) if rerank.overflowing_stages(plan) else (plan, costs)
        if costed is None:
            continue
        ranked.append((analytic_iteration(costed[1], plan.schedule, plan.microbatches)[0], order, costed))
    ranked.sort(key=lambda r: (r[0], r[1]))
    return [costed for _, _, costed in ranked[:n]]


def analytic_optimum(found: Found, engine: str, solver: str) -> ir.Plan:
    """The best solution met whose plan fits and ``engine`` runs, with its analytic prediction: the DP's optimum
    unless a cost its objective leaves out (module doc) puts a stage over its devices' memory."""
    prob, sol, _ = first_fitting(found, engine, solver, "search with --rerank 1 or more (leaner recomputation is "
                                 "then tried), more devices or more micro-batches")
    return solution_plan(prob, sol, engine=engine, solver=solver)


def first_fitting(found: Found, engine: str, solver: str, hint: str) -> tuple[Problem, Solution, rerank.Costed]:
    """The best solution met whose plan fits once every stage's memory is counted and ``engine`` runs, as a plan
    with memory and its costs; an InfeasibleError naming what the best one breaks (and ``hint``) when none does."""
    whys, peaks = [], []
    for _, _, prob, sol in found:
        costed = memory_plan(prob, sol, engine=engine, solver=solver)
        plan = costed[0]
        caps, broken = rerank.stage_capacities(plan), limits_broken(plan, engine)
        whys.append([f"stage {i} needs {memory_text(plan.stages[i].memory_bytes)} of {memory_text(caps[i])}"
                     for i in rerank.overflowing_stages(plan)] + broken)
        if not whys[-1]:
            return prob, sol, costed
        if not broken:
            peaks.append(max(s.memory_bytes for s in plan.stages))
    best = f" (the best: {'; '.join(whys[0])})" if whys else ""
    least = f"; the least any of them needs is {memory_text(min(peaks))} per device" if peaks else ""
    raise InfeasibleError(f"none of the {len(found)} plans the solver met fits once every stage's memory is counted "
                          f"and --engine {engine} runs it{best}{least}", hint, min(peaks) if peaks else None)


def solution_stages(prob: Problem, sol: Solution,
                    tables: dict[tuple[int, int, bool], LayerTable] | None = None) -> list[ir.Stage]:
    """A DP solution's stages: HPP forms (fastest or leanest) on each stage's grid, its variant."""
    cache = {} if tables is None else tables
    stages = []
    for ch in sol.stages:
        first, end = int(prob.bounds[ch.a]), int(prob.bounds[ch.b])
        grid: Grid = prob.grids[ch.move.key]
        key = (id(prob), ch.move.key, ch.option.lean)
        if key not in cache:
            cache[key] = layer_table(prob.profile, grid, prob.microbatches, prob.optimizer, prob.forms,
                                     prob.space.rules)
        forms, _ = hpp(cache[key], first, end, prob.microbatches, lean=ch.option.lean)
        v = ch.option.variant
        sequence = grid.sequence_parallel and prob.space.rules.shards_sequence(forms, ch.move.tp)
        stages.append(ir.Stage((first, end), ch.move.devices, forms, 0, v.recompute, ch.move.tp, v.zero, sequence))
    return stages


def memory_plan(prob: Problem, sol: Solution, *, engine: str, solver: str,
                 tables: dict[tuple[int, int, bool], LayerTable] | None = None) -> rerank.Costed:
    """A DP solution as a plan with each stage's memory filled in; and its stage costs."""
    stages = solution_stages(prob, sol, tables)
    draft = ir.Plan(prob.profile, prob.cluster, prob.schedule, prob.microbatches, prob.optimizer, tuple(stages),
                    ir.Prediction(0.0, 0.0, 0.0, 0), engine=engine, solver=solver, precision=prob.space.precision)
    costs = stage_costs(draft)
    mem = plan_memory(draft, costs)
    stages = [dataclasses.replace(s, memory_bytes=m) for s, m in zip(stages, mem, strict=True)]
    return dataclasses.replace(draft, stages=tuple(stages)), costs


def solution_plan(prob: Problem, sol: Solution, *, engine: str = "any", solver: str = "dp") -> ir.Plan:
    """Turn a DP solution into an ``ir.Plan`` with forms, memory, analytic prediction and dp speed-up."""
    draft, _ = memory_plan(prob, sol, engine=engine, solver=solver)
    pred = predict(draft)
    dp_t, _, dp_fits = dp_iteration(prob.profile, prob.cluster, prob.optimizer, prob.space.precision, engine)
    dp_s = dp_t if dp_fits else None
    speedup = dp_t / pred.iteration_s if dp_fits and pred.iteration_s > 0 else None
    return dataclasses.replace(draft, predicted=pred, dp_iteration_s=dp_s, speedup_over_dp=speedup)

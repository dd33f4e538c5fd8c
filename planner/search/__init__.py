"""planner search: the fastest plan that fits, by HPP (forms) inside SP (stages).

:func:`search` is the entry point (pure: no torch, click or rich). The space and the
objective are described in :mod:`planner.search.sp`; HPP in :mod:`planner.search.hpp`;
the exhaustive oracle in :mod:`planner.search.brute`.

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

from collections.abc import Callable, Sequence

from planner import ir
from planner.cluster import group_of
from planner.costmodel import OPTIMIZER_BYTES_PER_PARAM, layer_table, predict
from planner.costmodel import dp_iteration as _dp_iteration
from planner.errors import UsageError
from planner.schedule import SCHEDULES
from planner.search.hpp import hpp
from planner.search.sp import Problem, Solution, build_problem, infeasible, solve

SOLVERS = ("dp", "brute")
ENGINES = ("any", "deepspeed", "torch")

__all__ = ["ENGINES", "SOLVERS", "build_problem", "hpp", "microbatch_candidates", "parse_config", "search",
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


def search(profile: ir.ModelProfile, cluster: ir.Cluster, *, microbatches: int | str = "auto",
           schedule: str = "1f1b", optimizer: str = "sgd", solver: str = "dp", engine: str = "any",
           config: Sequence[int] | None = None, max_blocks: int | None = None,
           progress: Callable[[str], None] | None = None,
           evaluate: Callable[[ir.Plan], float] | None = None, candidates: int = 8) -> ir.Plan:
    """The fastest plan that fits (see the module doc); InfeasibleError when none does.

    Without ``evaluate`` the plan is the exact optimum of the analytic objective. With it
    (e.g. ``lambda p: simulate(p).iteration_s``), the ``candidates`` best distinct plans
    the search met (the optimum of every micro-batch count, and the plans the branch and
    bound visited) are judged by ``evaluate`` and the lowest wins.
    """
    _check(profile, cluster, schedule, optimizer, solver, engine, config)
    cands = microbatch_candidates(profile.batch_size, microbatches)
    found: list[tuple[float, int, Problem, Solution]] = []
    last_problem: Problem | None = None
    for m in cands:
        for prob in _problems(profile, cluster, m, schedule, optimizer, engine, config, max_blocks):
            last_problem = prob
            pool: list[Solution] = []
            sol = _solve(prob, solver, pool)
            if progress:
                progress(f"M={m}: " + ("no plan fits" if sol is None else f"{sol.objective:.6g} s"))
            for x in ([sol] if sol is not None else []) + pool:
                found.append((x.objective, len(found), prob, x))
    if not found:
        assert last_problem is not None
        raise infeasible(last_problem)
    found.sort(key=lambda t: (t[0], t[1]))
    if evaluate is None:
        _, _, prob, sol = found[0]
        return solution_plan(prob, sol, engine=engine, solver=solver)
    seen: set[tuple] = set()
    best: tuple[float, ir.Plan] | None = None
    for _, _, prob, sol in found:
        key = (prob.microbatches, tuple((s.a, s.b, s.move.devices, s.recompute) for s in sol.stages))
        if key in seen:
            continue
        seen.add(key)
        plan = solution_plan(prob, sol, engine=engine, solver=solver)
        score = evaluate(plan)
        if best is None or score < best[0]:
            best = (score, plan)
        if len(seen) >= candidates:
            break
    assert best is not None
    return best[1]


def _solve(prob: Problem, solver: str, pool: list[Solution] | None = None) -> Solution | None:
    """Solve with the chosen solver (the DP, or brute force over the same space)."""
    from planner.search.brute import brute

    return brute(prob) if solver == "brute" else solve(prob, pool=pool)


def solution_plan(prob: Problem, sol: Solution, *, engine: str = "any", solver: str = "dp") -> ir.Plan:
    """Turn a DP solution into an ``ir.Plan`` with forms, memory, prediction and dp speed-up."""
    profile, cluster = prob.profile, prob.cluster
    stages = []
    for ch in sol.stages:
        first, end = int(prob.bounds[ch.a]), int(prob.bounds[ch.b])
        group = group_of(cluster, ch.move.devices)
        table = layer_table(profile, group, prob.microbatches, prob.optimizer, prob.forms)
        forms, _ = hpp(table, first, end, prob.microbatches)
        stages.append(ir.Stage((first, end), ch.move.devices, forms, 0, ch.recompute))
    draft = ir.Plan(profile, cluster, prob.schedule, prob.microbatches, prob.optimizer, tuple(stages),
                    ir.Prediction(0.0, 0.0, 0.0, 0), engine=engine, solver=solver)
    from planner.costmodel import plan_memory, stage_costs

    mem = plan_memory(draft, stage_costs(draft))
    stages = [ir.Stage(s.layers, s.devices, s.forms, m, s.recompute) for s, m in zip(stages, mem, strict=True)]
    draft = ir.Plan(profile, cluster, prob.schedule, prob.microbatches, prob.optimizer, tuple(stages),
                    ir.Prediction(0.0, 0.0, 0.0, 0), engine=engine, solver=solver)
    pred = predict(draft)
    dp_t, _, dp_fits = _dp_iteration(profile, cluster, prob.optimizer)
    dp_s = dp_t if dp_fits else None
    speedup = dp_t / pred.iteration_s if dp_fits and pred.iteration_s > 0 else None
    return ir.Plan(profile, cluster, prob.schedule, prob.microbatches, prob.optimizer, tuple(stages), pred,
                   dp_iteration_s=dp_s, speedup_over_dp=speedup, engine=engine, solver=solver)


def objective_of_plan(plan: ir.Plan) -> float:
    """The analytic iteration time the search minimises, for any plan (planner.costmodel)."""
    return predict(plan).iteration_s

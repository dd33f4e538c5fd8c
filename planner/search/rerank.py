"""The search's final judge: re-ranking candidate plans with the event simulator.

Owns what :func:`planner.search.search` does after the dynamic programs: the structured
seed plans (equal-width pipeline x data-parallel grids with balanced layer splits, pure
data parallel, one stage on every GPU under HPP's forms, and PipeDream's partitions and Megatron-LM's layouts as
``planner compare`` runs them), the memory check that admits a seed, and the simulated
prediction of the plan it returns. Pure: no torch, click or rich.

Why: the analytic objective (planner.costmodel.analytic_iteration) is 30-100% optimistic
against the simulator on slow links (1f1b keeps only K - s micro-batches in flight on
stage s; stage 0's all-reduce follows the last backward). The DP finds its exact optimum
quickly; the simulator, which judges every strategy in ``planner compare``, picks the
winner among the DP's best distinct plans and the seeds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from planner import ir
from planner.cluster import group_of, index
from planner.costmodel import plan_memory, stage_costs
from planner.judge import Judged, judge
from planner.runnable import is_runnable
from planner.schedule import schedule_kind
from planner.search import baselines as bl
from planner.search.sp import Problem
from planner.simulate import plan_options
from planner.simulate.cores import CoreShare


def plan_key(plan: ir.Plan) -> tuple:
    """What makes two plans the same plan (for de-duplication)."""
    return (plan.schedule, plan.microbatches,
            tuple((s.layers, s.devices, s.forms, s.recompute, s.tp, s.zero) for s in plan.stages))


Costed = tuple[ir.Plan, tuple[ir.StageCost, ...]]
"""A candidate plan (stages with memory) and its stage costs, computed once."""

PARAMETER_SPLIT_WORK = 5e7
"""Largest (layers + 1)^2 x K for which the ``parameters`` seed split (DeepSpeed's O(n^2 K)
``partition_balanced``) is computed; beyond it that seed is left out (1000 layers: K <= 50)."""


def simulated(plan: ir.Plan, costs: Sequence[ir.StageCost] | None = None) -> Judged:
    """``plan`` judged by the one judge (planner.judge: validated, simulated, memory verdict), keeping
    the candidate's own stages (their analytic memory, which the search's memory test used)."""
    return dataclasses.replace(judge(plan, costs=costs), plan=plan)


LIGHTER = ("none", "selective", "full")
"""Recomputation modes from the fastest to the leanest."""


def with_memory(plan: ir.Plan, recompute: Sequence[str] = LIGHTER) -> Costed | None:
    """``plan`` with each stage's analytic peak memory filled in; a stage that overflows its
    smallest device takes the next leaner recomputation mode of ``recompute`` (as the DP may);
    None when it still does not fit."""
    modes = [m for m in LIGHTER if m in recompute]
    if len(modes) > 1 and any(_overflows(dataclasses.replace(plan, stages=tuple(
            dataclasses.replace(s, recompute=modes[-1]) for s in plan.stages)))[0]):
        return None  # a stage overflows even at the leanest mode (a stage's memory is its own mode's)
    for _ in range(len(modes)):
        over, costs, mem = _overflows(plan)
        stages = tuple(dataclasses.replace(s, memory_bytes=m) for s, m in zip(plan.stages, mem, strict=True))
        plan = dataclasses.replace(plan, stages=stages)
        if not any(over):
            return plan, costs
        if any(o and _leaner(s.recompute, modes) is None for s, o in zip(plan.stages, over, strict=True)):
            return None
        plan = dataclasses.replace(plan, stages=tuple(
            dataclasses.replace(s, recompute=_leaner(s.recompute, modes) or s.recompute) if o else s
            for s, o in zip(plan.stages, over, strict=True)))
    return None


def stage_capacities(plan: ir.Plan) -> list[int]:
    """Each stage's memory: its smallest device's."""
    caps = {g.name: g.memory_bytes for g in plan.cluster.gpus}
    return [min(caps[d] for d in s.devices) for s in plan.stages]


def overflowing_stages(plan: ir.Plan) -> list[int]:
    """The stages whose filled-in ``memory_bytes`` exceed their smallest device's memory."""
    return [i for i, (s, cap) in enumerate(zip(plan.stages, stage_capacities(plan), strict=True))
            if s.memory_bytes > cap]


def _overflows(plan: ir.Plan) -> tuple[list[bool], tuple[ir.StageCost, ...], list[int]]:
    """Which stages overflow their smallest device, and the stage costs and memory."""
    costs = stage_costs(plan)
    mem = plan_memory(plan, costs)
    return [m > cap for m, cap in zip(mem, stage_capacities(plan), strict=True)], costs, mem


def _leaner(mode: str, modes: Sequence[str]) -> str | None:
    later = [m for m in modes if LIGHTER.index(m) > LIGHTER.index(mode)]
    return later[0] if later else None


def _bounds(balance: Sequence[int]) -> list[int]:
    parts = [0]
    for count in balance:
        parts.append(parts[-1] + count)
    return parts


def splits(profile: ir.ModelProfile, k: int) -> list[list[int]]:
    """Layer boundaries (k + 1 of them) of every seed split into k non-empty stages:
    DeepSpeed's ``partition_uniform`` (layer counts), torchgpipe's ``balance_by_time``
    (forward + backward times) and, below :data:`PARAMETER_SPLIT_WORK`, DeepSpeed's ``partition_balanced``
    on parameters and on each layer type (``type:<T>``, as compare's ``deepspeed`` row tries);
    duplicates once."""
    n = len(profile.layers)
    found = [bl.deepspeed_parts(profile, k, "uniform"), _bounds(bl.balance_by_time(profile, k))]
    if (n + 1) ** 2 * k <= PARAMETER_SPLIT_WORK:
        found += [bl.deepspeed_parts(profile, k, m) for m in bl.deepspeed_methods(profile) if m != "uniform"]
    out: list[list[int]] = []
    for parts in found:
        if len(parts) == k + 1 and all(parts[s] < parts[s + 1] for s in range(k)) and parts not in out:
            out.append(list(parts))
    return out


def _groups_in_space(prob: Problem, groups: Sequence[tuple[str, ...]]) -> bool:
    """Whether each group is a stage the search may form where it starts (planner.search.sp)."""
    at = index(prob.cluster).position
    return all(any(mv.devices == grp for mv in prob.moves[at[grp[0]]]) for grp in groups)


def _admitted(prob: Problem, groups: Sequence[tuple[str, ...]]) -> bool:
    """Whether a data-parallel seed on ``groups`` lies in ``prob``'s space: each group a stage the search
    may form, and each of its ranks (tp 1: one per GPU) given whole micro-batches."""
    return _groups_in_space(prob, groups) and not any(
        prob.profile.batch_size % (prob.microbatches * len(g)) for g in groups)


def _width_allowed(prob: Problem, width: int, k: int) -> bool:
    return prob.config is None or tuple(prob.config) == (width,) * k


@dataclass
class SeedCache:
    """What the seeds of a search's problems share: the splits per stage count, PipeDream's stages per
    activation setting and shape flags (both independent of the micro-batch count; empty where it has none)."""

    splits: dict[int, list[list[int]]] = field(default_factory=dict)
    pipedream: dict[tuple[float | None, bl.PipeDreamFlags],
                    tuple[tuple[tuple[int, int], tuple[str, ...], tuple[str, ...]], ...]] = field(default_factory=dict)


def server_prefixes(cluster: ir.Cluster) -> list[int]:
    """How many GPUs the grid seeds span: every GPU, and the first 1, 2, 4, ... servers' (fewer GPUs over a slow
    network between servers can be faster: the analytic objective, exact for one stage but optimistic about
    pipelines across servers, may rank such a plan below pipelines that the simulator then finds slower)."""
    sizes = [len(node.gpus) for node in cluster.nodes]
    servers = [2**i for i in range(max(len(sizes) - 1, 0).bit_length()) if 2**i < len(sizes)]
    return [*(sum(sizes[:s]) for s in servers), sum(sizes)]


def seed_plans(prob: Problem, *, engine: str, solver: str, cache: SeedCache | None = None) -> list[Costed]:
    """Grid seeds of ``prob``'s space: K stages x (GPUs / K) consecutive GPUs, every K that divides the GPU count,
    each seed split, ``dp`` forms; K = 1 is pure data parallel, and also the one stage under HPP's forms (AccPar's
    layout), which also runs on the first 1, 2, 4, ... servers alone (:func:`server_prefixes`). Only plans whose
    groups the search may form, with the problem's widths, and that fit."""
    if prob.space.tp not in (None, 1):
        return []  # the seeds are data-parallel grids: not in a space of one fixed tensor degree
    cache = SeedCache() if cache is None else cache
    names = [g.name for g in prob.cluster.gpus]
    plans: list[Costed] = []
    for total in server_prefixes(prob.cluster):
        plans += _grid_seeds(prob, names[:total], engine, solver, cache, every_k=total == len(names))
    return (plans + pipedream_seeds(prob, engine=engine, solver=solver, cache=cache)
            + megatron_seeds(prob, engine=engine, solver=solver))


def _grid_seeds(prob: Problem, names: Sequence[str], engine: str, solver: str, cache: SeedCache,
                every_k: bool = True) -> list[Costed]:
    """:func:`seed_plans`'s grids on the GPUs ``names`` (``every_k`` False: the one stage only)."""
    total, n = len(names), len(prob.profile.layers)
    if prob.stages_exact is not None and prob.config is None:
        ks = [prob.stages_exact] if total % prob.stages_exact == 0 else []
    else:
        ks = [k for k in bl.divisors(total) if k <= min(n, prob.stages_max or n)]
    ks = ks if every_k else [k for k in ks if k == 1]
    plans: list[Costed] = []
    for k in ks:
        width = total // k
        groups = [tuple(names[s * width:(s + 1) * width]) for s in range(k)]
        if not _width_allowed(prob, width, k) or not _admitted(prob, groups):
            continue
        if k not in cache.splits:
            cache.splits[k] = splits(prob.profile, k)
        for parts in cache.splits[k]:
            forms = [("dp",) * (parts[s + 1] - parts[s]) for s in range(k)]
            plans += _fitting(prob, groups, parts, forms, engine, solver)
        if k == 1:
            plans += _fitting(prob, groups, [0, n], [_hpp_forms(prob, groups[0])], engine, solver)
    return plans


PIPEDREAM_SEED_WORK = 4e7
"""Largest layers^3 x units^2 (units: the larger of GPUs per server and servers; every GPU when
servers differ in size) for which PipeDream's partitioner is run for seeds, in each of its eight settings
(on numpy arrays: 82 layers on 8 x 8 GPUs, 3.5e7, 0.03-0.11 s a setting here; 2e6 when it ran in pure Python,
which left ResNet-152 on 4 x 2 GPUs, 2.2e6, unseeded, and PipeDream's 1-1 faster than the planner's plan)."""


def _pipedream_work(prob: Problem) -> int:
    sizes = {len(node.gpus) for node in prob.cluster.nodes}
    units = max(sizes.pop(), len(prob.cluster.nodes)) if len(sizes) == 1 else len(prob.cluster.gpus)
    return len(prob.profile.layers) ** 3 * units ** 2


def pipedream_seeds(prob: Problem, *, engine: str, solver: str, cache: SeedCache | None = None) -> list[Costed]:
    """PipeDream's partitions, in each of ``planner compare``'s settings (activation modes x shape flags), as
    plans of ``prob`` (its micro-batch count and schedule) where their groups are stages the search may form,
    every data-parallel rank gets whole micro-batches, and they fit: the simulator then judges them with
    the DP's plans, so a baseline plan in the search's space never beats the search's pick."""
    if prob.config is not None or _pipedream_work(prob) > PIPEDREAM_SEED_WORK:
        return []
    cache = SeedCache() if cache is None else cache
    plans: list[Costed] = []
    for key in ((ratio, flags) for _, ratio in bl.PIPEDREAM_MODES for flags in bl.PIPEDREAM_FLAGS):
        if key not in cache.pipedream:
            found = bl.pipedream_layout(prob.profile, prob.cluster, (prob.microbatches,), *key)
            cache.pipedream[key] = () if isinstance(found, bl.NotFitting) else found.stages
        stages = cache.pipedream[key]
        groups = [devices for _, devices, _ in stages]
        if not stages or not _admitted(prob, groups):
            continue
        parts = [first for (first, _), _, _ in stages] + [stages[-1][0][1]]
        plans += _fitting(prob, groups, parts, [forms for _, _, forms in stages], engine, solver)
    return plans


def megatron_seeds(prob: Problem, *, engine: str, solver: str) -> list[Costed]:
    """Megatron-LM's layouts as ``planner compare``'s ``megatron`` row builds them (tensor groups of a server,
    each pipeline depth's default cut, its forms; planner.search.megatron.megatron_layouts: the row's uneven cuts
    differ from these only in where stages cut, which the stage DP chooses), without and, where the space allows,
    with selective recomputation and sequence parallelism, as plans of ``prob`` (its micro-batch count and
    schedule) where their grids are ones the search may form, they run on ``engine`` and they fit: HPP may price
    Megatron's forms above data-parallel ones that the simulator finds slower, so without them a Megatron plan
    in the search's space could beat the search's pick. Every tensor degree the row tries
    (planner.search.megatron.megatron_tps) that the space admits."""
    if prob.config is not None or not prob.profile.has_blocks:
        return []
    found: list[bl.Layout] = []
    for tp in bl.megatron_tps(prob.profile, prob.cluster):
        layouts = bl.megatron_layouts(prob.profile, prob.cluster, (prob.microbatches,), tp=tp, uneven=False) \
            if prob.space.tp in (None, tp) else None
        found += layouts if isinstance(layouts, list) else []
    lean = [("selective", True)] if prob.space.sequence_parallel and "selective" in prob.space.recompute else []
    plans: list[Costed] = []
    for layout in found:
        forms = {f for _, _, fs in layout.stages for f in fs}
        if prob.space.tp not in (None, layout.tp) or forms - set(prob.space.forms) or not _grids_in_space(
                prob, [devices for _, devices, _ in layout.stages], layout.tp):
            continue
        for mode, sp in [(next(m for m in LIGHTER if m in prob.space.recompute), False), *lean]:
            stages = tuple(ir.Stage(layers, devices, fs, 0, mode, layout.tp, _seed_zero(prob, devices, layout.tp),
                                    sequence_parallel=sp and layout.tp > 1 and prob.profile.splits_sequence(layout.tp))
                           for layers, devices, fs in layout.stages)
            draft = ir.Plan(prob.profile, prob.cluster, prob.schedule, prob.microbatches, prob.optimizer, stages,
                            ir.Prediction(0.0, 0.0, 0.0, 0), engine=engine, solver=solver,
                            precision=prob.space.precision)
            fitted = with_memory(draft, prob.space.recompute) if is_runnable(draft) else None
            plans += [] if fitted is None else [fitted]
    return plans


def _grids_in_space(prob: Problem, groups: Sequence[tuple[str, ...]], tp: int) -> bool:
    """Whether each group is a ``tp`` grid the search may form where it starts, each data-parallel rank given
    whole micro-batches."""
    at = index(prob.cluster).position
    return all(any(mv.devices == grp and mv.tp == tp for mv in prob.moves[at[grp[0]]]) for grp in groups) and not any(
        prob.profile.batch_size % (prob.microbatches * (len(g) // tp)) for g in groups)


def _hpp_forms(prob: Problem, devices: tuple[str, ...]) -> tuple[str, ...]:
    """HPP's forms for the whole model as one stage on ``devices`` as a single tensor group (AccPar's
    layout); all ``dp`` when the search may not form such a group."""
    from planner.costmodel import Grid, layer_table
    from planner.search.hpp import hpp

    group = group_of(prob.cluster, devices, prob.space.precision)
    if group.nodes > 1 or not any(mv.devices == devices and mv.tp == len(devices) for mv in prob.moves[0]):
        return ("dp",) * len(prob.profile.layers)
    sequence = prob.space.sequence_parallel and prob.profile.splits_sequence(group.n)
    table = layer_table(prob.profile, Grid(group, group.n, prob.space.precision, sequence),
                        prob.microbatches, prob.optimizer, prob.forms, prob.space.rules)
    return tuple(hpp(table, 0, len(prob.profile.layers), prob.microbatches)[0])


def _fitting(prob: Problem, groups: Sequence[tuple[str, ...]], parts: Sequence[int],
             forms: Sequence[tuple[str, ...]], engine: str, solver: str) -> list[Costed]:
    """The seed as a plan with memory (and costs), or nothing when it does not fit; where it fits only with
    recomputation, or not at all, also the seed at each higher ZeRO stage the space allows, up to the first that
    fits without (sharding the weights and optimizer state instead of recomputing: the simulator picks). A seed of
    one stage (data parallel) at every ZeRO stage: ZeRO-3's gathers overlap the compute where a ZeRO-0/1 gradient
    all-reduce follows the last backward, so on a slow link it can be the fastest."""
    mode = next(m for m in LIGHTER if m in prob.space.recompute)
    out: list[Costed] = []
    for zero in _seed_zeros(prob):
        stages = tuple(ir.Stage((parts[s], parts[s + 1]), groups[s], tuple(forms[s]), 0, mode, 1,
                                zero if len(groups[s]) > 1 else 0) for s in range(len(groups)))
        stages = tuple(dataclasses.replace(st, tp=st.width, zero=0) if set(st.forms) - {"dp"} else st
                       for st in stages)
        draft = ir.Plan(prob.profile, prob.cluster, prob.schedule, prob.microbatches, prob.optimizer, stages,
                        ir.Prediction(0.0, 0.0, 0.0, 0), engine=engine, solver=solver, precision=prob.space.precision)
        fitted = with_memory(draft, prob.space.recompute)
        if fitted is not None:
            out.append(fitted)
            if len(groups) > 1 and all(st.recompute == mode for st in fitted[0].stages):
                break
        if all(st.zero == 0 for st in stages):
            break  # no stage has data-parallel ranks to shard over
    return out


def _seed_zeros(prob: Problem) -> list[int]:
    """The ZeRO stages a seed tries, in order: 1 where allowed (as fast as 0, leaner), else the least allowed, then
    the higher ones the space allows."""
    first = 1 if 1 in prob.space.zero else min(prob.space.zero)
    return [first, *sorted(z for z in prob.space.zero if z > first)]


def _seed_zero(prob: Problem, devices: tuple[str, ...], tp: int = 1) -> int:
    """The ZeRO stage a seed stage takes: 1 where allowed (as fast as 0, leaner), else the least
    allowed; 0 on one data-parallel rank."""
    if len(devices) // tp == 1:
        return 0
    return 1 if 1 in prob.space.zero else min(prob.space.zero)


def busy_lower_bound_s(plan: ir.Plan, costs: Sequence[ir.StageCost]) -> float:
    """A lower bound on the simulated iteration: the busiest device's own work.

    Every device runs its micro-batches' forwards and backwards, then its blocking
    gradient all-reduce and optimizer step, one at a time (planner.simulate's device
    model), so no schedule finishes an iteration sooner; chunks sharing devices
    (interleaved) add up. On CPU processes that share a node's cores the forwards and
    backwards count at the fastest the simulator may play them (the device group computing
    alone on its nodes: planner.simulate.cores), not at their nominal, all-computing speed.
    """
    groups = list(dict.fromkeys(cost.devices for cost in costs))
    cores = CoreShare(groups, plan_options(plan).core_nodes)
    busy: dict[tuple[str, ...], float] = {}
    for cost in costs:
        compute_s = plan.microbatches * (cost.forward_s + cost.backward_s)
        if cores:
            compute_s /= cores.fastest_rate(groups.index(cost.devices))
        busy[cost.devices] = busy.get(cost.devices, 0.0) + compute_s + cost.allreduce_s + cost.optimizer_step_s
    return max(busy.values(), default=0.0)


def pipeline_lower_bound_s(plan: ir.Plan, costs: Sequence[ir.StageCost]) -> float:
    """A lower bound on the simulated iteration for a schedule that flushes: on each device group g,
    micro-batch 0's forward through the chunks before g's first, then M micro-batches through each of g's chunks
    (forward and backward, which a GPU runs one at a time; recomputation only adds to them), then the last one's
    backward through those chunks again (a device's last action is its first chunk's backward, its first that
    chunk's forward). 0 (no floor) where devices share cores (``concurrent_devices``: a lane computes faster while
    others wait), the schedule does not flush, or it splits the weight gradients off (zero-bubble: a device's last
    actions may be W's that overlap the backward further up)."""
    kind = schedule_kind(plan.schedule)
    if any(node.concurrent_devices is not None for node in plan.cluster.nodes) or not kind.flushes or \
            kind.splits_weight_grad:
        return 0.0
    groups = len(costs) // plan.virtual_stages
    return max(sum(c.forward_s + c.backward_s for c in costs[:g])
               + plan.microbatches * sum(c.forward_s + c.backward_s for c in costs[g::groups]) for g in range(groups))


def lower_bound_s(plan: ir.Plan, costs: Sequence[ir.StageCost]) -> float:
    """A lower bound on the simulated iteration: the larger of the busiest device's own work
    (:func:`busy_lower_bound_s`) and the pipeline's path through a device group (:func:`pipeline_lower_bound_s`).
    The re-rank and ``planner compare``'s choice among a baseline's candidates skip what it rules out."""
    return max(busy_lower_bound_s(plan, costs), pipeline_lower_bound_s(plan, costs))


def best_simulated(plans: Sequence[Costed], judged: list[Judged] | None = None) -> Judged:
    """The plan with the least simulated iteration time (first wins ties), its prediction set: among those
    the simulator's memory verdict fits (planner.judge) where any does, else among all (each fits by the
    analytic memory that admitted it).

    Candidates are simulated in order of :func:`lower_bound_s`; one whose bound
    already exceeds the best simulated time cannot win and is not simulated (branch and
    bound: the answer is the same as simulating every candidate). ``judged``, when given,
    receives every simulated candidate, fastest first.
    """
    unique: dict[tuple, tuple[int, Costed]] = {}
    for i, costed in enumerate(plans):
        unique.setdefault(plan_key(costed[0]), (i, costed))
    order = sorted((lower_bound_s(plan, costs), i, plan, costs) for i, (plan, costs) in unique.values())
    best: tuple[float, int, Judged] | None = None
    over: tuple[float, int, Judged] | None = None
    for bound_s, i, plan, costs in order:
        if best is not None and bound_s > best[0]:
            break
        one = simulated(plan, costs)
        if judged is not None:
            judged.append(one)
        key = (one.prediction.iteration_s, i, one)
        if one.fits and (best is None or key[:2] < best[:2]):
            best = key
        elif not one.fits and (over is None or key[:2] < over[:2]):
            over = key
    if judged is not None:
        judged.sort(key=lambda j: j.prediction.iteration_s)
    chosen = best if best is not None else over
    if chosen is None:
        from planner.errors import InfeasibleError

        raise InfeasibleError("no runnable plan fits among the candidates", "try more micro-batches or devices")
    return chosen[2]


def dp_simulated_s(profile: ir.ModelProfile, cluster: ir.Cluster, optimizer: str, precision: str = "fp32",
                   engine: str = "any") -> float:
    """Pure data parallel (one stage on every GPU, M = 1) run by ``engine``, simulated: the speed-up's yardstick."""
    from planner.costmodel import dp_plan

    return simulated(dp_plan(profile, cluster, optimizer, precision, engine)).prediction.iteration_s

"""The structured seed plans the search's re-rank judges beside the dynamic programs' (planner.search.rerank).

Equal-width pipeline x data-parallel grids with balanced layer splits (DeepSpeed's and torchgpipe's), pure data
parallelism at each ZeRO stage (also on the first 1, 2, 4, ... servers alone), one stage under HPP's forms
(AccPar's layout), and PipeDream's partitions and Megatron-LM's layouts as ``planner compare`` runs them: the plans
the analytic objective, optimistic about pipelines over slow links, may rank out of the re-rank. Each is admitted
only where the search's space holds its groups and it fits (:func:`planner.search.rerank.with_memory`). Pure: no
torch, click or rich.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from planner import ir
from planner.cluster import group_of, index
from planner.runnable import is_runnable
from planner.search import baselines as bl
from planner.search.rerank import LIGHTER, Costed, with_memory
from planner.search.sp import Problem

PARAMETER_SPLIT_WORK = 5e7
"""Largest (layers + 1)^2 x K for which the ``parameters`` seed split (DeepSpeed's O(n^2 K)
``partition_balanced``) is computed; beyond it that seed is left out (1000 layers: K <= 50)."""



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
    table = layer_table(prob.profile, Grid(group, group.n, prob.space.precision, sequence,
                                           prob.overhead.per_collective_s),
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
    return 0 if len(devices) // tp == 1 else _seed_zeros(prob)[0]

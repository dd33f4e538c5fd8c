"""The search space of the stage DP, tabulated: stage moves over device grids and their costs.

Pure (numpy). The same space for ``--solver dp`` (planner.search.sp) and ``--solver brute``
(planner.search.brute):

- Stages take contiguous layer ranges, in model order, and devices in cluster order
  (servers in file order, GPUs in server order). Devices may be left unused.
- ``hierarchy`` groups (the default: "split across servers first, then inside a server"):
  a stage's group is either ``w`` consecutive GPUs inside one server, ``w`` a power of two
  or the whole server, or ``k >= 2`` whole consecutive servers (every ``k`` up to 16
  servers, beyond that powers of two and all servers). A stage starts at the next free
  GPU; before it, the rest of the current server (or a whole server) may be skipped.
  ``contiguous`` groups (``--config`` and ``--engine``): ``w`` consecutive GPUs in cluster
  order, crossing servers if need be, with the widths given.
- Each group runs as a ``tp x dp`` grid: tensor groups of ``tp`` GPUs inside one server
  (``tp`` a power of two dividing the group's GPUs in each of its servers; ``--tp`` fixes
  it), ``dp = w / tp`` replicas, and only grids whose data-parallel ranks get whole
  micro-batches: ``batch % (M * dp) == 0`` (``--micro-batch-size N`` fixes ``dp = batch /
  (N * M)``) of at least the profile's ``min_batch`` samples, per tensor rank where ``tp > 1``.
- Each stage runs the fastest or the leanest HPP forms on its grid (planner.search.hpp)
  with one of the allowed recomputation modes and ZeRO stages (planner.costmodel.variant):
  a Pareto set of time against memory per stage; a stage that fits none of them in its
  smallest device memory is excluded. Memory depends on the micro-batches in flight,
  which for 1f1b-like schedules depend on how many stages follow (K - s): the DP tracks
  that count (capped where it stops mattering). For zb-h1, whose count (min(K, M) on every
  stage) depends on K itself, a stage is held to the largest count over every K it could
  be part of, at most as many stages before it as blocks (planner.search.tables.in_flight_counts:
  plans always fit; exact for the first stage, so for one-stage plans; conservative for later ones).
- Large inputs: above ``max_blocks`` layers (default 256, or 128 beyond 64 GPUs), stage
  boundaries are restricted to block boundaries that balance compute (as Alpa clusters
  operators into layers).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from planner import ir
from planner.cluster import Group, group_of, index, server_share
from planner.costmodel import PAPER, Grid, Variant, VariantCost, ZeroComms, variant_cost, variants
from planner.costmodel.engine import EngineOverhead
from planner.runnable import ANY_FORMS, FormRules
from planner.search.hpp import StageTables

INTRA, INTER = 0, 1


@dataclass(frozen=True)
class Move:
    """From a free-device position: run a stage on ``devices`` as a ``tp`` grid, then go to ``next``.

    ``key`` indexes the problem's grids (group shape and tp); ``link`` is INTRA or INTER,
    the link the stage receives its input over.
    """

    key: int
    devices: tuple[str, ...]
    next: int
    link: int
    tp: int = 1


@dataclass(frozen=True)
class Option:
    """One way to run a stage on a grid: HPP forms (fastest or leanest) and a variant."""

    lean: bool
    variant: Variant


@dataclass(frozen=True)
class MoveGroup:
    """The moves from one position onto the same devices, link and next position: one per tensor degree.

    The DP needs only their least period per stage range; the backtrack finds the move that gave it."""

    keys: tuple[int, ...]
    devices: tuple[str, ...]
    next: int
    link: int


@dataclass
class Candidate:
    """Per (grid key, link): for each option, the stage tables the DP reads, all (nb+1, nb+1):
    period, max term ``term`` and ``rmax`` the largest stages-left count it fits with (0: never)."""

    options: list[Option]
    period: list[np.ndarray]
    term: list[np.ndarray]
    rmax: list[np.ndarray]
    band: dict[str, np.ndarray] = field(default_factory=dict)
    """The same arrays in band layout, options stacked: ``band[x][v, a, k] = x[v][a, a + 1 + k]``
    (inf/0 past the end)."""

    def make_band(self) -> None:
        nb1 = self.period[0].shape[0]
        rows = np.arange(nb1)[:, None]
        cols = rows + 1 + np.arange(nb1)[None, :]
        inside = cols < nb1
        cols = np.where(inside, cols, 0)
        for name in ("period", "term", "rmax"):
            fill = 0 if name == "rmax" else np.inf
            self.band[name] = np.stack([np.where(inside, arr[rows, cols], fill) for arr in getattr(self, name)])


@dataclass(frozen=True)
class Space:
    """What the user fixed or allowed: tensor degrees (None: every valid one), ZeRO stages,
    recomputation modes, forms, a fixed micro-batch size, and the precision."""

    precision: str = "fp32"
    tp: int | None = None
    zero: tuple[int, ...] = (0, 1, 2, 3)
    recompute: tuple[str, ...] = ("none", "selective", "full")
    forms: tuple[str, ...] = ir.ALL_FORMS
    micro_batch_size: int | None = None
    sequence_parallel: bool = True
    min_batch: int = 1
    """The fewest samples the model trains on at a time (``ModelProfile.min_batch``): the least micro-batch
    per data-parallel rank, and per tensor rank where a tensor group splits the samples (planner.runnable)."""
    rules: FormRules = ANY_FORMS
    """The engine's limits on which layers take which forms (planner.engines.FormRules)."""
    max_tp: int | None = None
    """The largest tensor degree the engine runs the model's sequence at (planner.engines.EngineLimits.largest_tp:
    torchtitan's seq_len a multiple of 2 x tp); None: any."""


@dataclass
class Problem:
    """One search instance: profile, cluster, M, schedule and the search space, tabulated."""

    profile: ir.ModelProfile
    cluster: ir.Cluster
    microbatches: int
    schedule: str
    optimizer: str
    space: Space
    bounds: np.ndarray
    moves: list[list[Move]]
    skip: list[int]
    grids: list[Grid]
    tables: list[list[StageTables]]
    stages_exact: int | None  # K fixed (config, or schedules whose memory depends on K)
    config: tuple[int, ...] | None
    r_cap: int
    a: float
    b: float
    cand: dict[tuple[int, int], Candidate] = field(default_factory=dict)
    r_eff: int = 1
    capacity_override: float | None = None
    min_stages: int = 1
    """The fewest stages a plan has: 2 closes the whole model as one stage's range (planner.search.tables)."""
    stages_max: int | None = None
    """The most stages a plan may have, below ``r_cap`` (an engine's schedule that needs a micro-batch per
    stage: at most M); None: no bound. The DP then counts stages exactly up to it (planner.search.sp)."""
    overhead: EngineOverhead = field(default_factory=EngineOverhead)
    """What the plan's engine adds per action, micro-batch sent and step (planner.costmodel.engine)."""
    comms: ZeroComms = PAPER
    """How the engine runs ZeRO's collectives (planner.costmodel.variant)."""
    move_groups: list[list[MoveGroup]] = field(default_factory=list)
    """Per position, its moves grouped by devices, link and next position (made by :func:`_grid_moves`)."""
    ties: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)
    """Per (grid key, ZeRO stage), the tied-weight copies of every stage range (planner.search.tables.tie_copies):
    kept, as no capacity the search tries changes them."""

    @property
    def nb(self) -> int:
        return len(self.bounds) - 1

    @property
    def devices(self) -> int:
        return len(self.skip)

    @property
    def forms(self) -> tuple[str, ...]:
        return self.space.forms


# ----------------------------------------------------------------------------- moves


def coarse_bounds(profile: ir.ModelProfile, max_blocks: int) -> np.ndarray:
    """Block boundaries: every layer, or at most ``max_blocks`` blocks balancing fwd+bwd time."""
    n = len(profile.layers)
    if n <= max_blocks:
        return np.arange(n + 1)
    t = np.array([x.forward_s + x.backward_s for x in profile.layers]) + 1e-12
    cum = np.concatenate([[0.0], np.cumsum(t)])
    targets = np.linspace(0, cum[-1], max_blocks + 1)
    cuts = np.unique(np.clip(np.searchsorted(cum, targets), 0, n))
    return np.unique(np.concatenate([[0, n], cuts]))


def pow2_upto(n: int) -> list[int]:
    out, w = [], 1
    while w <= n:
        out.append(w)
        w *= 2
    return out


def _group_options(d: int, c: int, u: int, size: int, starts: Sequence[int], s_total: int, g_total: int, mode: str,
                   allowed: set[int] | None) -> list[tuple[int, int]]:
    """(width, next position) of the groups a stage may take from position ``d``."""
    if mode != "hierarchy":
        ws = sorted(allowed) if allowed is not None else list(range(1, g_total + 1))
        return [(w, d + w) for w in ws if d + w <= g_total]
    opts = [(w, d + w) for w in sorted(set(pow2_upto(size)) | {size}) if u + w <= size]
    if u == 0:
        ks = list(range(2, s_total - c + 1))
        if s_total > 16:
            ks = sorted({k for k in pow2_upto(s_total) if k >= 2} | ({s_total} if c == 0 else set()))
        opts += [(starts[c + k] - d, starts[c + k]) for k in ks if c + k <= s_total]
    return opts


@dataclass(frozen=True)
class BaseMoves:
    """The moves of every position before tensor degrees: per position, (group index, devices, next
    position, link); the distinct groups (as the cost model sees them, in one number format); and each
    position's skip target. The same for every micro-batch count, so made once per cluster and space.
    ``aligns``: per group, the greatest common divisor of its GPUs in each of its servers, which a tensor
    degree must divide for every tensor group to stay inside one server (:func:`server_share`)."""

    rows: tuple[tuple[tuple[int, tuple[str, ...], int, int], ...], ...]
    groups: tuple[Group, ...]
    skip: tuple[int, ...]
    aligns: tuple[int, ...] = ()


@functools.lru_cache(maxsize=1024)  # an engine's search asks for one per stage width: 136 on 1024 GPUs
def base_moves(cluster: ir.Cluster, mode: str, widths: tuple[int, ...] | None, number_format: str) -> BaseMoves:
    """The moves from every free-device position, the distinct groups, and the skip targets (cached)."""
    idx = index(cluster)
    names, starts, node_at = idx.names, idx.node_start, idx.node_at
    allowed = None if widths is None else set(widths)
    rows: list[tuple[tuple[int, tuple[str, ...], int, int], ...]] = []
    group_key: dict[tuple[Group, int], int] = {}
    for d in range(len(names)):
        c = node_at[d]
        u, size = d - starts[c], starts[c + 1] - starts[c]
        row, seen = [], set()
        for w, nxt in _group_options(d, c, u, size, starts, len(cluster.nodes), len(names), mode, allowed):
            if (allowed is not None and w not in allowed) or (w, nxt) in seen:
                continue
            seen.add((w, nxt))
            devices = tuple(names[d:nxt])
            group = group_of(cluster, devices, number_format)
            gi = group_key.setdefault((group, server_share(cluster, devices)), len(group_key))
            row.append((gi, devices, nxt, INTRA if u > 0 and node_at[nxt - 1] == c else INTER))
        rows.append(tuple(row))
    skip = tuple(starts[node_at[d] + 1] for d in range(len(names)))
    return BaseMoves(tuple(rows), tuple(g for g, _ in group_key), skip, tuple(a for _, a in group_key))


def shardable(profile: ir.ModelProfile) -> bool:
    """Whether any layer can shard its weight (split or tp forms): else a tensor group only repeats tp 1."""
    return any(x.splittable or x.block is not None for x in profile.layers)


def tensor_degrees(group: Group, batch_size: int, microbatches: int, space: Space, shardable: bool = True,
                   align: int | None = None) -> list[int]:
    """The tensor degrees a group may run: powers of two dividing its GPUs in each server (``align``, their
    greatest common divisor, :func:`server_share`; None: the fewest in one server), with
    whole micro-batches per data-parallel rank of at least ``space.min_batch`` samples per tensor rank (and the
    fixed ``--tp`` / ``--micro-batch-size``), and
    two or more of them where the ZeRO stages allowed exclude 0 (``--zero N``); only 1 when no layer can
    shard (a tensor group of dp forms costs what tp 1 costs)."""
    out = []
    share = (group.per_node if group.nodes > 1 else group.n) if align is None else align
    for tp in pow2_upto(share) if shardable else [1]:
        dp = group.n // tp
        fixed_other = space.tp is not None and tp != space.tp
        if group.n % tp or share % tp or fixed_other or (space.max_tp is not None and tp > space.max_tp):
            continue
        if batch_size % (microbatches * dp) or batch_size // (microbatches * dp) < _least(space.min_batch, tp):
            continue
        if space.micro_batch_size is not None and batch_size != space.micro_batch_size * microbatches * dp:
            continue
        if tp > 1 and not set(space.forms) - {"dp"}:
            continue
        if dp == 1 and 0 not in space.zero:  # a ZeRO stage fixed by the user shards over data-parallel ranks
            continue
        out.append(tp)
    return out


def _least(min_batch: int, tp: int) -> int:
    """The fewest samples a micro-batch of a data-parallel rank holds: ``min_batch`` for each of the ``tp`` ranks
    its dp forms may split them over (nothing beyond 1 where the model takes one sample)."""
    return 1 if min_batch == 1 else min_batch * tp


# ----------------------------------------------------------------------------- problems


def option_cost(prob: Problem, key: int, option: Option) -> tuple[StageTables, VariantCost]:
    """The stage tables of ``option`` on grid ``key`` and its variant's costs (planner.costmodel.variant)."""
    t = prob.tables[key][1 if option.lean else 0]
    return t, variant_cost(t.agg, t.in_bytes[:, None], option.variant, prob.microbatches, t.sync_const, prob.comms,
                           t.blockwise)


def options(prob: Problem, key: int) -> list[Option]:
    """Every option of a grid: HPP forms (fastest, leanest) x the allowed variants."""
    grid = prob.grids[key]
    modes = prob.space.recompute
    if not prob.profile.has_blocks:  # selective recomputes attention cores only
        modes = tuple(m for m in modes if m != "selective") or modes
    var = variants(modes, prob.space.zero, grid.dp, prob.comms)
    return [Option(lean, v) for lean in (False, True)[:len(prob.tables[key])] for v in var]

"""A search problem before its tables: its grids, moves and layer tables, and a bound on its objective.

Pure (numpy). Tabulating a problem (the HPP stage tables of every block range, each option's
periods, terms and memory limits: planner.search.hpp, planner.search.tables) is most of a
search's time where an engine runs one grid for every stage, with one problem per stage width,
tensor degree and micro-batch count (825 of them for a 70B-class decoder on 128 GPUs). A
:class:`Framed` problem holds what the tables are made from, and :meth:`Framed.lower_bound_s`
bounds the analytic objective of every plan in it, so the search (planner.search) tabulates
problems in the order of their bounds and leaves out those that cannot beat its best, as the
descent leaves out caps that cannot (planner.search.descent).

The bound. The objective is ``T = a * sum_s l_s + max_s(b * busy_s + ar_s)``
(planner.costmodel.iteration), ``a, b >= 0``; each stage's ``l_s`` and ``busy_s`` are at
least its compute per micro-batch ``t_s`` (transfers, gradient synchronisation, re-layouts,
recomputation, ZeRO's gathers and the engine's overheads only add), and ``t_s`` is at least
the sum over its layers of each layer's fastest form on any of the problem's grids. With
``S`` that sum over the whole model and ``K`` the most stages a plan can have,
``T >= a * sum_s t_s + b * max_s t_s >= (a + b / K) * S``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from planner import ir
from planner.costmodel import Grid, LayerTable, layer_table, schedule_weights
from planner.costmodel.engine import engine_overhead, zero_comms
from planner.search.hpp import StageTables, only_dp, stage_tables_many
from planner.search.space import (
    BaseMoves,
    Move,
    MoveGroup,
    Problem,
    Space,
    base_moves,
    coarse_bounds,
    shardable,
    tensor_degrees,
)


@dataclass(frozen=True)
class Framed:
    """A problem's inputs, grids and layer tables (one per grid), before its stage tables and moves. A
    problem of exactly one stage runs its engine's ZeRO without a pipeline (planner.runnable)."""

    profile: ir.ModelProfile
    cluster: ir.Cluster
    microbatches: int
    schedule: str
    optimizer: str
    space: Space
    engine: str
    bounds: np.ndarray
    base: BaseMoves
    grids: tuple[Grid, ...]
    keys_of: tuple[tuple[tuple[int, int], ...], ...]
    """Per base group: (grid key, tensor degree) of each grid it runs as."""
    layer_tables: tuple[LayerTable, ...]
    config: tuple[int, ...] | None
    exact_k: int | None
    min_stages: int = 1
    max_k: int | None = None
    """The most stages a plan may have (None: as many as fit; an engine's schedule that needs a micro-batch
    per stage: M)."""
    shared: dict[str, list[list[StageTables]]] = field(default_factory=dict, compare=False, repr=False)
    """The stage tables once made, shared with the problems framed from this one by
    :meth:`with_stages` (the same grids and layers: only the plans' stage counts differ)."""

    @property
    def has_moves(self) -> bool:
        """Whether any stage can be placed (every base group is some position's move)."""
        return any(self.keys_of)

    def most_stages(self) -> int:
        """The most stages a plan can have: one per block at most, disjoint groups of at least the
        narrowest width, or the fixed count."""
        if self.exact_k is not None:
            return self.exact_k
        narrowest = min((g.n for g, keys in zip(self.base.groups, self.keys_of, strict=True) if keys), default=1)
        return max(1, min(len(self.bounds) - 1, len(self.base.skip) // narrowest, self.max_k or len(self.bounds)))

    def lower_bound_s(self) -> float:
        """A lower bound on the analytic objective of every plan of the problem (module doc); inf
        when some layer runs on none of its grids."""
        if not self.has_moves:
            return float("inf")
        least = np.full(len(self.profile.layers), np.inf)
        for table in self.layer_tables:
            np.minimum(least, np.where(table.allowed, table.fwd + table.bwd, np.inf).min(axis=1), out=least)
        a, b = schedule_weights(self.schedule, self.microbatches)
        return float((a + b / self.most_stages()) * least.sum())

    def with_stages(self, exact: int | None = None, least: int = 1) -> Framed:
        """The same problem with exactly ``exact`` stages (None: any), at least ``least``."""
        return dataclasses.replace(self, exact_k=exact, min_stages=least)

    def one_mode_each(self) -> list[Framed]:
        """The same problem once per recomputation mode, every stage in it (an engine that runs one mode for the
        whole job: together they hold exactly the plans of this problem whose stages agree)."""
        return [dataclasses.replace(self, space=dataclasses.replace(self.space, recompute=(mode,)))
                for mode in self.space.recompute]

    def build(self) -> Problem:
        """The problem, tabulated (planner.search.space.Problem; its candidates made)."""
        from planner.search.tables import build_candidates

        a, b = schedule_weights(self.schedule, self.microbatches)
        r_cap = max(1, min(len(self.bounds) - 1, len(self.base.skip)))  # the most stages a plan can have
        bounded = self.exact_k is None and self.max_k is not None and self.max_k < r_cap
        if "tables" not in self.shared:
            self.shared["tables"] = _stage_tables(self.layer_tables, self.bounds, self.microbatches)
        tables = self.shared["tables"]
        moves, groups = _moves(self.base, self.keys_of)
        prob = Problem(self.profile, self.cluster, self.microbatches, self.schedule, self.optimizer, self.space,
                       self.bounds, moves, list(self.base.skip), list(self.grids), tables, self.exact_k,
                       self.config, r_cap, a, b, overhead=engine_overhead(self.cluster, self.engine),
                       move_groups=groups, comms=zero_comms(self.cluster, self.engine, self.space.precision,
                                                            self.exact_k != 1, self.profile.param_count),
                       min_stages=self.min_stages, stages_max=self.max_k if bounded else None)
        build_candidates(prob)
        return prob


def frame_problem(profile: ir.ModelProfile, cluster: ir.Cluster, *, microbatches: int, schedule: str,
                  optimizer: str, forms: Sequence[str] | None = None, mode: str = "hierarchy",
                  widths: Sequence[int] | None = None, config: Sequence[int] | None = None,
                  max_blocks: int | None = None, stages: int | None = None, space: Space | None = None,
                  engine: str = "any", min_stages: int = 1, max_stages: int | None = None) -> Framed:
    """The problem's grids and layer tables (see planner.search.space's module doc for the space); its
    plans have exactly ``stages`` stages when given, at least ``min_stages``, at most ``max_stages``."""
    space = space or Space()
    if forms is not None:
        space = Space(**{**space.__dict__, "forms": tuple(forms)})
    if config is not None:
        mode, widths = "contiguous", sorted(set(config))
    base = base_moves(cluster, mode, None if widths is None else tuple(widths), space.precision)
    if max_blocks is None:
        max_blocks = 256 if len(cluster.gpus) <= 64 else 128
    grids, keys_of = _grids(profile, base, microbatches, space, engine_overhead(cluster, engine).per_collective_s)
    lts = tuple(layer_table(profile, grid, microbatches, optimizer, space.forms, space.rules) for grid in grids)
    return Framed(profile, cluster, microbatches, schedule, optimizer, space, engine,
                  coarse_bounds(profile, max_blocks), base, tuple(grids), keys_of, lts,
                  tuple(config) if config is not None else None, len(config) if config is not None else stages,
                  min_stages, max_stages)


def build_problem(profile: ir.ModelProfile, cluster: ir.Cluster, *, microbatches: int, schedule: str, optimizer: str,
                  forms: Sequence[str] | None = None, mode: str = "hierarchy", widths: Sequence[int] | None = None,
                  config: Sequence[int] | None = None, max_blocks: int | None = None, stages: int | None = None,
                  space: Space | None = None, engine: str = "any", max_stages: int | None = None) -> Problem:
    """Tabulate everything the stage DP and brute force read (planner.search.space's module doc)."""
    return frame_problem(profile, cluster, microbatches=microbatches, schedule=schedule, optimizer=optimizer,
                         forms=forms, mode=mode, widths=widths, config=config, max_blocks=max_blocks, stages=stages,
                         space=space, engine=engine, max_stages=max_stages).build()


def _grids(profile: ir.ModelProfile, base: BaseMoves, microbatches: int, space: Space, collective_s: float
           ) -> tuple[list[Grid], tuple[tuple[tuple[int, int], ...], ...]]:
    """The distinct grids the base groups run as, one per tensor degree a group may run
    (planner.search.space.tensor_degrees), and per base group its (grid key, tensor degree) pairs;
    ``collective_s``: what the engine adds to each collective of a tensor group."""
    grids: list[Grid] = []
    keys_of: list[tuple[tuple[int, int], ...]] = []
    can_shard = shardable(profile)
    for group, align in zip(base.groups, base.aligns, strict=True):
        keys = []
        for tp in tensor_degrees(group, profile.batch_size, microbatches, space, can_shard, align):
            keys.append((len(grids), tp))
            grids.append(Grid(group, tp, space.precision,
                              space.sequence_parallel and tp > 1 and profile.splits_sequence(tp),
                              collective_s))
        keys_of.append(tuple(keys))
    return grids, tuple(keys_of)


def _moves(base: BaseMoves, keys_of: Sequence[Sequence[tuple[int, int]]]
           ) -> tuple[list[list[Move]], list[list[MoveGroup]]]:
    """Every base move once per grid its group runs as, and per position the moves grouped by devices,
    link and next position."""
    moves = [[Move(key, devices, nxt, link, tp) for gi, devices, nxt, link in row for key, tp in keys_of[gi]]
             for row in base.rows]
    groups = [[MoveGroup(tuple(key for key, _ in keys_of[gi]), devices, nxt, link)
               for gi, devices, nxt, link in row if keys_of[gi]] for row in base.rows]
    return moves, groups


def _stage_tables(lts: Sequence[LayerTable], bounds: np.ndarray, microbatches: int) -> list[list[StageTables]]:
    """Per grid: the fastest HPP stage tables, and the leanest where they differ (one sweep for all grids,
    fastest and leanest together)."""
    open_ = [i for i, lt in enumerate(lts) if not only_dp(lt)]
    both = stage_tables_many([*lts, *(lts[i] for i in open_)], bounds, microbatches,
                             [False] * len(lts) + [True] * len(open_))
    fast, lean = both[:len(lts)], dict(zip(open_, both[len(lts):], strict=True))
    out = []
    for i, f in enumerate(fast):
        ln = lean.get(i)
        if ln is None or all(np.array_equal(f.agg[k], ln.agg[k]) for k in f.agg):
            out.append([f])
        else:
            out.append([f, ln])
    return out

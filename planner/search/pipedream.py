"""PipeDream's hierarchical partitioner (``optimizer_graph_hierarchical.py``), reimplemented (pure).

A DP per level of the hierarchy with data-parallel replication per stage and no tensor split;
activation transfers are counted only with ``--activation_compression_ratio`` (PipeDream's
default leaves them out); ``--straight_pipeline`` (no replication: one unit per stage) and
``--use_fewer_machines`` (a range may leave units of its budget unused) as its flags do.
``planner compare``'s ``pipedream`` row (planner.search.baselines).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PipeDreamStage:
    """One stage of PipeDream's answer: layers [first, end) on ``devices``.

    Each device is its path in the hierarchy, outermost index first: ``(server, gpu)``
    for two levels. A stage is replicated (data parallel) over all its devices.
    """

    first: int
    end: int
    devices: tuple[tuple[int, ...], ...]

    @property
    def replicas(self) -> int:
        return len(self.devices)


@dataclass(frozen=True)
class PipeDreamFlags:
    """PipeDream's optimizer flags that change the partition's shape (``optimizer_graph_hierarchical.py``'s
    argparse): ``--straight_pipeline`` ("No replication across stages": every stage on one unit of each level,
    so one GPU) and ``--use_fewer_machines`` ("Use fewer machines, if possible": a range may take its answer on
    fewer units, leaving GPUs idle). Both off by default, as in PipeDream."""

    straight_pipeline: bool = False
    use_fewer_machines: bool = False

    @property
    def label(self) -> str:
        """The flags as a command line would give them ("" for PipeDream's defaults)."""
        return " ".join(flag for flag, on in (("--straight_pipeline", self.straight_pipeline),
                                              ("--use_fewer_machines", self.use_fewer_machines)) if on)


PIPEDREAM_FLAGS = (PipeDreamFlags(), PipeDreamFlags(use_fewer_machines=True), PipeDreamFlags(straight_pipeline=True),
                   PipeDreamFlags(straight_pipeline=True, use_fewer_machines=True))
"""Every combination of PipeDream's two shape flags, its defaults first (``planner compare`` tries each)."""


PIPEDREAM_MODES: tuple[tuple[str, float | None], ...] = (
    ("activations not counted (default)", None), ("--activation_compression_ratio 1", 1.0))
"""PipeDream's partitioner settings: its default leaves activation transfers out of the DP; its
README (the repository's top-level README.md, "python optimizer_graph_hierarchical.py ... -n 4
--activation_compression_ratio 1") runs ``--activation_compression_ratio 1``, which counts them. Each is
also run with each of :data:`PIPEDREAM_FLAGS` (planner.search.settings)."""


@dataclass(frozen=True)
class _Level:
    """One level of PipeDream's hierarchy as its DP sees it: ``units`` joined by ``bandwidth_Bps``,
    each the best partition over ``lower_units`` of the level below; ``outputs_bytes``: each
    layer's output divided by ``--activation_compression_ratio``, None when activation
    transfers are not counted (PipeDream's default); ``straight``: ``--straight_pipeline`` (a stage
    on one unit, never replicated); ``fewer``: ``--use_fewer_machines`` (layers i..j on m+1 units
    may take the answer on m units instead)."""

    units: int
    lower_units: int
    bandwidth_Bps: float
    outputs_bytes: Sequence[float] | None
    straight: bool = False
    fewer: bool = False


@dataclass(frozen=True)
class _Table:
    """PipeDream's table ``A[i][j][m]`` of one level as arrays (i, j, m): ``time`` the best time per batch of
    layers i..j on m+1 units (inf: none, PipeDream's None), ``split`` k of the last stage k+1..j (-1: one
    data-parallel stage, PipeDream's None), ``rest`` the units left for i..k, ``reps`` the last stage's units."""

    time: np.ndarray
    split: np.ndarray
    rest: np.ndarray
    reps: np.ndarray

    def entry(self, i: int, j: int, m: int) -> tuple[tuple[int, int] | None, int]:
        """PipeDream's (split, replicas) of a cell."""
        k = int(self.split[i, j, m])
        return (None if k < 0 else (k, int(self.rest[i, j, m]))), int(self.reps[i, j, m])


def _pipedream_start(times: np.ndarray, params: np.ndarray, level: _Level) -> _Table:
    """Layers i..j data parallel over m+1 units: (compute + 4*m*P / (B*(m+1)) / lower) / (m+1); on one
    unit only with ``--straight_pipeline`` (``max_m = 1``), the other cells left empty."""
    n = times.shape[0]
    shape = (n, n, level.units)
    table = _Table(np.full(shape, np.inf), np.full(shape, -1), np.zeros(shape, int), np.zeros(shape, int))
    for m in range(1 if level.straight else level.units):
        sync = (4 * m * params) / (level.bandwidth_Bps * (m + 1)) / level.lower_units
        table.time[:, :, m] = (times + sync) / (m + 1)
        table.reps[:, :, m] = np.where(np.isfinite(times), m + 1, 0)
    return table


def _pipedream_row(table: _Table, times: np.ndarray, params: np.ndarray, level: _Level, i: int, m: int) -> None:
    """``A[i][j][m]`` for every j > i at once: the data-parallel start against every last stage k+1..j
    on m' units after the best of i..k on the rest: max(A[i][k][m-m'], (compute + 4*(m'-1)*P/(B*m')) / m'),
    and with activations counted, at least the stage's transfer time: max(2*out[k], 2*out[j] unless j is the
    last layer) / (B*m'). ``--use_fewer_machines`` first takes ``A[i][j][m-1]`` where it is faster;
    ``--straight_pipeline`` tries only m' = 1. The first (k, then m') that is strictly faster wins, as in
    PipeDream's loops."""
    n, bw = times.shape[0], level.bandwidth_Bps
    js, ks = np.arange(i + 1, n), np.arange(i, n - 1)
    mps = np.arange(1, 2 if level.straight else m + 1)
    cells = (i, slice(i + 1, n))
    best, split = table.time[(*cells, m)].copy(), table.split[(*cells, m)].copy()
    rest, reps = table.rest[(*cells, m)].copy(), table.reps[(*cells, m)].copy()
    if level.fewer:
        prev = table.time[(*cells, m - 1)]
        take = np.isfinite(prev) & (prev < best)
        best[take], split[take] = prev[take], table.split[(*cells, m - 1)][take]
        rest[take], reps[take] = table.rest[(*cells, m - 1)][take], table.reps[(*cells, m - 1)][take]
    head = table.time[i, ks][:, m - mps]  # (k, m')
    last, weights = times[ks + 1][:, js, None], params[ks + 1][:, js, None]  # (k, j, 1)
    t = np.maximum(head[:, None, :], (last + (4 * (mps - 1) * weights) / (bw * mps)) / mps)  # (k, j, m')
    if level.outputs_bytes is not None:
        out = np.asarray(level.outputs_bytes, dtype=float)
        sent = np.maximum((2.0 * out[ks])[:, None, None] / (bw * mps),
                          np.where(js < n - 1, 2.0 * out[js], 0.0)[None, :, None] / (bw * mps))
        t = np.maximum(t, sent)
    t[ks[:, None] >= js[None, :]] = np.inf  # k < j: the last stage holds a layer
    flat = t.transpose(1, 0, 2).reshape(len(js), -1)  # per j, k-major then m', PipeDream's loop order
    pick = flat.argmin(axis=1)
    cand = flat[np.arange(len(js)), pick]
    win = cand < best
    best[win], split[win] = cand[win], ks[pick // len(mps)][win]
    reps[win] = mps[pick % len(mps)][win]
    rest[win] = m - reps[win]
    table.time[(*cells, m)], table.split[(*cells, m)], table.rest[(*cells, m)] = best, split, rest
    table.reps[(*cells, m)] = reps


def _pipedream_level(times: np.ndarray, params: np.ndarray, level: _Level, all_starts: bool) -> _Table:
    """One level of PipeDream's ``compute_partitioning`` for a chain of layers.

    ``A[i][j][m]``: the best time per batch of layers i..j (inclusive) on m+1 units of this
    level (:func:`_pipedream_start`, :func:`_pipedream_row`). PipeDream's defaults: no
    memory constraint, fewer machines not considered (``--use_fewer_machines``: ``level.fewer``),
    replication allowed (``--straight_pipeline``: ``level.straight``), and the activation transfer
    term only with ``--activation_compression_ratio``. The outermost level solves only i = 0.
    """
    n = times.shape[0]
    table = _pipedream_start(times, params, level)
    for i in range(n if all_starts else 1):
        for m in range(1, level.units):
            if i + 1 < n:
                _pipedream_row(table, times, params, level, i, m)
    return table


def _pipedream_unwind(a: _Table, start: int, end: int, units: int) -> list[tuple[int, int, int]]:
    """PipeDream's ``analyze_partitioning``: stages (first, end, replicas) of layers [start, end)."""
    split, reps = a.entry(start, end - 1, units - 1)
    stages: list[tuple[int, int, int]] = []
    stop = end
    while split is not None:
        k, rest = split
        stages.append((k + 1, stop, reps))
        stop = k + 1
        split, reps = a.entry(start, k, rest)
    stages.append((start, stop, reps))
    stages.reverse()
    return stages


def _range_sums(values: Sequence[float], none: float) -> np.ndarray:
    """``sums[i, j]``: values[i] + ... + values[j] for j >= i (a running sum's difference, as PipeDream's
    cumulative states), ``none`` below the diagonal."""
    cum = [0.0]
    for v in values:
        cum.append(cum[-1] + v)
    n = len(values)
    return np.array([[cum[j + 1] - cum[i] if j >= i else none for j in range(n)] for i in range(n)], dtype=float)


def pipedream_partition(
    stage_times: Sequence[float], param_bytes: Sequence[float], levels: Sequence[tuple[int, float]],
    output_bytes: Sequence[float] | None = None, activation_compression_ratio: float | None = None,
    flags: PipeDreamFlags | None = None,
) -> list[PipeDreamStage]:
    """PipeDream's hierarchical partitioner (Narayanan et al., SOSP'19, section 3.1).

    ``stage_times``: forward+backward seconds per layer on one device; ``param_bytes`` per
    layer; ``levels``: (units at this level, bandwidth between them in B/s), innermost
    first, e.g. ``[(gpus_per_server, intra_Bps), (servers, inter_Bps)]``.
    ``activation_compression_ratio``: None (PipeDream's default) leaves activation transfers
    out; a number (its README runs ``--activation_compression_ratio 1``) counts each stage's
    input and output (``output_bytes`` per layer) divided by it. ``flags``: its ``--straight_pipeline``
    (every stage on one unit of each level, so one GPU) and ``--use_fewer_machines`` (a stage may leave
    units unused, and so may the whole answer): :class:`PipeDreamFlags` (None: neither).
    The level-l DP treats one unit as the best partition of a layer range over the whole level
    below; the answer is unwound from the top (:func:`_pipedream_unwind_levels`). Returns the
    flat list of stages with their total replicas, or an empty list when there is no answer (a
    straight pipeline needs a layer per GPU unless it may use fewer).
    """
    n = len(stage_times)
    if n == 0 or not levels:
        raise ValueError("pipedream_partition needs layers and at least one level")
    if activation_compression_ratio is not None and output_bytes is None:
        raise ValueError("counting activations needs output_bytes per layer")
    outputs = None if activation_compression_ratio is None or output_bytes is None else \
        [b / activation_compression_ratio for b in output_bytes]
    times = _range_sums(stage_times, np.inf)
    params = _range_sums(param_bytes, 0.0)
    flags = flags or PipeDreamFlags()
    tables = []
    lower = 1
    for depth, (units, bandwidth) in enumerate(levels):
        level = _Level(units, lower, bandwidth, outputs, straight=flags.straight_pipeline,
                       fewer=flags.use_fewer_machines)
        a = _pipedream_level(times, params, level, all_starts=depth < len(levels) - 1)
        tables.append(a)
        times = a.time[:, :, -1]
        lower = units
    if not np.isfinite(times[0, n - 1]):
        return []
    return _pipedream_unwind_levels(tables, [units for units, _ in levels], n)


def _pipedream_unwind_levels(tables: list[_Table], units: Sequence[int], n: int) -> list[PipeDreamStage]:
    """Unwind from the outermost level: a stage replicated over r units is partitioned again
    inside each of them, and a sub-stage with f replicas per unit runs on f * r devices."""
    pieces: list[tuple[int, int, list[tuple[int, ...]]]] = [(0, n, [()])]
    for depth in range(len(units) - 1, -1, -1):
        nxt = []
        for first, end, prefixes in pieces:
            offset = 0
            for f, e, r in _pipedream_unwind(tables[depth], first, end, units[depth]):
                nxt.append((f, e, [(*p, u) for p in prefixes for u in range(offset, offset + r)]))
                offset += r
        pieces = nxt
    return [PipeDreamStage(f, e, tuple(devs)) for f, e, devs in pieces]

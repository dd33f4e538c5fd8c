"""PipeDream's hierarchical partitioner (``optimizer_graph_hierarchical.py``), reimplemented (pure).

A DP per level of the hierarchy with data-parallel replication per stage and no tensor split;
activation transfers are counted only with ``--activation_compression_ratio`` (PipeDream's
default leaves them out). ``planner compare``'s ``pipedream`` row (planner.search.baselines).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


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


_Entry = tuple[float | None, tuple[int, int] | None, int | None]
"""A cell of PipeDream's table: (time per batch, split (k, units left) or None, replicas of the last stage)."""


@dataclass(frozen=True)
class _Level:
    """One level of PipeDream's hierarchy as its DP sees it: ``units`` joined by ``bandwidth_Bps``,
    each the best partition over ``lower_units`` of the level below; ``outputs_bytes``: each
    layer's output divided by ``--activation_compression_ratio``, None when activation
    transfers are not counted (PipeDream's default)."""

    units: int
    lower_units: int
    bandwidth_Bps: float
    outputs_bytes: Sequence[float] | None


def _pipedream_start(times: list[list[float | None]], params: list[list[float]], level: _Level
                     ) -> list[list[list[_Entry]]]:
    """Layers i..j data parallel over m+1 units: (compute + 4*m*P / (B*(m+1)) / lower) / (m+1)."""
    n = len(times[0])
    none: _Entry = (None, None, None)
    a = [[[none] * level.units for _ in range(n)] for _ in range(n)]
    for i in range(n):
        for j in range(i, n):
            compute = times[i][j]
            if compute is None:
                continue
            for m in range(level.units):
                sync = (4 * m * params[i][j]) / (level.bandwidth_Bps * (m + 1)) / level.lower_units
                a[i][j][m] = ((compute + sync) / (m + 1), None, m + 1)
    return a


def _pipedream_transfer_s(outputs_bytes: Sequence[float], bandwidth_Bps: float, k: int, j: int,
                          replicas: int) -> float:
    """PipeDream's activation term for a last stage k+1..j on ``replicas`` units: its input
    (layer k's output) and, unless j is the last layer, its output, each 2 * bytes / (B * m')."""
    time_s = 2.0 * outputs_bytes[k] / (bandwidth_Bps * replicas)
    if j < len(outputs_bytes) - 1:
        time_s = max(time_s, 2.0 * outputs_bytes[j] / (bandwidth_Bps * replicas))
    return time_s


def _pipedream_cell(a: list[list[list[_Entry]]], times: list[list[float | None]], params: list[list[float]],
                    level: _Level, i: int, j: int, m: int) -> _Entry:
    """``A[i][j][m]``: the data-parallel start against every last stage k+1..j on m' units after
    the best of i..k on the rest: max(A[i][k][m-m'], (compute + 4*(m'-1)*P/(B*m')) / m'), and
    with activations counted, at least the stage's transfer time."""
    best, split, reps = a[i][j][m]
    for k in range(i, j):
        for mp in range(1, m + 1):
            last, head = times[k + 1][j], a[i][k][m - mp][0]
            if last is None or head is None:
                continue
            t = max(head, (last + (4 * (mp - 1) * params[k + 1][j]) / (level.bandwidth_Bps * mp)) / mp)
            if level.outputs_bytes is not None:
                t = max(t, _pipedream_transfer_s(level.outputs_bytes, level.bandwidth_Bps, k, j, mp))
            if best is None or best > t:
                best, split, reps = t, (k, m - mp), mp
    return best, split, reps


def _pipedream_level(times: list[list[float | None]], params: list[list[float]], level: _Level,
                     all_starts: bool) -> list[list[list[_Entry]]]:
    """One level of PipeDream's ``compute_partitioning`` for a chain of layers.

    ``A[i][j][m]``: the best time per batch of layers i..j (inclusive) on m+1 units of this
    level (:func:`_pipedream_start`, :func:`_pipedream_cell`). PipeDream's defaults: no
    memory constraint, fewer machines not considered, and the activation transfer term
    only with ``--activation_compression_ratio``. The outermost level solves only i = 0.
    """
    n = len(times[0])
    a = _pipedream_start(times, params, level)
    for i in range(n if all_starts else 1):
        for m in range(1, level.units):
            for j in range(i + 1, n):
                a[i][j][m] = _pipedream_cell(a, times, params, level, i, j, m)
    return a


def _pipedream_unwind(a: list, start: int, end: int, units: int) -> list[tuple[int, int, int]]:
    """PipeDream's ``analyze_partitioning``: stages (first, end, replicas) of layers [start, end)."""
    meta = a[start][end - 1][units - 1]
    stages: list[tuple[int, int, int]] = []
    stop = end
    while meta[1] is not None:
        k, rest = meta[1]
        stages.append((k + 1, stop, meta[2]))
        stop = k + 1
        meta = a[start][k][rest]
    stages.append((start, stop, meta[2]))
    stages.reverse()
    return stages


def _range_sums(values: Sequence[float], none: float | None) -> list[list[float | None]]:
    """``sums[i][j]``: values[i] + ... + values[j] for j >= i, ``none`` below the diagonal."""
    cum = [0.0]
    for v in values:
        cum.append(cum[-1] + v)
    n = len(values)
    return [[cum[j + 1] - cum[i] if j >= i else none for j in range(n)] for i in range(n)]


def pipedream_partition(
    stage_times: Sequence[float], param_bytes: Sequence[float], levels: Sequence[tuple[int, float]],
    output_bytes: Sequence[float] | None = None, activation_compression_ratio: float | None = None,
) -> list[PipeDreamStage]:
    """PipeDream's hierarchical partitioner (Narayanan et al., SOSP'19, section 3.1).

    ``stage_times``: forward+backward seconds per layer on one device; ``param_bytes`` per
    layer; ``levels``: (units at this level, bandwidth between them in B/s), innermost
    first, e.g. ``[(gpus_per_server, intra_Bps), (servers, inter_Bps)]``.
    ``activation_compression_ratio``: None (PipeDream's default) leaves activation transfers
    out; a number (its README runs ``--activation_compression_ratio 1``) counts each stage's
    input and output (``output_bytes`` per layer) divided by it. The level-l DP treats one
    unit as the best partition of a layer range over the whole level below; the answer is
    unwound from the top (:func:`_pipedream_unwind_levels`). Returns the flat list of
    stages with their total replicas.
    """
    n = len(stage_times)
    if n == 0 or not levels:
        raise ValueError("pipedream_partition needs layers and at least one level")
    if activation_compression_ratio is not None and output_bytes is None:
        raise ValueError("counting activations needs output_bytes per layer")
    outputs = None if activation_compression_ratio is None or output_bytes is None else \
        [b / activation_compression_ratio for b in output_bytes]
    times = _range_sums(stage_times, None)
    params = [[v or 0.0 for v in row] for row in _range_sums(param_bytes, 0.0)]
    tables = []
    lower = 1
    for depth, (units, bandwidth) in enumerate(levels):
        a = _pipedream_level(times, params, _Level(units, lower, bandwidth, outputs),
                             all_starts=depth < len(levels) - 1)
        tables.append(a)
        times = [[a[i][j][-1][0] if j >= i else None for j in range(n)] for i in range(n)]
        lower = units
    return _pipedream_unwind_levels(tables, [units for units, _ in levels], n)


def _pipedream_unwind_levels(tables: list, units: Sequence[int], n: int) -> list[PipeDreamStage]:
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

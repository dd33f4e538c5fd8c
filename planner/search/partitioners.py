"""The partitioners of the systems ``planner compare`` sets against the planner, reimplemented from
each system's own algorithm and tested against it (pure).

DeepSpeed ``PipelineModule`` (``partition_uniform``, ``partition_balanced`` and the
``'parameters'`` weighting of ``_partition_layers``), torchgpipe's ``balance_by_time`` (the
block-partition algorithm of Barany et al. on forward times in whole microseconds), and
PipeDream's hierarchical partitioner (``optimizer_graph_hierarchical.py``: a DP per level of
the hierarchy, data-parallel replication per stage, no tensor split, activation transfers
counted only with ``--activation_compression_ratio``). DeepSpeed's ``type:<regex>`` method and
torchgpipe's ``balance_by_size`` are here too.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from planner import ir

# ----------------------------------------------------------------------------- DeepSpeed


def partition_uniform(num_items: int, num_parts: int) -> list[int]:
    """DeepSpeed's ``deepspeed.runtime.utils.partition_uniform``: ``num_parts + 1`` boundaries.

    Equal counts; the first ``num_items % num_parts`` parts get one item more. With fewer
    items than parts, parts past the last item are empty (DeepSpeed's own edge case).
    """
    if num_parts < 1:
        raise ValueError(f"num_parts must be positive, got {num_parts}")
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    chunk, residual = divmod(num_items, num_parts)
    return [p * chunk + min(p, residual) for p in range(num_parts + 1)]


def partition_balanced(weights: Sequence[float], num_parts: int) -> list[int]:
    """DeepSpeed's ``partition_balanced``: ``num_parts + 1`` boundaries of contiguous parts.

    DeepSpeed solves "the linear partition problem" with a DP whose cost is the spread
    (largest part minus smallest part) of the parts so far, not the largest part; ties go
    to the latest split point (its ``>=`` comparison). Reproduced exactly, quirks included,
    so the split equals the one DeepSpeed's ``PipelineModule`` would make.
    """
    n, m = len(weights), num_parts
    if n <= m:
        return partition_uniform(n, m)
    inf = math.inf
    prefix = [0.0] * (n + 1)
    for i, w in enumerate(weights):
        prefix[i + 1] = prefix[i] + w
    dp_max = [[inf] * (m + 1) for _ in range(n + 1)]
    dp_min = [[inf] * (m + 1) for _ in range(n + 1)]
    dp_cost = [[inf] * (m + 1) for _ in range(n + 1)]
    position = [[0] * (m + 1) for _ in range(n + 1)]
    dp_max[0][0] = 0.0
    dp_cost[0][0] = 0.0
    for i in range(1, n + 1):
        for j in range(1, min(i, m) + 1):
            for k in range(i):
                part = prefix[i] - prefix[k]
                max_sum = max(dp_max[k][j - 1], part)
                min_sum = min(dp_min[k][j - 1], part)
                cost = max_sum - min_sum
                if dp_cost[i][j] >= cost:
                    dp_cost[i][j] = cost
                    dp_max[i][j] = max_sum
                    dp_min[i][j] = min_sum
                    position[i][j] = k
    parts = [n]
    for j in range(m, 0, -1):
        parts.append(position[parts[-1]][j])
    parts.reverse()
    return parts


def partition_balanced_fast(weights: Sequence[float], num_parts: int) -> list[int]:
    """:func:`partition_balanced`, vectorised over (i, k) with numpy: the same boundaries.

    Same recurrence and the same tie rule (the last split point of least cost wins, as the
    sequential ``>=`` does), one (n+1) x (n+1) array step per part instead of n^2 Python
    steps; tested equal to the loop (tests/test_baselines.py).
    """
    import numpy as np

    n, m = len(weights), num_parts
    if n <= m:
        return partition_uniform(n, m)
    prefix = [0.0] * (n + 1)
    for i, w in enumerate(weights):
        prefix[i + 1] = prefix[i] + w
    pre = np.array(prefix)
    part = pre[:, None] - pre[None, :]  # part[i, k] = prefix[i] - prefix[k]
    ks = np.arange(n + 1)
    valid = ks[None, :] < ks[:, None]  # k < i
    dp_max = np.full(n + 1, np.inf)
    dp_max[0] = 0.0
    dp_min = np.full(n + 1, np.inf)
    positions = np.zeros((m + 1, n + 1), dtype=np.int64)
    for j in range(1, m + 1):
        max_sum = np.maximum(dp_max[None, :], part)
        min_sum = np.minimum(dp_min[None, :], part)
        with np.errstate(invalid="ignore"):
            cost = np.where(valid, max_sum - min_sum, np.nan)
        best = np.nanmin(np.where(valid, cost, np.inf), axis=1)
        pos = np.where(valid & (cost == best[:, None]), ks[None, :], -1).max(axis=1)
        rows = ks >= j
        take = np.clip(pos, 0, n)
        positions[j] = np.where(rows, take, 0)
        dp_max = np.where(rows, max_sum[ks, take], np.inf)
        dp_min = np.where(rows, min_sum[ks, take], np.inf)
    parts = [n]
    for j in range(m, 0, -1):
        parts.append(int(positions[j][parts[-1]]))
    parts.reverse()
    return parts


def deepspeed_layer_weights(profile: ir.ModelProfile) -> list[int]:
    """The weights of DeepSpeed's ``partition_method='parameters'``: trainable parameters per layer.

    ``PipelineModule._count_layer_params`` builds each layer spec and counts its
    parameters, so a tied weight (``TiedLayerSpec``) counts in every layer that holds it;
    the profile counts it once, in the tie's first layer, so the others get it added back.
    """
    counts = [layer.param_count for layer in profile.layers]
    for tie in profile.ties:
        for idx in tie.layers[1:]:
            counts[idx] += tie.param_count
    return counts


def deepspeed_type_weights(profile: ir.ModelProfile, pattern: str) -> list[int]:
    """The weights of DeepSpeed's ``partition_method='type:<pattern>'``: 1 for each layer whose
    class name matches ``pattern`` (``PipelineModule._find_layer_type``: a case-insensitive
    regular-expression search), 0 for the others."""
    regex = re.compile(pattern, re.IGNORECASE)
    return [1 if regex.search(layer.type) else 0 for layer in profile.layers]


def deepspeed_parts(profile: ir.ModelProfile, num_stages: int, method: str) -> list[int]:
    """Stage boundaries DeepSpeed's ``PipelineModule(partition_method=method)`` makes:
    ``uniform``, ``parameters`` or ``type:<regex>`` (``_partition_layers``)."""
    if method == "uniform":
        return partition_uniform(len(profile.layers), num_stages)
    if method == "parameters":
        return partition_balanced_fast(deepspeed_layer_weights(profile), num_stages)
    if method.startswith("type:"):
        return partition_balanced_fast(deepspeed_type_weights(profile, method.split(":", 1)[1]), num_stages)
    raise ValueError(f"unknown DeepSpeed partition method {method!r} (uniform, parameters, type:<regex>)")


# ----------------------------------------------------------------------------- torchgpipe


def block_partition(sequence: Sequence[float], partitions: int) -> list[int]:
    """torchgpipe's ``balance.blockpartition.solve``, returning the layer count per partition.

    "Block Partitions of Sequences" (Barany and Grinberg, arXiv:1308.2452): normalise the
    costs to [0, 1], start from equal counts, and move one element at a time from the
    block next to the smallest block (on the side of the largest) into it, until the
    largest block exceeds the smallest by at most 1 (one normalised element).
    """
    if partitions < 1:
        raise ValueError(f"partitions must be a positive integer ({partitions} < 1)")
    n = len(sequence)
    if n < partitions:
        raise ValueError(f"sequence is shorter than intended partitions ({n} < {partitions})")
    low = min(sequence)
    span = max(sequence) - low
    normal = [0.0] * n if span == 0 else [(x - low) / span for x in sequence]
    splits = [n // partitions * (x + 1) for x in range(partitions - 1)] + [n]

    def block_size(i: int) -> float:
        return sum(normal[(splits[i - 1] if i > 0 else 0):splits[i]])

    sizes = np.array([block_size(i) for i in range(partitions)])  # kept as torchgpipe's sums: same ties
    moves = 0
    while True:
        p = partitions - 1 - int(np.argmax(sizes[::-1]))  # (1) a largest block, the last of equals
        max_size = sizes[p]
        while True:
            q = int(np.argmin(sizes))  # (2) a smallest block, the first of equals
            moves += 1
            if max_size <= sizes[q] + 1:
                return _counts(splits)
            if moves > MAX_BLOCK_MOVES * n:  # cycling: keep the blocks if they are whole, else equal counts
                counts = _counts(splits)
                return counts if min(counts) >= 1 else _counts(
                    [n // partitions * (x + 1) for x in range(partitions - 1)] + [n])
            if p < q:  # (3) move the last element of the block before q into q
                h = q - 1
                splits[h] -= 1
            else:  # or the first element of the block after q into q
                h = q + 1
                splits[q] += 1
            sizes[h], sizes[q] = block_size(h), block_size(q)  # only these two blocks changed
            if p == h:
                break


MAX_BLOCK_MOVES = 64
"""Moves per element after which :func:`block_partition` stops: torchgpipe's loop can cycle
for ever on some sequences (zeros and ties, e.g. 27 blocks of 29 elements); the answer is then
the blocks as they are if none is empty, else equal counts (the cycle can move splits past each other)."""


def _counts(splits: Sequence[int]) -> list[int]:
    starts = [0, *splits[:-1]]
    return [stop - start for start, stop in zip(starts, splits, strict=True)]


def balance_by_time(profile: ir.ModelProfile, partitions: int) -> list[int]:
    """torchgpipe's ``balance_by_time``: layers per partition from per-layer forward times.

    torchgpipe's ``profile_times`` times each layer's forward (in a training sandbox)
    and sums whole microseconds, then calls the block partition; the profile's
    ``forward_s`` stands in for that measurement.
    """
    times = [int(layer.forward_s * 1_000_000) for layer in profile.layers]
    return block_partition(times, partitions)


def balance_by_size(profile: ir.ModelProfile, partitions: int, chunks: int, param_scale: float) -> list[int]:
    """torchgpipe's ``balance_by_size``: layers per partition from per-layer memory.

    torchgpipe's ``profile_sizes`` measures each layer's CUDA memory in a forward pass of
    one sample, scales it to a micro-batch (``batch / chunks`` samples) and adds
    ``param_scale`` copies of its parameters (its guide: 2 for SGD, more with optimizer
    state), then calls the block partition; the profile's ``saved_bytes`` (for the whole
    batch) stands in for the measured activation memory.
    """
    sizes = [int(layer.saved_bytes / chunks + layer.param_bytes * param_scale) for layer in profile.layers]
    return block_partition(sizes, partitions)


# ----------------------------------------------------------------------------- PipeDream


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

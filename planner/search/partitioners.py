"""The partitioners of the systems ``planner compare`` sets against the planner, reimplemented from
each system's own algorithm and tested against it (pure).

DeepSpeed ``PipelineModule`` (``partition_uniform``, ``partition_balanced``, the
``'parameters'`` weighting of ``_partition_layers`` and its ``type:<regex>`` method) and
torchgpipe's ``balance_by_time`` (the block-partition algorithm of Barany et al. on forward +
backward times in whole microseconds) and ``balance_by_size``. PipeDream's hierarchical partitioner is
in :mod:`planner.search.pipedream`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

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
    """torchgpipe's ``balance_by_time``: layers per partition from per-layer training-step times.

    torchgpipe's ``profile_times`` (v0.0.5 on: "Profile backpropagation too") times each layer's
    forward and its backward together and sums whole microseconds, then calls the block partition;
    the profile's ``forward_s + backward_s`` stands in for that measurement.
    """
    times = [int((layer.forward_s + layer.backward_s) * 1_000_000) for layer in profile.layers]
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

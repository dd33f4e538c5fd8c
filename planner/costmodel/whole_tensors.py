"""ZeRO-1 by whole tensors: the optimizer state of the rank that gets the most of a stage's parameters.

ZeRO (Rajbhandari et al. SC'20, section 5.1) and DeepSpeed's stage 1 give each of ``d`` ranks an even slice of
the flattened parameters' optimizer state. torch's ``ZeroRedundancyOptimizer`` (the torch engine's ZeRO-1,
planner.export.sharding) gives whole tensors instead: it sorts a parameter group's tensors largest first and
hands each to the rank holding the fewest elements so far (torch/distributed/optim/zero_redundancy_optimizer.py,
``_partition_parameters``: greedy longest-processing-time). The rank that gets the most holds, and steps, more
than ``1/d`` of the state: measured on CPU, two ranks of a 4-layer MLP (one 1024 x 1024 weight per layer) held
1.24 and 1.10 of the even prediction; a stage of a Llama embedding (525M elements) and a few blocks over 16
ranks gives its first rank the whole embedding's Adam state, several GiB over an even share.

Pure: no torch, click or rich.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from planner import ir


def heaviest_share(counts: Sequence[float], ranks: int) -> float:
    """The most elements any of ``ranks`` gets when ``counts`` are dealt largest first, each to the rank
    holding the fewest so far (``ZeroRedundancyOptimizer``'s partition)."""
    loads = [0.0] * max(ranks, 1)
    for count in sorted(counts, reverse=True):
        heapq.heapreplace(loads, loads[0] + count)
    return max(loads)


def stage_tensors(profile: ir.ModelProfile, stage: ir.Stage) -> list[float] | None:
    """The elements of each trainable tensor ``stage`` holds per device (a tensor form's shard: 1/tp of its
    tensors); None where a layer with trainable parameters does not list its tensors (profiles before
    ``tensor_counts``)."""
    first, end = stage.layers
    out: list[float] = []
    for layer, form in zip(profile.layers[first:end], stage.forms, strict=True):
        if layer.trainable_params and not layer.tensor_counts:
            return None
        share = 1.0 if form == "dp" else stage.tp
        out += [count / share for count in layer.tensor_counts]
    return out


def heaviest_ratio(profile: ir.ModelProfile, stage: ir.Stage) -> float:
    """The optimizer state of the rank that gets the most of ``stage``'s tensors over an even share (1 where the
    stage is not ZeRO-1 over two or more ranks, or its tensors are not known)."""
    if stage.zero != 1 or stage.dp < 2:
        return 1.0
    tensors = stage_tensors(profile, stage)
    if not tensors:
        return 1.0
    return max(heaviest_share(tensors, stage.dp) / (sum(tensors) / stage.dp), 1.0)

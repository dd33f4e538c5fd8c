"""The fewest samples a model trains on at a time (``ModelProfile.min_batch``).

A pipeline runs each data-parallel rank on micro-batches, down to one sample, and some models refuse
small batches in training: a batch norm over ``(N, C)`` needs two samples (torch: "Expected more
than 1 value per channel when training"), a ``view(8, -1)`` all eight. :func:`smallest_batch` runs
the layers' forward (training mode, no gradients; on the meta device too, where analytic profiles
count) at batches 1, 2, 4, ... below the profile's and returns the first they take, so that search
never cuts the batch finer than that and ``planner run`` never meets the refusal in a worker.
Structural splits of transformers (``hfsplit``) take any batch and are not probed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from planner.profiler.layered import primary_output


def _takes(layers: Sequence[nn.Module], x: torch.Tensor) -> bool:
    """Whether the layers' forward runs on ``x`` (a refusal is any error torch or the model raises)."""
    try:
        with torch.no_grad():
            for layer in layers:
                x = primary_output(layer(x))
    except Exception:  # the model's own refusal, whatever its type: the batch is too small for it
        return False
    return True


def smallest_batch(layers: Sequence[nn.Module], x: torch.Tensor, method: str) -> int:
    """The smallest of 1, 2, 4, ... below ``x``'s batch that the layers take (else the whole batch);
    1 for a structural split (``method`` ``structure:...``). Batch norms' running statistics move as in
    the profile's other passes."""
    batch = int(x.shape[0])
    if method.startswith("structure"):
        return 1
    size = 1
    while size < batch:
        if _takes(layers, x[:size].clone()):  # a copy: an in-place first op must not write the example
            return size
        size *= 2
    return batch

"""A stage's output as another stage receives it: contiguous.

Both engines send a stage's output to the next stage through point-to-point collectives that need
contiguous tensors: torch pipelining allocates its receive buffer with the sender's strides (an LSTM's
``batch_first`` output, a transpose, a slice: "input tensor has to be contiguous" on the receiving
rank), and gloo's send refuses a non-contiguous tensor (DeepSpeed). Every stage that sends its output
makes it contiguous (a copy only where it was not).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def contiguous(value: Any) -> Any:
    """Tensors (alone, or in a tuple or list, nested) made contiguous; anything else as it is."""
    if isinstance(value, torch.Tensor):
        return value.contiguous()
    if isinstance(value, (tuple, list)):
        return type(value)(contiguous(v) for v in value)
    return value


def contiguous_output(module: nn.Module, args: tuple[Any, ...], out: Any) -> Any:
    """A forward hook: the module's output made :func:`contiguous`."""
    return contiguous(out)

"""A stage's output as another stage receives it: contiguous, and differentiable.

Both engines send a stage's output to the next stage through point-to-point collectives that need
contiguous tensors: torch pipelining allocates its receive buffer with the sender's strides (an LSTM's
``batch_first`` output, a transpose, a slice: "input tensor has to be contiguous" on the receiving
rank), and gloo's send refuses a non-contiguous tensor (DeepSpeed). Every stage that sends its output
makes it contiguous (a copy only where it was not).

A floating-point output that needs no gradient (a first stage whose weights are all frozen, on data that
needs none: fine-tuning with a frozen embedding) is sent as a leaf that does (:func:`differentiable`). The
receiving stage's backward then runs from its input: DeepSpeed's backward through the stage needs a tensor
that requires a gradient, and torch's zb-h1 (``ScheduleInterleavedZeroBubble``) computes a stage's weight
gradients from the paths between its inputs and its weights, so that a stage whose input needed none
computed none and never trained (fp32 losses 3e-4 from one process, as if its learning rate were 0).
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


def differentiable(value: Any) -> Any:
    """Floating-point tensors (alone, or in a tuple or list, nested) that need no gradient made leaves that do,
    while gradients are recorded; anything else as it is."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and not value.requires_grad and torch.is_grad_enabled():
            return value.detach().requires_grad_()
        return value
    if isinstance(value, (tuple, list)):
        return type(value)(differentiable(v) for v in value)
    return value


def sent_output(module: nn.Module, args: tuple[Any, ...], out: Any) -> Any:
    """A forward hook for a stage whose output another stage receives: :func:`contiguous` and
    :func:`differentiable`."""
    return differentiable(contiguous(out))

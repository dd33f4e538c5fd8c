"""The training losses both engines and ``planner run``'s reference use (mean over the batch)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from planner.errors import ExportError

LOSSES = ("cross_entropy", "mse")


def make_loss(name: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The loss: ``cross_entropy`` over the last dimension (classes or vocabulary), or ``mse``."""
    if name == "cross_entropy":
        return cross_entropy_loss
    if name == "mse":
        return mse_loss
    raise ExportError(f"unknown loss {name!r}", f"use one of {', '.join(LOSSES)}")


def cross_entropy_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy; a [B, T, V] output (a language model) is flattened over tokens."""
    if isinstance(output, (tuple, list)):
        output = output[0]
    return nn.functional.cross_entropy(output.reshape(-1, output.shape[-1]).float(), target.reshape(-1))


def mse_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if isinstance(output, (tuple, list)):
        output = output[0]
    return nn.functional.mse_loss(output.float(), target)

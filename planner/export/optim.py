"""The plan's optimizer as a torch class (the same class DeepSpeed's config selects) and its default rates."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from planner import ir
from planner.errors import ExportError

DEFAULT_LR = {"sgd": 0.01, "momentum": 0.01, "adam": 1e-3, "rmsprop": 1e-3}


def torch_optimizer(name: str, params: Iterable[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """``sgd``, ``momentum`` (SGD, 0.9), ``adam`` or ``rmsprop`` over ``params``."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "momentum":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=lr)
    raise ExportError(f"unknown optimizer {name!r}", f"use one of {', '.join(ir.OPTIMIZERS)}")

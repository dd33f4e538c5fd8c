"""The plan's optimizer as a torch class (the same class DeepSpeed's config selects) and its default rates."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from planner import ir
from planner.errors import ExportError

DEFAULT_LR = {"sgd": 0.01, "momentum": 0.01, "adam": 1e-3, "rmsprop": 1e-3}


def on_gpu(params: Iterable[nn.Parameter]) -> bool:
    """Whether there are parameters and every one is on a CUDA device."""
    devices = [p.device.type for p in params]
    return bool(devices) and all(d == "cuda" for d in devices)


def torch_optimizer(name: str, params: Iterable[nn.Parameter], lr: float,
                    fused: bool | None = None) -> torch.optim.Optimizer:
    """``sgd``, ``momentum`` (SGD, 0.9), ``adam`` or ``rmsprop`` over ``params``.

    Adam runs fused (one kernel per group of tensors, ``fused=True``) where ``fused``, by default where every
    parameter is on a GPU, as torchtitan's default runs it: torch's default there, the multi-tensor ``foreach``
    Adam, makes seven passes over the values, 72 bytes of memory traffic per fp32 value where the fused kernel
    makes 28, the cost model's count (``planner.costmodel.precision.OPTIMIZER_TRAFFIC``); on an H200 it took
    2.70 ms against 1.07 over GPT-2 small's parameters (``scripts/gpu_rates.py``, docs/fidelity.md)."""
    params = list(params)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "momentum":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "adam":
        use = on_gpu(params) if fused is None else fused
        return torch.optim.Adam(params, lr=lr, fused=True if use else None)  # None, not False: False loops per tensor
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=lr)
    raise ExportError(f"unknown optimizer {name!r}", f"use one of {', '.join(ir.OPTIMIZERS)}")

"""The plan's optimizer as a torch class (the same class DeepSpeed's config selects) and its default rates."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from planner import ir
from planner.errors import ExportError

DEFAULT_LR = {"sgd": 0.01, "momentum": 0.01, "adam": 1e-3, "rmsprop": 1e-3}


FUSED_ADAM_DEVICES = frozenset({"cpu", "cuda"})
"""Devices torch's fused Adam kernel (``fused=True``) runs on here: CUDA, and the CPU since torch 2.4."""


def fused_adam_runs(params: Iterable[nn.Parameter]) -> bool:
    """Whether there are parameters and every one is on a device torch's fused Adam runs on."""
    devices = [p.device.type for p in params]
    return bool(devices) and all(d in FUSED_ADAM_DEVICES for d in devices)


def torch_optimizer(name: str, params: Iterable[nn.Parameter], lr: float,
                    fused: bool | None = None) -> torch.optim.Optimizer:
    """``sgd``, ``momentum`` (SGD, 0.9), ``adam`` or ``rmsprop`` over ``params``.

    Adam runs fused (one kernel per group of tensors, ``fused=True``) where ``fused``, by default where every
    parameter is on a device the kernel runs on (:func:`fused_adam_runs`), as the cost model counts it: one pass,
    28 bytes of memory traffic per fp32 value (``planner.costmodel.precision.OPTIMIZER_TRAFFIC``) and no
    temporaries. torch's default on GPUs, the multi-tensor ``foreach`` Adam, makes seven passes, 72 bytes a
    value (on an H200 2.70 ms against 1.07 over GPT-2 small's parameters: ``scripts/gpu_rates.py``,
    docs/fidelity.md) and holds temporaries the size of every parameter; on the CPU its default loops tensor by
    tensor, 6x slower than the fused kernel over three 1024 x 1024 weights here, with two temporaries of the
    tensor it steps (a stage of two such weights peaked 8 MiB above the cost model's count)."""
    params = list(params)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "momentum":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "adam":
        use = fused_adam_runs(params) if fused is None else fused
        groups = [{"params": group} for group in _layout_groups(params)] if use else params
        return torch.optim.Adam(groups, lr=lr, fused=True if use else None)  # None, not False: False loops per tensor
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=lr)
    raise ExportError(f"unknown optimizer {name!r}", f"use one of {', '.join(ir.OPTIMIZERS)}")


def _layout_groups(params: list[nn.Parameter]) -> list[list[nn.Parameter]]:
    """``params`` grouped by layout: plain tensors, and DTensors by mesh and placements. One fused Adam kernel
    takes one group, and refuses plain tensors mixed with DTensors (a tensor-parallel stage's ``dp``-form
    layers beside its sharded ones: "got mixed torch.Tensor and DTensor")."""
    groups: dict[tuple[object, ...], list[nn.Parameter]] = {}
    for p in params:
        mesh, placements = getattr(p.data, "device_mesh", None), getattr(p.data, "placements", None)
        key = () if mesh is None else (id(mesh), tuple(placements or ()))
        groups.setdefault(key, []).append(p)
    return list(groups.values())

"""A profile's per-layer times: medians of the timed passes (measured), or the roofline or the flat formula (analytic).

:func:`measured_times` takes the medians of the passes :mod:`planner.profiler.passes` ran; :func:`analytic_times` times
the layers on a named GPU by the roofline (:mod:`planner.profiler.roofline`: fixed parts fitted through a quarter of
the batch, the part of each layer tensor parallelism without sequence parallelism runs whole on every rank, the loss),
else flat at an efficiency (:mod:`planner.profiler.analytic`). :func:`planner.profiler.core.profile_model` writes them
into the profile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from planner.gpus import roofline_of
from planner.profiler.analytic import ANALYTIC_EFFICIENCY, DEVICE_FLOPS_NAMES, analytic_time, flat_loss_s, gpu_format
from planner.profiler.layered import LayeredModel
from planner.profiler.measure import LayerFacts, median
from planner.profiler.passes import Runs, has_logits
from planner.profiler.roofline import loss_roofline, profile_roofline, roofline_meta

Fixed = list[tuple[float | None, float | None]]
"""Per layer (``forward_fixed_s``, ``backward_fixed_s``), None where unknown."""


@dataclass(frozen=True)
class LayerTimes:
    """Per-layer forward and backward seconds, their sum, the device FLOP/s and its source, the device's name;
    ``replicated``: per layer the (forward, backward) seconds tensor parallelism runs whole on every rank (the
    roofline's; empty where unknown: measured and flat profiles)."""

    fwd_s: list[float]
    bwd_s: list[float]
    layer_sum: float
    flops_value: float
    flops_label: str
    device_name: str
    replicated: tuple[tuple[float, float], ...] = ()

    def replicated_s(self, layer: int) -> tuple[float | None, float | None]:
        """Layer ``layer``'s (``forward_replicated_s``, ``backward_replicated_s``): None where unknown or nil."""
        if not self.replicated:
            return None, None
        fwd, bwd = self.replicated[layer]
        return (fwd or None), (bwd or None)


def measured_times(runs: Runs, facts: list[LayerFacts], flops_value: float | None, flops_label: str,
                   dev: torch.device) -> LayerTimes:
    """Medians of the timed passes; the FLOP/s achieved unless ``flops_value`` is given."""
    total_flops = sum(f.forward_flops + f.backward_flops for f in facts)
    fwd_s = [median(t) for t in runs.fwd_times]
    bwd_s = [median(t) for t in runs.bwd_times]
    layer_sum = sum(fwd_s) + sum(bwd_s)
    if flops_value is None:
        flops_value = max(total_flops / layer_sum, 1.0) if layer_sum > 0 else 1.0
        flops_label = "achieved"
    device_name = "cpu" if dev.type == "cpu" else (
        torch.cuda.get_device_name(dev) if dev.type == "cuda" else str(dev))
    return LayerTimes(fwd_s, bwd_s, layer_sum, flops_value, flops_label, device_name)


def analytic_times(lm: LayeredModel, x: torch.Tensor, facts: list[LayerFacts], device: tuple[float, str],
                   efficiency: float | None, dtype: str
                   ) -> tuple[LayerTimes, Fixed, dict[str, Any], tuple[float | None, float | None]]:
    """Per-layer times, fixed parts, meta and the loss's (seconds, fixed part): the roofline on a named GPU
    (planner.profiler.roofline), else FLOPs / (device FLOP/s x efficiency) (planner.profiler.analytic) with no
    fixed parts, the loss by its element-wise count."""
    flops_value, flops_label = device
    if efficiency is None and flops_label in DEVICE_FLOPS_NAMES:
        gpu, number_format = gpu_format(flops_label, dtype)
        roofline = roofline_of(gpu, number_format)
        prof = profile_roofline(lm.layers, x, roofline)
        fwd_s, bwd_s = prof.full.forward_s, prof.full.backward_s
        fixed = list(zip(prof.forward_fixed_s, prof.backward_fixed_s, strict=True))
        meta = roofline_meta(roofline, prof, gpu, number_format)
        loss = loss_roofline(facts[-1].output_shape, facts[-1].output_dtype, roofline)
        replicated = tuple(zip(prof.full.forward_replicated_s, prof.full.backward_replicated_s, strict=True))
    else:
        flat = ANALYTIC_EFFICIENCY if efficiency is None else efficiency
        fwd_s = [analytic_time(f.forward_flops, flops_value, flat) for f in facts]
        bwd_s = [analytic_time(f.backward_flops, flops_value, flat) for f in facts]
        fixed = [(None, None)] * len(facts)
        meta = {"efficiency": flat, "time_formula": "flops / (device_flops * efficiency)"}
        last = facts[-1]
        logits = has_logits(last.output_shape, last.output_dtype)
        loss = (flat_loss_s(math.prod(last.output_shape), flops_value, flat) if logits else None, None)
        replicated = ()
    times = LayerTimes(fwd_s, bwd_s, sum(fwd_s) + sum(bwd_s), flops_value, flops_label, flops_label, replicated)
    return times, fixed, meta, loss

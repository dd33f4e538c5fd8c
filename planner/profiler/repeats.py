"""Identical consecutive layers (a transformer's blocks) counted once in analytic profiles.

Llama-2-70B has 80 decoder blocks of the same structure and shapes; counting FLOPs and saved
bytes on the meta device costs the same dispatch work for each. Two layers are identical
when their module trees print the same (types and hyper-parameters: ``repr``) and their
parameters and buffers have the same names, shapes, dtypes and ``requires_grad``. In a run of
three or more identical consecutive layers, the first two are counted (the first may save a
tensor its predecessor already saved, the second is the steady state) and the rest take the
second's facts, provided the counted ones map their input shape to the same output shape
(checked after the pass, else every layer is counted). Tests check the facts equal a full pass.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from planner.profiler.measure import LayerFacts, instrumented_pass


def layer_signature(layer: nn.Module) -> tuple[object, ...]:
    """What makes two layers' FLOPs and bytes equal on equal inputs: structure, parameter and buffer shapes."""
    params = tuple((n, tuple(p.shape), p.dtype, p.requires_grad) for n, p in layer.named_parameters())
    buffers = tuple((n, tuple(b.shape), b.dtype) for n, b in layer.named_buffers())
    return repr(layer), params, buffers


def fact_sources(layers: Sequence[nn.Module]) -> list[int]:
    """For each layer, the layer whose facts it takes: itself, or the second of its run of identical layers."""
    sigs = [layer_signature(layer) for layer in layers]
    source = list(range(len(layers)))
    for i in range(2, len(layers)):
        if sigs[i] == sigs[i - 1] == sigs[i - 2]:
            source[i] = source[i - 1]
    return source


def instrumented_pass_once_per_kind(layers: Sequence[nn.Module], x: torch.Tensor,
                                    params: Sequence[torch.Tensor]) -> tuple[list[LayerFacts], int]:
    """``instrumented_pass`` counting each run of identical layers' first two only; (facts, layers counted)."""
    source = fact_sources(layers)
    counted = [i for i, s in enumerate(source) if s == i]
    if len(counted) == len(layers):
        return instrumented_pass(layers, x, params), len(layers)
    facts = dict(zip(counted, instrumented_pass([layers[i] for i in counted], x, params), strict=True))
    reused = {s for i, s in enumerate(source) if s != i}
    if any(facts[r].output_shape != facts[r - 1].output_shape for r in reused):
        return instrumented_pass(layers, x, params), len(layers)
    return [facts[s] for s in source], len(counted)

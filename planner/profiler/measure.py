"""Per-layer measurements: one instrumented pass (FLOPs, bytes) and timed passes.

Every pass runs the layers in order on one batch, each layer on a detached copy of the
previous layer's output (sharing its storage), then runs the backward layer by layer in
reverse, each layer's output gradient being the next layer's input gradient. So one pass
costs one forward+backward iteration of the whole model, and timing layers this way adds
only a synchronisation per layer (on CUDA) and a clock read.

- ``forward_s``/``backward_s``: median over ``repeats`` timed passes after ``warmup`` passes.
- ``saved_bytes``: what autograd keeps for backward, seen through
  ``torch.autograd.graph.saved_tensors_hooks``: each storage counted once over the whole
  pass (a tensor saved by two layers counts in the first), parameters excluded.
- ``output_bytes``: the real size of the layer's output tensor (numel x element size).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from planner.profiler.flops import flop_counter
from planner.profiler.layers import primary_output

Sync = Callable[[], None]


def make_sync(device: torch.device) -> Sync:
    if device.type == "cuda":
        return torch.cuda.synchronize
    return lambda: None


@dataclass(frozen=True)
class LayerFacts:
    forward_flops: float
    backward_flops: float
    output_bytes: int
    output_shape: tuple[int, ...]
    saved_bytes: int
    input_requires_grad: bool


def _storage_key(t: torch.Tensor) -> int:
    return int(t.untyped_storage()._cdata)


def _leaf(x: torch.Tensor, first: bool = False) -> torch.Tensor:
    """A detached copy (same storage) that collects the gradient; the model input needs none."""
    leaf = x.detach()
    if leaf.is_floating_point() and not (first and not x.requires_grad):
        leaf.requires_grad_(True)
    return leaf


def _call(layer: nn.Module, inp: torch.Tensor) -> torch.Tensor:
    try:
        return layer(inp)
    except RuntimeError as exc:
        # A layer that starts with an in-place op (ReLU(inplace=True)) cannot take a leaf.
        if "leaf Variable" in str(exc) and inp.requires_grad:
            return layer(inp.clone())
        raise


def _zero_grads(params: Sequence[torch.Tensor]) -> None:
    for p in params:
        p.grad = None


def instrumented_pass(layers: Sequence[nn.Module], x: torch.Tensor, params: Sequence[torch.Tensor],
                      count_flops: bool = True) -> list[LayerFacts]:
    """One forward+backward with FLOP counting and saved-tensor accounting (works on meta tensors)."""
    param_keys = {_storage_key(p) for p in params}
    seen: set[int] = set()
    saved = [0] * len(layers)
    current = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key not in param_keys and key not in seen:
            seen.add(key)
            saved[current[0]] += int(t.untyped_storage().nbytes())
        return t

    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    _zero_grads(params)
    fwd_flops: list[float] = []
    inputs: list[torch.Tensor] = []
    outputs: list[torch.Tensor] = []
    cur = x
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        for i, layer in enumerate(layers):
            current[0] = i
            inp = _leaf(cur, first=i == 0)
            counter = flop_counter()
            if count_flops:
                with counter:
                    out = primary_output(_call(layer, inp))
            else:
                out = primary_output(_call(layer, inp))
            fwd_flops.append(float(counter.get_total_flops()) if count_flops else 0.0)
            inputs.append(inp)
            outputs.append(out)
            cur = out
    bwd_flops = [0.0] * len(layers)
    grad: torch.Tensor | None = torch.ones_like(outputs[-1])
    for i in reversed(range(len(layers))):
        out = outputs[i]
        if grad is None or not out.requires_grad:
            grad = None
            continue
        counter = flop_counter()
        if count_flops:
            with counter:
                out.backward(grad)
        else:
            out.backward(grad)
        bwd_flops[i] = float(counter.get_total_flops()) if count_flops else 0.0
        grad = inputs[i].grad
    facts = [
        LayerFacts(fwd_flops[i], bwd_flops[i], outputs[i].numel() * outputs[i].element_size(),
                   tuple(outputs[i].shape), saved[i], inputs[i].requires_grad)
        for i in range(len(layers))
    ]
    _zero_grads(params)
    return facts


def timed_pass(layers: Sequence[nn.Module], x: torch.Tensor, params: Sequence[torch.Tensor],
               sync: Sync, clock: Callable[[], float] = time.perf_counter) -> tuple[list[float], list[float]]:
    """Forward and backward seconds of every layer in one forward+backward pass.

    ``clock`` is wall time by default; ``time.thread_time`` (CPU time) with one torch thread
    gives figures that other processes on a shared machine do not disturb.
    """
    _zero_grads(params)
    fwd: list[float] = []
    bwd = [0.0] * len(layers)
    inputs: list[torch.Tensor] = []
    outputs: list[torch.Tensor] = []
    cur = x
    sync()
    for i, layer in enumerate(layers):
        inp = _leaf(cur, first=i == 0)
        t0 = clock()
        out = primary_output(_call(layer, inp))
        sync()
        fwd.append(clock() - t0)
        inputs.append(inp)
        outputs.append(out)
        cur = out
    grad: torch.Tensor | None = torch.ones_like(outputs[-1])
    for i in reversed(range(len(layers))):
        out = outputs[i]
        if grad is None or not out.requires_grad:
            grad = None
            continue
        t0 = clock()
        out.backward(grad)
        sync()
        bwd[i] = clock() - t0
        grad = inputs[i].grad
    del inputs, outputs
    _zero_grads(params)
    return fwd, bwd


def whole_model_pass(module: nn.Module, x: torch.Tensor, params: Sequence[torch.Tensor], sync: Sync,
                     clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds of one forward+backward of the whole model (backward of ones, like the layer passes)."""
    _zero_grads(params)
    sync()
    t0 = clock()
    out = primary_output(module(x))
    out.backward(torch.ones_like(out))
    sync()
    dt = clock() - t0
    _zero_grads(params)
    return dt


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else 0.0

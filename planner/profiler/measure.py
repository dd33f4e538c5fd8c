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
from typing import TypeVar

import torch
from torch import nn

from planner.errors import ProfileError
from planner.profiler.flops import flop_counter
from planner.profiler.fused import FusedAttention
from planner.profiler.guards import check_output, is_out_of_memory
from planner.profiler.layered import primary_output

Sync = Callable[[], None]
_T = TypeVar("_T")


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
    output_dtype: torch.dtype = torch.float32
    output_requires_grad: bool = True
    attention_saved: bool = True
    """False when the layer's attention ran as SDPA's fused kernels and kept no attention weights."""


def _storage_key(t: torch.Tensor) -> int:
    return int(t.untyped_storage()._cdata)


def _leaf(x: torch.Tensor) -> torch.Tensor:
    """A detached copy (same storage) that collects the gradient where the whole model would compute it: not
    for the model's input, nor behind layers whose weights are all frozen (fine-tuning), which then run no
    backward at all, as autograd runs the whole model."""
    leaf = x.detach()
    if leaf.is_floating_point() and x.requires_grad:
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


class _SavedBytes:
    """Saved-tensor hooks that add each storage autograd keeps for backward to the layer
    running (``current``): each storage counted once over the pass, parameters excluded."""

    def __init__(self, params: Sequence[torch.Tensor], n_layers: int) -> None:
        self.param_keys = {_storage_key(p) for p in params}
        self.seen: set[int] = set()
        self.saved = [0] * n_layers
        self.current = 0

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key not in self.param_keys and key not in self.seen:
            self.seen.add(key)
            self.saved[self.current] += int(t.untyped_storage().nbytes())
        return t

    def unpack(self, t: torch.Tensor) -> torch.Tensor:
        return t


def _counted(run: Callable[[], _T], count_flops: bool) -> tuple[_T, float]:
    """``run()`` and the FLOPs it did (0 when not counting)."""
    counter = flop_counter()
    if not count_flops:
        return run(), 0.0
    with counter:
        result = run()
    return result, float(counter.get_total_flops())


def instrumented_pass(layers: Sequence[nn.Module], x: torch.Tensor, params: Sequence[torch.Tensor],
                      count_flops: bool = True) -> list[LayerFacts]:
    """One forward+backward with FLOP counting and saved-tensor accounting (works on meta tensors, where
    SDPA runs as the fused kernel runs it: :mod:`planner.profiler.fused`)."""
    saved = _SavedBytes(params, len(layers))
    attention = FusedAttention()
    fused = [False] * len(layers)
    _zero_grads(params)

    def fwd_meter(i: int, run: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, float]:
        saved.current = i
        calls, saving = attention.calls, attention.saving
        result = _counted(run, count_flops)
        fused[i] = attention.calls > calls and attention.saving == saving
        return result

    with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack), attention:
        fwd_flops, inputs, outputs = _forward_walk(layers, x, fwd_meter)
    bwd_flops = _backward_walk(inputs, outputs, lambda _i, run: _counted(run, count_flops))
    facts = [
        LayerFacts(fwd_flops[i], bwd_flops[i], outputs[i].numel() * outputs[i].element_size(),
                   tuple(outputs[i].shape), saved.saved[i], inputs[i].requires_grad, outputs[i].dtype,
                   outputs[i].requires_grad, not fused[i])
        for i in range(len(layers))
    ]
    _zero_grads(params)
    return facts


# A meter runs one layer's forward (or backward) and returns its result and a figure for it (FLOPs, seconds).
_Meter = Callable[[int, Callable[[], _T]], tuple[_T, float]]


def _forward_walk(layers: Sequence[nn.Module], x: torch.Tensor, meter: _Meter[torch.Tensor],
                  ) -> tuple[list[float], list[torch.Tensor], list[torch.Tensor]]:
    """The layers' forward in order, each on a leaf copy of the previous output: figures, inputs, outputs."""
    figures: list[float] = []
    inputs: list[torch.Tensor] = []
    outputs: list[torch.Tensor] = []
    cur = x
    for i, layer in enumerate(layers):
        inp = _leaf(cur)
        out, figure = meter(i, lambda: primary_output(_call(layer, inp)))  # noqa: B023 (called now)
        figures.append(figure)
        inputs.append(inp)
        outputs.append(out)
        cur = out
    return figures, inputs, outputs


def _backward_walk(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                   meter: _Meter[None]) -> list[float]:
    """The layers' backward in reverse, each fed the next layer's input gradient: figures per layer."""
    figures = [0.0] * len(outputs)
    grad: torch.Tensor | None = torch.ones_like(outputs[-1])
    for i in reversed(range(len(outputs))):
        out = outputs[i]
        if grad is None or not out.requires_grad:
            grad = None
            continue
        _, figures[i] = meter(i, lambda: out.backward(grad))  # noqa: B023 (called now)
        grad = inputs[i].grad
    return figures


def timed_pass(layers: Sequence[nn.Module], x: torch.Tensor, params: Sequence[torch.Tensor],
               sync: Sync, clock: Callable[[], float] = time.perf_counter) -> tuple[list[float], list[float]]:
    """Forward and backward seconds of every layer in one forward+backward pass.

    ``clock`` is wall time by default; ``time.thread_time`` (CPU time) with one torch thread
    gives figures that other processes on a shared machine do not disturb.
    """
    _zero_grads(params)

    def timed(_i: int, run: Callable[[], _T]) -> tuple[_T, float]:
        t0 = clock()
        result = run()
        sync()
        return result, clock() - t0

    sync()
    fwd, inputs, outputs = _forward_walk(layers, x, timed)
    bwd = _backward_walk(inputs, outputs, timed)
    del inputs, outputs
    _zero_grads(params)
    return fwd, bwd


def whole_model_pass(module: nn.Module, x: torch.Tensor, params: Sequence[torch.Tensor], sync: Sync,
                     clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds of one forward+backward of the whole model (backward of ones, like the layer passes)."""
    _zero_grads(params)
    sync()
    t0 = clock()
    try:
        out = primary_output(module(x))
        check_output(out.dtype, out.requires_grad, f"the output of the whole {type(module).__name__}")
        out.backward(torch.ones_like(out))
    except RuntimeError as exc:
        if is_out_of_memory(exc):
            raise
        raise _model_fails(module, exc) from None
    sync()
    dt = clock() - t0
    _zero_grads(params)
    return dt


def _model_fails(module: nn.Module, exc: RuntimeError) -> ProfileError:
    """The error for a model whose own forward+backward fails (not planner's split): torch's first line."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return ProfileError(f"the whole {type(module).__name__} fails its own forward+backward, as PyTorch trains it: "
                        f"{first[:300]}", "fix the model: it cannot train as it is (an in-place op such as "
                        "`x += f(x)` on a tensor autograd saved for backward: write `x = x + f(x)`)")


def speed_s(module: nn.Module, x: torch.Tensor, repeats: int = 5) -> float:
    """How fast this machine runs the model now: the median seconds of ``repeats`` whole-model
    forward+backward passes (:func:`whole_model_pass`, on the CPU) after one untimed pass. Taken
    beside a profile and beside timed runs, it says how far the machine's own speed moved between
    them (scripts/validate_fidelity.py; :func:`planner.calibrate_engines.time_plans`)."""
    params = [p for p in module.parameters() if p.requires_grad]
    times = [whole_model_pass(module, x, params, lambda: None) for _ in range(max(1, repeats) + 1)]
    return median(times[1:])


def fit_fixed(t_big: float, t_small: float, big: int, small: int) -> float:
    """The fixed part of ``t(b) = fixed + b * per_sample`` through two measurements.

    ``(big * t_small - small * t_big) / (big - small)``, clamped to ``[0, t_big]`` (noise can
    push a straight line through two points below 0 or above the whole time).
    """
    if big <= small:
        raise ValueError(f"need two batch sizes big > small, got {big} and {small}")
    fixed = (big * t_small - small * t_big) / (big - small)
    return min(max(fixed, 0.0), max(t_big, 0.0))


def small_batch_of(batch: int) -> int | None:
    """The smaller batch the fixed-cost fit measures at: a quarter of the batch (None below 2);
    always one of :func:`curve_batches_of`."""
    return max(1, batch // 4) if batch >= 2 else None


def curve_batches_of(batch: int) -> tuple[int, ...]:
    """The smaller batches measured mode times every layer at too, largest first: a half, a quarter,
    an eighth and a sixteenth of the batch, those of at least one sample (none below 2); a plan's
    micro-batch is read off the line through them (:mod:`planner.costmodel.batch`)."""
    return tuple(sorted({batch >> k for k in range(1, 5) if batch >> k >= 1}, reverse=True))


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else 0.0

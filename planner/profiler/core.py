"""``profile_model``: a loaded model -> a ModelProfile (measured on this machine, or analytic).

Measured mode times every layer's forward and backward on the model's device (``warmup``
passes, then the median of ``repeats``); ``device_flops`` defaults to the FLOP/s achieved
there. The timed passes at the whole batch alternate with as many at a half, a quarter, an
eighth and a sixteenth of it (:func:`curve_batches_of`; :mod:`planner.profiler.passes` says in
which order, and why), each layer's medians there kept as its ``batch_times``
(:mod:`planner.costmodel.batch` reads a micro-batch's time off them); every layer's
``forward_fixed_s``/``backward_fixed_s`` are fitted through the whole batch and the quarter
(:func:`small_batch_of`, :func:`fit_fixed`; None where the batch is 1 or the layers refuse a
smaller batch). It also times ``whole_repeats`` whole-model iterations
(``meta.whole_model_fwd_bwd_s``) and a cross-entropy loss on the last layer's output at the
whole batch and the quarter (``loss_s``, ``loss_fixed_s``). At the defaults (batch 16 or more):
1 instrumented pass (the warm-up: FLOPs, saved and output bytes), 4 timed passes at each of the
5 batch sizes (3 repeats, rounded up to even), the untimed settling passes between sizes, 1
whole-model pass, and a warm-up at each smaller batch.

Analytic mode (load the model on ``device="meta"``: no memory, no compute) times a named
GPU's kernels by the roofline (``planner.profiler.roofline``; default device: the RTX 2080Ti)
and fits each layer's fixed part through the roofline at a quarter of the batch, and the
cross-entropy loss the same way (``loss_s``, ``loss_fixed_s``); with an
``efficiency`` or a FLOP/s number it computes FLOPs / (``device_flops`` x ``efficiency``,
default 0.5), leaves the fixed parts None and counts the loss's element-wise work
(``planner.profiler.analytic.LOSS_FLOPS_PER_LOGIT``).

A measured profile on the CPU first fixes glibc's malloc thresholds in this process
(:func:`planner.heap.keep_freed_memory`: freed tensors reused, as a GPU's caching allocator and ``planner run``'s
workers do; ``meta.freed_memory_kept``).

Both modes record the fewest samples the model trains on at a time (``min_batch``, :mod:`planner.profiler.minbatch`)
and refuse what cannot be trained or written (:mod:`planner.profiler.guards`): no parameter requiring grad, an output
not a floating-point tensor requiring grad, a value beyond the profile schema's bounds (naming ``--set`` overrides).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from typing import Any, Literal

import torch

from planner.cores import check_threads
from planner.errors import ProfileError, UsageError
from planner.heap import keep_freed_memory
from planner.ir import BatchTimes, BlockShape, LayerProfile, ModelProfile
from planner.profiler.analytic import (
    check_flat_rate,
    resolve_device_flops,
)
from planner.profiler.experts import routed_evenly
from planner.profiler.flops import FLOP_COUNTER
from planner.profiler.guards import (
    check_loadable,
    check_output,
    check_trainable,
    is_out_of_memory,
    out_of_memory,
    with_overrides,
)
from planner.profiler.idle import on_idle_cpu
from planner.profiler.layered import LayeredModel, batch_stats, rejects_input, tensor_counts, trainable_counts
from planner.profiler.layers import split_model
from planner.profiler.loader import LoadedModel, dtype_name
from planner.profiler.measure import (
    LayerFacts,
    curve_batches_of,
    fit_fixed,
    instrumented_pass,
    make_sync,
    median,
    small_batch_of,
)
from planner.profiler.minbatch import smallest_batch
from planner.profiler.passes import NO_RUNS, Passes, Runs, measure_passes
from planner.profiler.repeats import instrumented_pass_once_per_kind
from planner.profiler.timing import LayerTimes, analytic_times, measured_times

Progress = Callable[[int, int, str], None]
"""progress(done, total, what): called as profiling advances."""

DEFAULT_REPEATS = 3
DEFAULT_WARMUP = 1
MAX_PASSES = 1000
"""The most ``repeats`` and ``warmup`` passes a profile makes per layer and batch size: at 1000 a GPT-2 takes about
20 minutes (``--repeats 10**23`` profiled until it was killed)."""


def check_passes(repeats: int, warmup: int) -> None:
    """UsageError unless ``1 <= repeats`` and ``0 <= warmup``, both at most :data:`MAX_PASSES`."""
    if not 1 <= repeats <= MAX_PASSES or not 0 <= warmup <= MAX_PASSES:
        raise UsageError(f"--repeats must be 1 to {MAX_PASSES} and --warmup 0 to {MAX_PASSES}, got {repeats} and "
                         f"{warmup}", f"e.g. --repeats {DEFAULT_REPEATS} --warmup {DEFAULT_WARMUP}")


@contextmanager
def _threads(n: int | None) -> Any:
    if n is None:
        yield
        return
    check_threads(n, "1 to time as planner calibrate's default devices compute")
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _weight_share(facts_fwd: float, facts_bwd: float, params: int, input_grad: bool) -> float:
    """Share of a layer's backward that computes weight gradients (zero-bubble schedules' W)."""
    if params == 0 or facts_bwd <= 0:
        return 0.0 if params == 0 else 0.5
    if not input_grad:
        return 1.0
    return max(0.0, min(1.0, (facts_bwd - facts_fwd) / facts_bwd))


def profile_model(loaded: LoadedModel, *, mode: Literal["measured", "analytic"] | str = "measured",
                  device: str | None = None, dtype: str | torch.dtype | None = None, threads: int | None = None,
                  repeats: int = DEFAULT_REPEATS, warmup: int = DEFAULT_WARMUP, device_flops: str | float | None = None,
                  efficiency: float | None = None, progress: Progress | None = None,
                  layered: LayeredModel | None = None, whole_repeats: int = 1) -> ModelProfile:
    """Profile ``loaded`` layer by layer: ``mode="measured"`` times every layer here,
    ``mode="analytic"`` counts on the meta device and times a named GPU's kernels by the roofline
    (or flat at ``efficiency``). The passes each mode makes are in the module doc. ``device`` /
    ``dtype`` move or cast the model if given; ``layered`` reuses a split already made.
    """
    _check_options(mode, repeats, warmup, efficiency)
    module, x, params, dtype_label, flops = _prepared(loaded, mode, device, dtype, device_flops, efficiency)
    heap = {"freed_memory_kept": keep_freed_memory()} if mode == "measured" and x.device.type == "cpu" else {}
    start = time.perf_counter()
    small = small_batch_of(int(x.shape[0])) if mode == "measured" else None
    passes = Passes(warmup, repeats, whole_repeats, curve_batches_of(int(x.shape[0])) if mode == "measured" else ())
    with _threads(threads), routed_evenly(module):  # a mixture of experts counted evenly routed (meta only)
        try:
            lm, facts, counted, runs, quiet = _walk(module, x, params, loaded.name, mode, layered, passes, progress)
        except ProfileError as exc:
            raise with_overrides(exc, loaded.overrides) from None
        elapsed = time.perf_counter() - start
        if mode == "measured":
            times = measured_times(runs, facts, flops[0], flops[1], x.device)
            fixed = _fixed_costs(times, runs, int(x.shape[0]), small, len(facts))
            extra = _measured_meta(times, runs, x.device, warmup, repeats, elapsed,
                                   small if small in runs.smaller else None)
            loss = runs.loss
        else:
            if flops[0] is None:  # pragma: no cover - analytic mode always has a default device
                raise UsageError("analytic mode needs a device's FLOP/s", "pass --device-flops")
            times, fixed, extra, loss = analytic_times(lm, x, facts, (flops[0], flops[1]), efficiency, dtype_label)
    meta = {**_meta(lm, times, threads, time.perf_counter() - start, loaded.overrides),
            "instrumented_layers": counted, **extra, **quiet, **heap}
    prof = ModelProfile(
        model=loaded.name, batch_size=int(x.shape[0]), dtype=dtype_label, mode=mode,
        device=times.device_name if mode == "analytic" else ("cpu" if x.device.type == "cpu" else str(x.device.type)),
        device_flops=float(times.flops_value), layers=_layer_profiles(lm, facts, times, fixed, runs),
        input_shape=tuple(x.shape[1:]), input_bytes=x.numel() * x.element_size(),
        ties=lm.ties, meta=meta, loss_s=loss[0], loss_fixed_s=loss[1],
        min_batch=smallest_batch(lm.layers, x, lm.method),
    )
    check_loadable(prof)
    return prof


def _prepared(loaded: LoadedModel, mode: str, device: str | None, dtype: str | torch.dtype | None,
              device_flops: str | float | None, efficiency: float | None
              ) -> tuple[torch.nn.Module, torch.Tensor, list[torch.Tensor], str, Any]:
    """The model placed and cast, its input, its parameters (trainable ones required), its dtype's name and the
    device's FLOP/s (resolved, and checked against ``efficiency`` in analytic mode)."""
    module, x = _placed(loaded, device, dtype)
    if mode == "measured" and x.device.type == "meta":
        raise UsageError("measured mode needs a real device, the model is on 'meta'", "use --mode analytic")
    params = list(module.parameters())
    check_trainable(params, loaded.name)
    dtype_label = dtype_name(_profile_dtype(x, params))
    flops = resolve_device_flops(device_flops, default="rtx2080ti" if mode == "analytic" else None, dtype=dtype_label)
    if mode == "analytic":
        check_flat_rate(flops[0], efficiency)
    return module, x, params, dtype_label, flops


def _walk(module: torch.nn.Module, x: torch.Tensor, params: list[torch.Tensor], name: str, mode: str,
          layered: LayeredModel | None, passes: Passes, progress: Progress | None) -> tuple[Any, Any, Any, Any, Any]:
    """Split the model (or reuse ``layered``), count each layer's FLOPs and bytes, and in measured mode
    time the passes (on a CPU, on an idle machine: :mod:`planner.profiler.idle`); returns (layered model, per-layer
    facts, instrumented layer count, runs, the meta of what the timed passes ran beside)."""
    measured = mode == "measured"
    tick = _Ticker(progress, (passes.count if measured else 1) + 1)
    tick.start("tracing")
    lm = layered if layered is not None else split_model(module, x)
    tick("traced")
    facts, counted = _instrumented(lm, x, params, name)
    check_output(facts[-1].output_dtype, facts[-1].output_requires_grad,
                 f"{name}'s output (its last layer {lm.names[-1]!r})", facts[-1].output_shape)
    tick("counted FLOPs and bytes")
    if not measured:
        return lm, facts, counted, NO_RUNS, {}
    if x.device.type != "cpu":
        return lm, facts, counted, _timed_runs(lm, module, x, params, facts, passes, tick, name), {}

    counted_at = tick.done

    def timed() -> Runs:
        tick.done = counted_at  # an attempt timed again counts its passes again
        return _timed_runs(lm, module, x, params, facts, passes, tick, name)

    runs, quiet = on_idle_cpu(timed)
    return lm, facts, counted, runs, quiet.meta()


def _timed_runs(lm: LayeredModel, module: torch.nn.Module, x: torch.Tensor, params: list[torch.Tensor],
                facts: list[LayerFacts], passes: Passes, tick: _Ticker, name: str) -> Runs:
    """Measured mode's timed passes; a ProfileError when they run out of memory."""
    try:
        return measure_passes(lm.layers, module, x, params, make_sync(x.device), facts[-1].output_shape, passes,
                              tick)
    except (RuntimeError, MemoryError) as exc:
        if not is_out_of_memory(exc):
            raise
        raise out_of_memory(f"timing {name} at batch {x.shape[0]}", x.device, exc) from None


def _check_options(mode: str, repeats: int, warmup: int, efficiency: float | None) -> None:
    if mode not in ("measured", "analytic"):
        raise UsageError(f"unknown mode {mode!r}", "use --mode measured or --mode analytic")
    check_passes(repeats, warmup)
    if efficiency is not None and not 0 < efficiency <= 1:
        raise UsageError(f"efficiency must be in (0, 1], got {efficiency}", "e.g. 0.5")


def _placed(loaded: LoadedModel, device: str | None,
            dtype: str | torch.dtype | None) -> tuple[torch.nn.Module, torch.Tensor]:
    """The model and its example input, moved to ``device`` and cast to ``dtype`` if given."""
    module, x = loaded.module, loaded.example_input
    if device is not None and torch.device(device) != x.device:
        module, x = module.to(device), x.to(device)
    if dtype is not None:
        from planner.profiler.loader import parse_dtype

        tdtype = parse_dtype(dtype)
        module = module.to(dtype=tdtype)
        if x.is_floating_point():
            x = x.to(tdtype)
    return module, x


def _param_dtype(params: list[torch.Tensor]) -> torch.dtype:
    return next(iter(params)).dtype if params else torch.float32


def _profile_dtype(x: torch.Tensor, params: list[torch.Tensor]) -> torch.dtype:
    """The profile's dtype: the input's if it is floating point (else the weights')."""
    return x.dtype if x.is_floating_point() else _param_dtype(params)


class _Ticker:
    """Counts finished passes and reports them to ``progress`` (if any) out of ``total``."""

    def __init__(self, progress: Progress | None, total: int) -> None:
        self.progress = progress
        self.total = total
        self.done = 0

    def start(self, what: str) -> None:
        if self.progress is not None:
            self.progress(0, self.total, what)

    def __call__(self, what: str) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.total, what)


def _instrumented(lm: LayeredModel, x: torch.Tensor, params: list[torch.Tensor], name: str
                  ) -> tuple[list[LayerFacts], int]:
    """The instrumented pass (FLOPs, bytes) and how many layers it ran; on the meta device identical
    consecutive layers run once (``planner.profiler.repeats``). A ProfileError when it runs out of
    memory or the layers refuse x."""
    try:
        if x.device.type == "meta":
            return instrumented_pass_once_per_kind(lm.layers, x, params)
        return instrumented_pass(lm.layers, x, params), len(lm)
    except ProfileError:
        raise
    except (RuntimeError, ValueError, IndexError, TypeError, MemoryError) as exc:
        if is_out_of_memory(exc):
            raise out_of_memory(f"running {name} at batch {x.shape[0]}", x.device, exc) from None
        raise rejects_input(x, exc) from None


def _fixed_costs(times: LayerTimes, runs: Runs, batch: int, small: int | None,
                 n: int) -> list[tuple[float | None, float | None]]:
    """Per layer (forward_fixed_s, backward_fixed_s) fitted through the whole and the small batch, or Nones."""
    small_times = runs.medians_at(small) if small is not None else None
    if small_times is None or small is None:
        return [(None, None)] * n
    return [(fit_fixed(times.fwd_s[i], small_times[0][i], batch, small),
             fit_fixed(times.bwd_s[i], small_times[1][i], batch, small)) for i in range(n)]


def _layer_profiles(lm: LayeredModel, facts: list[LayerFacts], times: LayerTimes,
                    fixed: list[tuple[float | None, float | None]], runs: Runs) -> tuple[LayerProfile, ...]:
    layers, trainable = [], trainable_counts(lm.layers, lm.param_counts)
    tensors = tensor_counts(lm.layers, lm.param_counts, trainable)
    for i, f in enumerate(facts):
        trains = trainable[i]
        share = _weight_share(f.forward_flops, f.backward_flops, lm.param_counts[i] if trains is None else trains,
                              f.input_requires_grad)
        replicated = times.replicated_s(i) if lm.block(i) is not None else (None, None)
        layers.append(LayerProfile(
            name=lm.names[i], type=lm.types[i], forward_s=times.fwd_s[i], backward_s=times.bwd_s[i],
            forward_flops=f.forward_flops, backward_flops=f.backward_flops,
            param_count=lm.param_counts[i], param_bytes=lm.param_bytes[i],
            output_bytes=f.output_bytes, saved_bytes=f.saved_bytes,
            in_features=lm.in_features[i], out_features=lm.out_features[i],
            backward_weight_s=times.bwd_s[i] * share, output_shape=f.output_shape,
            forward_fixed_s=fixed[i][0], backward_fixed_s=fixed[i][1], block=_block(lm.block(i), facts[i]),
            forward_replicated_s=replicated[0], backward_replicated_s=replicated[1],
            batch_times=tuple(BatchTimes(b, fwd[i], bwd[i]) for b, (fwd, bwd) in zip(runs.smaller, runs.smaller_times,
                                                                                    strict=True)),
            trainable_count=trainable[i], batch_stats=batch_stats(lm.layers[i]), tensor_counts=tensors[i],
        ))
    return tuple(layers)


def _meta(lm: LayeredModel, times: LayerTimes, threads: int | None, elapsed: float,
          overrides: Mapping[str, Any]) -> dict[str, Any]:
    """How the profile was made; ``overrides``: a zoo transformer's ``--set`` fields, kept so that
    ``planner run`` and the exported programs build the model that was profiled."""
    return {
        "tool": "planner profile",
        "torch_version": torch.__version__,
        "split_method": lm.method,
        "flop_counter": FLOP_COUNTER,
        "device_flops_source": times.flops_label,
        "threads": torch.get_num_threads() if threads is None else threads,
        "profiling_s": elapsed,
        **({"overrides": dict(overrides)} if overrides else {}),
    }


def _measured_meta(times: LayerTimes, runs: Runs, dev: torch.device, warmup: int, repeats: int, elapsed: float,
                   fit_batch: int | None) -> dict[str, Any]:
    whole_s = median(runs.whole) if runs.whole else None
    return {
        "device_name": times.device_name,
        "warmup": warmup,
        "repeats": repeats,
        "timing": "median of repeats; per-layer passes; CUDA synchronised" if dev.type == "cuda"
        else "median of repeats; per-layer passes",
        "whole_model_fwd_bwd_s": whole_s,
        "sum_layers_fwd_bwd_s": times.layer_sum,
        "profiling_cost_iterations": elapsed / whole_s if whole_s else None,
        "fixed_cost_fit_batch": fit_batch,
    }


def _block(shape: BlockShape | None, facts: LayerFacts) -> BlockShape | None:
    """A block's shape, saying whether its saved bytes hold the attention weights (planner.profiler.fused)."""
    if shape is None or facts.attention_saved:
        return shape
    return dataclasses.replace(shape, attention_saved=False)

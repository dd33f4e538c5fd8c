"""``profile_model``: a loaded model -> a ModelProfile (measured on this machine, or analytic)."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any, Literal

import torch

from planner.errors import ProfileError, UsageError
from planner.ir import LayerProfile, ModelProfile, Tie
from planner.profiler.analytic import ANALYTIC_EFFICIENCY, analytic_time, resolve_device_flops
from planner.profiler.flops import FLOP_COUNTER
from planner.profiler.layers import LayeredModel, _rejects, split_model
from planner.profiler.loader import LoadedModel, dtype_name
from planner.profiler.measure import instrumented_pass, make_sync, median, timed_pass, whole_model_pass

Progress = Callable[[int, int, str], None]
"""progress(done, total, what): called as profiling advances."""

DEFAULT_REPEATS = 3
DEFAULT_WARMUP = 1


@contextmanager
def _threads(n: int | None) -> Any:
    if n is None:
        yield
        return
    if n < 1:
        raise UsageError(f"--threads must be 1 or more, got {n}", "e.g. --threads 1")
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
    """The smaller batch the fixed-cost fit measures at: a quarter of the batch (None below 2)."""
    return max(1, batch // 4) if batch >= 2 else None


def _small_pass_times(lm: LayeredModel, x: torch.Tensor, params: list[torch.Tensor], sync: Any, small: int,
                      repeats: int, tick: Callable[[str], None]) -> tuple[list[float], list[float]] | None:
    """Median per-layer times at batch ``small``, or None if the layers refuse it.

    No warm-up pass (the passes at the whole batch warmed the layers up): the median of
    ``repeats`` passes (3 by default) drops a first pass slowed by new-shape set-up."""
    xs = x[:small]
    fwd: list[list[float]] = [[] for _ in range(len(lm))]
    bwd: list[list[float]] = [[] for _ in range(len(lm))]
    try:
        for _ in range(repeats):
            fw, bw = timed_pass(lm.layers, xs, params, sync)
            for i in range(len(lm)):
                fwd[i].append(fw[i])
                bwd[i].append(bw[i])
            tick("timing layers at a small batch")
    except (RuntimeError, ValueError, IndexError, TypeError):  # a traced shape fixed to the batch
        return None
    return [median(t) for t in fwd], [median(t) for t in bwd]


def loss_time(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, sync: Any, repeats: int) -> float:
    """Median seconds of a cross-entropy forward+backward over the last dimension of ``shape``
    (the training loss the runner and the exported scripts use on the last stage's output)."""
    logits = torch.randn(shape, dtype=dtype, device=device, requires_grad=True)
    target = torch.randint(0, shape[-1], shape[:-1], device=device)
    times = []
    for _ in range(repeats + 1):
        sync()
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, shape[-1]).float(), target.reshape(-1))
        loss.backward()
        sync()
        times.append(time.perf_counter() - t0)
        logits.grad = None
    return median(times[1:])


def _loss_fit(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, sync: Any, repeats: int,
              small: int | None) -> tuple[float | None, float | None]:
    """(loss_s, loss_fixed_s) for an output of ``shape``; (None, None) when it is no float logits."""
    if len(shape) < 2 or not dtype.is_floating_point or shape[-1] < 2:
        return None, None
    whole = loss_time(shape, dtype, device, sync, repeats)
    if not small:
        return whole, None
    part = loss_time((small, *shape[1:]), dtype, device, sync, repeats)
    return whole, fit_fixed(whole, part, shape[0], small)


def profile_model(
    loaded: LoadedModel,
    *,
    mode: Literal["measured", "analytic"] | str = "measured",
    device: str | None = None,
    dtype: str | torch.dtype | None = None,
    threads: int | None = None,
    repeats: int = DEFAULT_REPEATS,
    warmup: int = DEFAULT_WARMUP,
    device_flops: str | float | None = None,
    efficiency: float = ANALYTIC_EFFICIENCY,
    progress: Progress | None = None,
    layered: LayeredModel | None = None,
    whole_repeats: int = 1,
) -> ModelProfile:
    """Profile ``loaded`` layer by layer.

    ``mode="measured"`` times every layer's forward and backward on the model's device
    (``warmup`` passes, then the median of ``repeats``); ``device_flops`` defaults to the
    FLOP/s achieved there. ``mode="analytic"`` computes times as FLOPs / (``device_flops``
    x ``efficiency``) (default device: the RTX 2080Ti); load the model on ``device="meta"``
    to make it without memory or compute. ``device``/``dtype`` only move/cast the model if
    given. ``layered`` reuses a split already made. Measured mode also times ``whole_repeats``
    whole-model iterations (``meta.whole_model_fwd_bwd_s``). At the defaults that is 1
    instrumented pass (the warm-up: FLOPs, saved and output bytes), 3 timed passes and 1
    whole-model pass: 5 forward+backward iterations of the model in all. Measured mode
    also times ``repeats`` passes at a quarter of the batch (:func:`small_batch_of`;
    each costs about a quarter of an iteration plus the per-call costs) and fits every
    layer's ``forward_fixed_s``/``backward_fixed_s`` (:func:`fit_fixed`; None where the
    batch is 1 or the layers refuse a smaller batch); analytic mode leaves them None. It
    also times a cross-entropy loss on the last layer's output at both sizes (``loss_s``,
    ``loss_fixed_s``; a few milliseconds).
    """
    if mode not in ("measured", "analytic"):
        raise UsageError(f"unknown mode {mode!r}", "use --mode measured or --mode analytic")
    if repeats < 1 or warmup < 0:
        raise UsageError(f"--repeats must be 1 or more (got {repeats})", "e.g. --repeats 3")
    if not 0 < efficiency <= 1:
        raise UsageError(f"efficiency must be in (0, 1], got {efficiency}", "e.g. 0.5")
    module, x = loaded.module, loaded.example_input
    if device is not None and torch.device(device) != x.device:
        module, x = module.to(device), x.to(device)
    if dtype is not None:
        from planner.profiler.loader import parse_dtype

        tdtype = parse_dtype(dtype)
        module = module.to(dtype=tdtype)
        if x.is_floating_point():
            x = x.to(tdtype)
    dev = x.device
    on_meta = dev.type == "meta"
    if mode == "measured" and on_meta:
        raise UsageError("measured mode needs a real device, the model is on 'meta'", "use --mode analytic")
    flops_value, flops_label = resolve_device_flops(device_flops, default="rtx2080ti" if mode == "analytic" else None)
    params = list(module.parameters())
    sync = make_sync(dev)
    start = time.perf_counter()
    small = small_batch_of(int(x.shape[0])) if mode == "measured" else None
    passes = (max(warmup, 1) + repeats + whole_repeats + (repeats if small else 0)) if mode == "measured" else 1
    done = 0

    def tick(what: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, passes + 1, what)

    with _threads(threads):
        if progress is not None:
            progress(0, passes + 1, "tracing")
        lm = layered if layered is not None else split_model(module, x)
        tick("traced")
        try:
            facts = instrumented_pass(lm.layers, x, params)
        except ProfileError:
            raise
        except (RuntimeError, ValueError, IndexError, TypeError) as exc:
            if "out of memory" in str(exc).lower():
                raise ProfileError(f"out of memory running {loaded.name} at batch {x.shape[0]} on {dev}",
                                   "use a smaller --batch-size, or --mode analytic (no memory needed)") from None
            raise _rejects(x, exc) from None
        tick("counted FLOPs and bytes")
        n = len(lm)
        fwd_times: list[list[float]] = [[] for _ in range(n)]
        bwd_times: list[list[float]] = [[] for _ in range(n)]
        whole: list[float] = []
        if mode == "measured":
            for _ in range(max(0, warmup - 1)):
                timed_pass(lm.layers, x, params, sync)
                tick("warm-up")
            for _ in range(repeats):
                fw, bw = timed_pass(lm.layers, x, params, sync)
                for i in range(n):
                    fwd_times[i].append(fw[i])
                    bwd_times[i].append(bw[i])
                tick("timing layers")
            for _ in range(whole_repeats):
                whole.append(whole_model_pass(module, x, params, sync))
                tick("timing the whole model")
            small_times = _small_pass_times(lm, x, params, sync, small, repeats, tick) if small else None
            loss = _loss_fit(facts[-1].output_shape, next(iter(params)).dtype if params else torch.float32, dev,
                             sync, repeats, small if small_times is not None else None)
    elapsed = time.perf_counter() - start

    total_flops = sum(f.forward_flops + f.backward_flops for f in facts)
    if mode == "measured":
        fwd_s = [median(t) for t in fwd_times]
        bwd_s = [median(t) for t in bwd_times]
        layer_sum = sum(fwd_s) + sum(bwd_s)
        if flops_value is None:
            flops_value = max(total_flops / layer_sum, 1.0) if layer_sum > 0 else 1.0
            flops_label = "achieved"
        device_name = "cpu" if dev.type == "cpu" else (
            torch.cuda.get_device_name(dev) if dev.type == "cuda" else str(dev))
    else:
        assert flops_value is not None
        fwd_s = [analytic_time(f.forward_flops, flops_value, efficiency) for f in facts]
        bwd_s = [analytic_time(f.backward_flops, flops_value, efficiency) for f in facts]
        layer_sum = sum(fwd_s) + sum(bwd_s)
        device_name = flops_label
        small_times, loss = None, (None, None)
    assert flops_value is not None
    batch = int(x.shape[0])
    fixed: list[tuple[float | None, float | None]] = [(None, None)] * len(facts)
    if small_times is not None and small is not None:
        fixed = [(fit_fixed(fwd_s[i], small_times[0][i], batch, small),
                  fit_fixed(bwd_s[i], small_times[1][i], batch, small)) for i in range(len(facts))]

    layers = []
    for i, f in enumerate(facts):
        share = _weight_share(f.forward_flops, f.backward_flops, lm.param_counts[i], f.input_requires_grad)
        layers.append(LayerProfile(
            name=lm.names[i], type=lm.types[i], forward_s=fwd_s[i], backward_s=bwd_s[i],
            forward_flops=f.forward_flops, backward_flops=f.backward_flops,
            param_count=lm.param_counts[i], param_bytes=lm.param_bytes[i],
            output_bytes=f.output_bytes, saved_bytes=f.saved_bytes,
            in_features=lm.in_features[i], out_features=lm.out_features[i],
            backward_weight_s=bwd_s[i] * share, output_shape=f.output_shape,
            forward_fixed_s=fixed[i][0], backward_fixed_s=fixed[i][1],
        ))
    ties = tuple(Tie(t.name, t.layers, t.param_count, t.param_bytes) for t in lm.ties)
    whole_s = median(whole) if whole else None
    meta: dict[str, Any] = {
        "tool": "planner profile",
        "torch_version": torch.__version__,
        "split_method": lm.method,
        "flop_counter": FLOP_COUNTER,
        "device_flops_source": flops_label,
        "threads": torch.get_num_threads() if threads is None else threads,
        "profiling_s": elapsed,
    }
    if mode == "measured":
        meta.update({
            "device_name": device_name,
            "warmup": warmup,
            "repeats": repeats,
            "timing": "median of repeats; per-layer passes; CUDA synchronised" if dev.type == "cuda"
            else "median of repeats; per-layer passes",
            "whole_model_fwd_bwd_s": whole_s,
            "sum_layers_fwd_bwd_s": layer_sum,
            "profiling_cost_iterations": elapsed / whole_s if whole_s else None,
            "fixed_cost_fit_batch": small if small_times is not None else None,
        })
    else:
        meta.update({"efficiency": efficiency, "time_formula": "flops / (device_flops * efficiency)"})
    return ModelProfile(
        model=loaded.name, batch_size=int(x.shape[0]), dtype=dtype_name(x.dtype if x.is_floating_point()
                                                                         else next(iter(params)).dtype
                                                                         if params else torch.float32),
        mode=mode, device=device_name if mode == "analytic" else ("cpu" if dev.type == "cpu" else str(dev.type)),
        device_flops=float(flops_value), layers=tuple(layers), input_shape=tuple(x.shape[1:]),
        input_bytes=x.numel() * x.element_size(), ties=ties, meta=meta, loss_s=loss[0], loss_fixed_s=loss[1],
    )

"""The timed passes of measured mode, in the order that keeps a drifting machine out of the fit.

Owns :func:`measure_passes`: after the warm-up, the timed passes at the whole batch and at the
fixed-cost fit's small batch (:func:`planner.profiler.measure.small_batch_of`) alternate in
the order big, small, small, big, big, small, ..., and the loss is timed the same way. The
fixed part of ``t(b) = fixed + b * per_sample`` through two batch sizes ``B > s`` is
``(B t_s - s t_B) / (B - s)`` (:func:`planner.profiler.measure.fit_fixed`): at ``s = B/4`` an
error ``e`` in ``t_s`` alone moves it by ``4e/3``, and every micro-batch of a plan pays it. When
the passes at the two sizes ran one after the other, a machine whose speed changed between
them (a shared VM: 5-10% within a minute, measured on this project's 2-core machine) moved
``t_s`` but not ``t_B``: six GPT-2 profiles in a row fitted whole-model fixed parts of
5.4-12.7 ms, which, at 8 micro-batches, moved a 0.32 s step's prediction by up to 18%. Alternating
the sizes makes both medians sample the same moments, so a drift moves both alike and the
fit keeps only what the batch size changes; the mirrored order (ABBA, counterbalancing)
puts both sizes' median passes at the same moment under a steady drift when ``repeats`` is
even (Box, Hunter and Hunter, *Statistics for Experimenters*, 2nd ed., ch. 3 on paired and
blocked comparisons).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from planner.profiler.measure import Sync, fit_fixed, median, timed_pass, whole_model_pass

Tick = Callable[[str], None]
"""Called after each pass with what it was."""
Clock = Callable[[], float]
"""Seconds now (wall time by default)."""


@dataclass(frozen=True)
class Passes:
    """How many passes of each kind measured mode times (``small``: the fixed-cost fit's batch)."""

    warmup: int
    repeats: int
    whole_repeats: int
    small: int | None

    @property
    def count(self) -> int:
        """Every pass :func:`measure_passes` makes at most, the small batch's warm-up included."""
        small = self.repeats + 1 if self.small else 0
        return max(self.warmup, 1) + self.repeats + self.whole_repeats + small


@dataclass(frozen=True)
class Runs:
    """What the timed passes measured: per layer the forward and backward times of each
    repeat, the whole-model times, the small-batch medians (or None), and the loss fit."""

    fwd_times: list[list[float]]
    bwd_times: list[list[float]]
    whole: list[float]
    small_times: tuple[list[float], list[float]] | None
    loss: tuple[float | None, float | None]


NO_RUNS = Runs([], [], [], None, (None, None))


class _Series:
    """Per layer, the forward and backward seconds of every timed pass at one batch size."""

    def __init__(self, n: int) -> None:
        self.fwd: list[list[float]] = [[] for _ in range(n)]
        self.bwd: list[list[float]] = [[] for _ in range(n)]

    def add(self, times: tuple[list[float], list[float]]) -> None:
        for i, (f, b) in enumerate(zip(*times, strict=True)):
            self.fwd[i].append(f)
            self.bwd[i].append(b)

    def medians(self) -> tuple[list[float], list[float]]:
        return [median(t) for t in self.fwd], [median(t) for t in self.bwd]


def _takes_small(layers: Sequence[nn.Module], xs: torch.Tensor, params: Sequence[torch.Tensor], sync: Sync) -> bool:
    """One untimed pass at the small batch (its warm-up: new shapes); False if the layers refuse it."""
    try:
        timed_pass(layers, xs, params, sync)
    except (RuntimeError, ValueError, IndexError, TypeError):  # a traced shape fixed to the batch
        return False
    return True


def _alternated(layers: Sequence[nn.Module], x: torch.Tensor, xs: torch.Tensor | None, params: Sequence[torch.Tensor],
                sync: Sync, repeats: int, tick: Tick, clock: Clock) -> tuple[_Series, _Series]:
    """``repeats`` timed passes at each size, in the order big, small, small, big, big, ... (module doc)."""
    big, small = _Series(len(layers)), _Series(len(layers))
    for k in range(repeats):
        order = ((big, x), (small, xs)) if k % 2 == 0 else ((small, xs), (big, x))
        for series, batch in order:
            if batch is not None:
                series.add(timed_pass(layers, batch, params, sync, clock))
                tick("timing layers" if series is big else "timing layers at a small batch")
    return big, small


def measure_passes(layers: Sequence[nn.Module], module: nn.Module, x: torch.Tensor, params: Sequence[torch.Tensor],
                   sync: Sync, out_shape: tuple[int, ...], passes: Passes, tick: Tick,
                   clock: Clock = time.perf_counter) -> Runs:
    """Warm-up, then ``repeats`` timed passes at the whole batch alternating with as many at the
    small batch (module doc), the whole-model passes and the loss fit."""
    for _ in range(max(0, passes.warmup - 1)):
        timed_pass(layers, x, params, sync, clock)
        tick("warm-up")
    xs = x[:passes.small] if passes.small else None
    if xs is not None:
        tick("warm-up at a small batch")
        if not _takes_small(layers, xs, params, sync):
            xs = None
    big, small = _alternated(layers, x, xs, params, sync, passes.repeats, tick, clock)
    whole = []
    for _ in range(passes.whole_repeats):
        whole.append(whole_model_pass(module, x, params, sync, clock))
        tick("timing the whole model")
    dtype = next(iter(params)).dtype if params else torch.float32
    loss = loss_fit(out_shape, dtype, x.device, sync, passes.repeats, passes.small if xs is not None else None, clock)
    return Runs(big.fwd, big.bwd, whole, small.medians() if xs is not None else None, loss)


def loss_times(shapes: Sequence[tuple[int, ...]], dtype: torch.dtype, device: torch.device, sync: Sync,
               repeats: int, clock: Clock = time.perf_counter) -> list[float]:
    """Median seconds of a cross-entropy forward+backward over the last dimension of each of
    ``shapes`` (the training loss the runner and the exported scripts use on the last stage's
    output), the shapes timed in turn, after one untimed round."""
    cases = []
    for shape in shapes:
        logits = torch.randn(shape, dtype=dtype, device=device, requires_grad=True)
        cases.append((logits, torch.randint(0, shape[-1], shape[:-1], device=device)))
    times: list[list[float]] = [[] for _ in shapes]
    for r in range(repeats + 1):
        for k, (logits, target) in (enumerate(cases) if r % 2 == 0 else reversed(list(enumerate(cases)))):
            sync()
            t0 = clock()
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1))
            loss.backward()
            sync()
            times[k].append(clock() - t0)
            logits.grad = None
    return [median(t[1:]) for t in times]


def loss_fit(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, sync: Sync, repeats: int,
             small: int | None, clock: Clock = time.perf_counter) -> tuple[float | None, float | None]:
    """(loss_s, loss_fixed_s) for an output of ``shape``; (None, None) when it is no float logits."""
    if len(shape) < 2 or not dtype.is_floating_point or shape[-1] < 2:
        return None, None
    if not small:
        return loss_times([shape], dtype, device, sync, repeats, clock)[0], None
    whole, part = loss_times([shape, (small, *shape[1:])], dtype, device, sync, repeats, clock)
    return whole, fit_fixed(whole, part, shape[0], small)

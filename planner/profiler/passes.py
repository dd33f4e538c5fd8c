"""The timed passes of measured mode, in the order that keeps a drifting machine out of the fit.

Owns :func:`pass_order` and :func:`measure_passes`: after the warm-up, the timed passes at the
whole batch and at the fixed-cost fit's small batch (:func:`planner.profiler.measure.small_batch_of`)
alternate in the mirrored order big, small, small, big, big, small, ..., each pass that follows
one at the other size preceded by an untimed one at its own; the loss is timed the same way.

Why alternate. The fixed part of ``t(b) = fixed + b * per_sample`` through two batch sizes
``B > s`` is ``(B t_s - s t_B) / (B - s)`` (:func:`planner.profiler.measure.fit_fixed`): at
``s = B/4`` an error ``e`` in ``t_s`` alone moves it by ``4e/3``, and every micro-batch of a
plan pays it. When the passes at the two sizes ran one after the other, a machine whose speed
changed between them (a shared VM: 5-10% within a minute, measured on this project's 2-core
machine) moved ``t_s`` but not ``t_B``: six GPT-2 profiles in a row fitted whole-model fixed
parts of 5.4-12.7 ms, which, at 8 micro-batches, moved a 0.32 s step's prediction by up to 18%.
Alternating the sizes makes both medians sample the same moments, so a drift moves both alike.

Why settle. A pass right after one at the other size runs slower than one after its own size:
on this project's 2-core machine, 1 thread, a quarter-batch pass after a whole-batch one took
2-7% longer (the CNN of ``scripts/validate_fidelity.py`` 39.4 against 38.3 ms over 30 pairs;
29.4 against 27.4 ms over 36 in another series), which put the fixed part, and every 1-process
CNN prediction at 4 micro-batches, 5-15% high. So no pass is timed right after a switch.

Why an even number of cycles. With the settling passes, the two sizes' timed passes sit
symmetrically in time only over whole mirrored pairs of cycles (ABBA, counterbalancing: Box,
Hunter and Hunter, *Statistics for Experimenters*, 2nd ed., ch. 3 on paired and blocked
comparisons): at an odd count their medians lie two passes apart and a steady drift moves the
fit by up to 16% at 3 repeats. An odd ``repeats`` therefore times one more pass at each size.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import nn

from planner.export.losses import cross_entropy_loss
from planner.profiler.measure import Sync, fit_fixed, median, small_batch_of, timed_pass, whole_model_pass

Tick = Callable[[str], None]
"""Called after each pass with what it was."""
Clock = Callable[[], float]
"""Seconds now (wall time by default)."""
_T = TypeVar("_T")
Times = tuple[list[float], list[float]]
"""Per layer, forward and backward seconds."""


@dataclass(frozen=True)
class Pass:
    """One pass at batch ``size`` (0: the whole batch, ``i``: the ``i``-th smaller one), timed or settling."""

    size: int
    timed: bool


def pass_order(repeats: int, sizes: int = 2) -> tuple[Pass, ...]:
    """The passes at ``sizes`` batch sizes after their warm-ups, which end at the smallest (module
    doc): ``repeats`` rounded up to even mirrored cycles (0, 1, ..., then ..., 1, 0), one timed pass
    of each size per cycle, an untimed one before each timed pass that follows another size."""
    order: list[Pass] = []
    last = sizes - 1
    for cycle in range(repeats + repeats % 2):
        for size in (range(sizes) if cycle % 2 == 0 else reversed(range(sizes))):
            if size != last:
                order.append(Pass(size, timed=False))
            order.append(Pass(size, timed=True))
            last = size
    return tuple(order)


def run_in_order(order: Sequence[Pass], run: Callable[[Pass], _T], sizes: int) -> list[list[_T]]:
    """``run(one)`` for every pass of ``order``; per size, the timed passes' results."""
    got: list[list[_T]] = [[] for _ in range(sizes)]
    for one in order:
        result = run(one)
        if one.timed:
            got[one.size].append(result)
    return got


@dataclass(frozen=True)
class Passes:
    """How many passes of each kind measured mode times; ``smaller``: the batches timed besides the
    whole one, largest first (:func:`planner.profiler.measure.curve_batches_of`)."""

    warmup: int
    repeats: int
    whole_repeats: int
    smaller: tuple[int, ...] = ()

    @property
    def count(self) -> int:
        """Every pass :func:`measure_passes` makes at most, the smaller batches' warm-ups included."""
        sizes = 1 + len(self.smaller)
        timed = len(pass_order(self.repeats, sizes)) + len(self.smaller) if self.smaller else self.repeats
        return max(self.warmup, 1) + timed + self.whole_repeats


@dataclass(frozen=True)
class Runs:
    """What the timed passes measured: per layer the forward and backward times of each repeat at
    the whole batch, the whole-model times, per smaller batch measured (``smaller``, largest
    first) the layers' medians, and the loss fit."""

    fwd_times: list[list[float]]
    bwd_times: list[list[float]]
    whole: list[float]
    smaller: tuple[int, ...]
    smaller_times: tuple[Times, ...]
    loss: tuple[float | None, float | None]

    def medians_at(self, batch: int) -> Times | None:
        """The layers' medians at smaller batch ``batch``, None if it was not measured."""
        return self.smaller_times[self.smaller.index(batch)] if batch in self.smaller else None


NO_RUNS = Runs([], [], [], (), (), (None, None))


def _per_layer(n: int, passes: Sequence[Times]) -> tuple[list[list[float]], list[list[float]]]:
    """Per layer, the forward and backward seconds of every pass."""
    return [[f[i] for f, _ in passes] for i in range(n)], [[b[i] for _, b in passes] for i in range(n)]


def _medians(n: int, passes: Sequence[Times]) -> Times:
    fwd, bwd = _per_layer(n, passes)
    return [median(t) for t in fwd], [median(t) for t in bwd]


def _warmed(layers: Sequence[nn.Module], x: torch.Tensor, smaller: Sequence[int], params: Sequence[torch.Tensor],
            sync: Sync, tick: Tick) -> tuple[int, ...]:
    """One untimed pass at each smaller batch, largest first (their warm-up: new shapes); the batches
    before the first the layers refuse (none for a traced shape fixed to the batch; a half and a quarter
    where a batch norm over ``(N, C)`` refuses one sample)."""
    for i, batch in enumerate(smaller):
        tick("warm-up at a smaller batch")
        try:
            timed_pass(layers, x[:batch], params, sync)
        except (RuntimeError, ValueError, IndexError, TypeError):
            return tuple(smaller[:i])
    return tuple(smaller)


def _timed(layers: Sequence[nn.Module], x: torch.Tensor, smaller: Sequence[int], params: Sequence[torch.Tensor],
           sync: Sync, repeats: int, tick: Tick, clock: Clock) -> list[list[Times]]:
    """Per batch size (the whole one first, then ``smaller``), the layers' times of every timed pass
    in :func:`pass_order`; ``repeats`` at the whole batch alone when there is no smaller one."""
    batches = [x, *(x[:b] for b in smaller)]
    order = pass_order(repeats, len(batches)) if smaller else (Pass(0, True),) * repeats

    def run(one: Pass) -> Times:
        times = timed_pass(layers, batches[one.size], params, sync, clock)
        size = " at a smaller batch" if one.size else ""
        tick(f"timing layers{size}" if one.timed else f"settling{size}")
        return times

    return run_in_order(order, run, len(batches))


def measure_passes(layers: Sequence[nn.Module], module: nn.Module, x: torch.Tensor, params: Sequence[torch.Tensor],
                   sync: Sync, out_shape: tuple[int, ...], passes: Passes, tick: Tick,
                   clock: Clock = time.perf_counter) -> Runs:
    """Warm-up, then the timed passes at the whole batch and at each smaller one, as many each, in
    :func:`pass_order`, the whole-model passes and the loss fit (through the whole batch and
    :func:`planner.profiler.measure.small_batch_of`'s, when it was measured)."""
    for _ in range(max(0, passes.warmup - 1)):
        timed_pass(layers, x, params, sync, clock)
        tick("warm-up")
    smaller = _warmed(layers, x, passes.smaller, params, sync, tick)
    got = _timed(layers, x, smaller, params, sync, passes.repeats, tick, clock)
    whole = []
    for _ in range(passes.whole_repeats):
        whole.append(whole_model_pass(module, x, params, sync, clock))
        tick("timing the whole model")
    dtype = next(iter(params)).dtype if params else torch.float32
    fit = small_batch_of(int(x.shape[0]))
    loss = loss_fit(out_shape, dtype, x.device, sync, passes.repeats, fit if fit in smaller else None, clock)
    fwd, bwd = _per_layer(len(layers), got[0])
    return Runs(fwd, bwd, whole, smaller, tuple(_medians(len(layers), g) for g in got[1:]), loss)


def loss_times(shape: tuple[int, ...], small: int | None, dtype: torch.dtype, device: torch.device, sync: Sync,
               repeats: int, clock: Clock = time.perf_counter) -> list[float]:
    """Median seconds of a cross-entropy forward+backward over the last dimension of an output of
    ``shape`` (planner.export.losses.cross_entropy_loss: the training loss the runner and the exported
    scripts use on the last stage's output) and, given ``small``, of the same at that many samples: one
    untimed pass at each size, then the sizes in :func:`pass_order` (module doc)."""
    cases = []
    for rows in (shape[0], small or 0):
        logits = torch.randn((rows, *shape[1:]), dtype=dtype, device=device, requires_grad=True)
        cases.append((logits, torch.randint(0, shape[-1], (rows, *shape[1:-1]), device=device)))

    def run(one: Pass) -> float:
        logits, target = cases[one.size]
        sync()
        t0 = clock()
        cross_entropy_loss(logits, target).backward()
        sync()
        logits.grad = None
        return clock() - t0

    if not small:
        return [median(run_in_order((Pass(0, False),) + (Pass(0, True),) * repeats, run, 1)[0])]
    whole, part = run_in_order((Pass(0, False), Pass(1, False), *pass_order(repeats)), run, 2)
    return [median(whole), median(part)]


def has_logits(shape: Sequence[int], dtype: torch.dtype) -> bool:
    """Whether an output of ``shape`` and ``dtype`` takes the profiled loss: float, with a class dimension."""
    return len(shape) >= 2 and dtype.is_floating_point and shape[-1] >= 2


def loss_fit(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, sync: Sync, repeats: int,
             small: int | None, clock: Clock = time.perf_counter) -> tuple[float | None, float | None]:
    """(loss_s, loss_fixed_s) for an output of ``shape``; (None, None) when it is no float logits."""
    if not has_logits(shape, dtype):
        return None, None
    if not small:
        return loss_times(shape, None, dtype, device, sync, repeats, clock)[0], None
    whole, part = loss_times(shape, small, dtype, device, sync, repeats, clock)
    return whole, fit_fixed(whole, part, shape[0], small)

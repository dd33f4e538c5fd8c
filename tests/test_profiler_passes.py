"""planner.profiler.passes: the timed passes' order, and a fixed-cost fit that a drifting machine does not move."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from planner.profiler.measure import fit_fixed, median, timed_pass
from planner.profiler.passes import Passes, loss_times, measure_passes


class FakeMachine:
    """A clock whose layers advance it by ``(fixed + b * per_sample)`` seconds, times a speed factor
    that grows linearly with the seconds already spent (a machine slowing down steadily)."""

    def __init__(self, drift_per_s: float) -> None:
        self.now = 0.0
        self.drift_per_s = drift_per_s
        self.batches: list[int] = []

    def clock(self) -> float:
        return self.now

    def spend(self, fixed_s: float, per_sample_s: float, batch: int) -> None:
        self.now += (fixed_s + per_sample_s * batch) * (1.0 + self.drift_per_s * self.now)


class _Spend(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, layer: FakeLayer) -> torch.Tensor:  # type: ignore[override]
        ctx.layer, ctx.batch = layer, x.shape[0]
        layer.machine.spend(layer.fixed_s, layer.per_sample_s, x.shape[0])
        layer.machine.batches.append(x.shape[0])
        return x * 1.0

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        ctx.layer.machine.spend(2 * ctx.layer.fixed_s, 2 * ctx.layer.per_sample_s, ctx.batch)
        return grad, None


class FakeLayer(nn.Module):
    def __init__(self, machine: FakeMachine, fixed_s: float, per_sample_s: float) -> None:
        super().__init__()
        self.machine, self.fixed_s, self.per_sample_s = machine, fixed_s, per_sample_s
        self.w = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Spend.apply(x, self) * self.w  # type: ignore[no-any-return]


def _measure(machine: FakeMachine, repeats: int, batch: int = 16) -> Any:
    layers = [FakeLayer(machine, 0.002, 0.001), FakeLayer(machine, 0.0, 0.003)]
    model = nn.Sequential(*layers)
    x = torch.randn(batch, 4)
    passes = Passes(warmup=1, repeats=repeats, whole_repeats=1, small=batch // 4)
    return measure_passes(layers, model, x, list(model.parameters()), lambda: None, (batch, 4), passes,
                          lambda _: None, machine.clock)


def test_the_two_batch_sizes_alternate_in_mirrored_order() -> None:
    machine = FakeMachine(0.0)
    _measure(machine, repeats=4)
    per_pass = machine.batches[::2]  # two layers per pass: the first layer's batch says the pass's
    # the small batch's untimed warm-up, then big, small | small, big | big, small | small, big, then the whole model
    assert per_pass == [4, 16, 4, 4, 16, 16, 4, 4, 16, 16]


def test_without_drift_the_fit_recovers_each_layers_fixed_part() -> None:
    runs = _measure(FakeMachine(0.0), repeats=3)
    fwd_big = [sorted(t)[1] for t in runs.fwd_times]
    fwd_small, _ = runs.small_times
    assert fit_fixed(fwd_big[0], fwd_small[0], 16, 4) == pytest.approx(0.002)
    assert fit_fixed(fwd_big[1], fwd_small[1], 16, 4) == pytest.approx(0.0, abs=1e-12)


def _sequential_fixed(machine: FakeMachine, repeats: int) -> float:
    """The first layer's forward fixed part fitted the old way: every pass at the whole batch, then
    every pass at the small batch."""
    layers = [FakeLayer(machine, 0.002, 0.001), FakeLayer(machine, 0.0, 0.003)]
    params = [p for layer in layers for p in layer.parameters()]
    x = torch.randn(16, 4)
    big = [timed_pass(layers, x, params, lambda: None, machine.clock)[0][0] for _ in range(repeats)]
    small = [timed_pass(layers, x[:4], params, lambda: None, machine.clock)[0][0] for _ in range(repeats)]
    return fit_fixed(median(big), median(small), 16, 4)


def _alternated_fixed(machine: FakeMachine, repeats: int) -> tuple[float, float]:
    """The first layer's forward fixed part, and the machine's speed factor at the big passes' median."""
    runs = _measure(machine, repeats)
    big = median(runs.fwd_times[0])
    return fit_fixed(big, runs.small_times[0][0], 16, 4), big / (0.002 + 0.001 * 16)


@settings(max_examples=30, deadline=None)
@given(drift=st.floats(0.02, 0.3), repeats=st.sampled_from([3, 4, 6, 9, 10, 25]))
def test_a_steady_drift_moves_the_fit_far_less_than_timing_the_sizes_in_turn(drift: float, repeats: int) -> None:
    """The machine slows steadily by ``drift`` (2% to 30%) of its speed over the profile (a shared
    VM drifted 5-10% within a minute). The fixed part is 2 ms at the speed of the big passes'
    median; the order of the sizes keeps it there (an odd ``repeats`` leaves a pass's drift)."""
    still = FakeMachine(0.0)
    _measure(still, repeats)
    per_s = drift / still.now
    alternated, speed = _alternated_fixed(FakeMachine(per_s), repeats)
    sequential = _sequential_fixed(FakeMachine(per_s), repeats)
    assert alternated / speed == pytest.approx(0.002, rel=0.1)
    assert abs(alternated / speed - 0.002) < abs(sequential - 0.002) / 3


def test_a_batch_the_layers_refuse_leaves_no_fit() -> None:
    class FixedBatch(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.shape[0] != 8:
                raise RuntimeError("shape '[8, 4]' is invalid for input of size 8")
            return x * 2

    layer = FixedBatch()
    ticks: list[str] = []
    runs = measure_passes([layer], layer, torch.randn(8, 4, requires_grad=True), [], lambda: None, (8, 4),
                          Passes(1, 2, 1, 2), ticks.append)
    assert runs.small_times is None
    assert runs.loss[1] is None and runs.loss[0] is not None
    assert "timing layers at a small batch" not in ticks and ticks.count("timing layers") == 2


def test_passes_counts_every_pass_the_progress_bar_shows() -> None:
    assert Passes(1, 3, 1, 4).count == 1 + 3 + 1 + 4
    assert Passes(0, 3, 1, None).count == 1 + 3 + 1


def test_loss_times_one_median_per_shape_in_order() -> None:
    ticks = iter(range(1000))
    times = loss_times([(8, 10), (2, 10)], torch.float32, torch.device("cpu"), lambda: None, 3,
                       lambda: float(next(ticks)))
    assert times == [1.0, 1.0]  # every call advances the fake clock by one between its two reads

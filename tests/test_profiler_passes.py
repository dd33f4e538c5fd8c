"""planner.profiler.passes: the timed passes' order, and a fixed-cost fit that a drifting machine does not move."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from planner.profiler.measure import curve_batches_of, fit_fixed, median, timed_pass
from planner.profiler.passes import Pass, Passes, loss_times, measure_passes, pass_order


class FakeMachine:
    """A clock whose layers advance it by ``(fixed + b * per_sample)`` seconds, times a speed factor
    that grows linearly with the seconds already spent (a machine slowing down steadily), and
    times ``1 + switch`` in a pass whose batch differs from the pass before's."""

    def __init__(self, drift_per_s: float, switch: float = 0.0) -> None:
        self.now = 0.0
        self.drift_per_s = drift_per_s
        self.switch = switch
        self.batches: list[int] = []
        self.slowed = False

    def clock(self) -> float:
        return self.now

    def start_pass(self, batch: int) -> None:
        self.slowed = bool(self.batches) and self.batches[-1] != batch
        self.batches.append(batch)

    def spend(self, fixed_s: float, per_sample_s: float, batch: int) -> None:
        slowed = 1.0 + (self.switch if self.slowed else 0.0)
        self.now += (fixed_s + per_sample_s * batch) * (1.0 + self.drift_per_s * self.now) * slowed


class _Spend(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, layer: FakeLayer) -> torch.Tensor:  # type: ignore[override]
        ctx.layer, ctx.batch = layer, x.shape[0]
        if layer.first:
            layer.machine.start_pass(x.shape[0])
        layer.machine.spend(layer.fixed_s, layer.per_sample_s, x.shape[0])
        return x * 1.0

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        ctx.layer.machine.spend(2 * ctx.layer.fixed_s, 2 * ctx.layer.per_sample_s, ctx.batch)
        return grad, None


class FakeLayer(nn.Module):
    def __init__(self, machine: FakeMachine, fixed_s: float, per_sample_s: float, first: bool = False) -> None:
        super().__init__()
        self.machine, self.fixed_s, self.per_sample_s, self.first = machine, fixed_s, per_sample_s, first
        self.w = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Spend.apply(x, self) * self.w  # type: ignore[no-any-return]


def _layers(machine: FakeMachine) -> list[FakeLayer]:
    return [FakeLayer(machine, 0.002, 0.001, first=True), FakeLayer(machine, 0.0, 0.003)]


def _measure(machine: FakeMachine, repeats: int, batch: int = 16, ticks: list[str] | None = None) -> Any:
    layers = _layers(machine)
    model = nn.Sequential(*layers)
    x = torch.randn(batch, 4)
    passes = Passes(warmup=1, repeats=repeats, whole_repeats=1, smaller=curve_batches_of(batch))
    return measure_passes(layers, model, x, list(model.parameters()), lambda: None, (batch, 4), passes,
                          (ticks if ticks is not None else []).append, machine.clock)


def _text(order: tuple[Pass, ...]) -> str:
    return " ".join(f"{p.size}{'' if p.timed else '~'}" for p in order)


def test_pass_order_mirrors_whole_cycles_and_times_no_pass_right_after_a_switch() -> None:
    # after the warm-ups (ending at the smallest batch): 0, 1 | 1, 0 | ..., "~" an untimed settling pass
    assert _text(pass_order(2)) == "0~ 0 1~ 1 1 0~ 0"
    assert _text(pass_order(3)) == _text(pass_order(4)) == "0~ 0 1~ 1 1 0~ 0 0 1~ 1 1 0~ 0"
    assert _text(pass_order(1, sizes=3)) == "0~ 0 1~ 1 2~ 2 2 1~ 1 0~ 0"


@given(repeats=st.integers(1, 40), sizes=st.integers(2, 6))
def test_pass_order_times_each_size_alike_and_never_right_after_another(repeats: int, sizes: int) -> None:
    order = pass_order(repeats, sizes)
    timed = [i for i, p in enumerate(order) if p.timed]
    at = [[i for i in timed if order[i].size == k] for k in range(sizes)]
    assert all(len(one) == repeats + repeats % 2 for one in at)
    assert len({median(one) for one in at}) == 1  # a steady drift moves every size's median alike
    before = [sizes - 1, *(p.size for p in order)]
    assert all(before[i] == order[i].size for i in timed)


def test_the_passes_run_warm_ups_then_pass_order_then_the_whole_model() -> None:
    machine = FakeMachine(0.0)
    _measure(machine, repeats=2)
    batches = (16, 8, 4, 2, 1)
    assert machine.batches == [8, 4, 2, 1, *(batches[p.size] for p in pass_order(2, 5)), 16]


def test_without_drift_every_smaller_batch_and_the_fit_are_the_machines() -> None:
    runs = _measure(FakeMachine(0.0), repeats=3)
    assert runs.smaller == (8, 4, 2, 1)
    for b, (fwd, bwd) in zip(runs.smaller, runs.smaller_times, strict=True):
        assert fwd == pytest.approx([0.002 + 0.001 * b, 0.003 * b])
        assert bwd[1] == pytest.approx(2 * 0.003 * b)  # the first layer's input needs no gradient
    fwd_big = [median(t) for t in runs.fwd_times]
    fwd_small, _ = runs.medians_at(4)
    assert fit_fixed(fwd_big[0], fwd_small[0], 16, 4) == pytest.approx(0.002)
    assert fit_fixed(fwd_big[1], fwd_small[1], 16, 4) == pytest.approx(0.0, abs=1e-12)
    assert runs.medians_at(3) is None


@settings(max_examples=20, deadline=None)
@given(switch=st.floats(0.02, 0.1), repeats=st.sampled_from([3, 4, 9]))
def test_a_pass_slowed_by_the_switch_of_size_moves_no_time(switch: float, repeats: int) -> None:
    """A pass right after one at another size runs ``switch`` (2-10%) slower (module doc): the
    settling passes keep it out of every timed pass, so every time is the still machine's."""
    runs = _measure(FakeMachine(0.0, switch), repeats)
    assert [median(t) for t in runs.fwd_times] == pytest.approx([0.018, 0.048])
    for b, (fwd, _) in zip(runs.smaller, runs.smaller_times, strict=True):
        assert fwd == pytest.approx([0.002 + 0.001 * b, 0.003 * b])


def _sequential_fixed(machine: FakeMachine, repeats: int) -> float:
    """The first layer's forward fixed part fitted the old way: every pass at the whole batch, then
    every pass at the small batch."""
    layers = _layers(machine)
    params = [p for layer in layers for p in layer.parameters()]
    x = torch.randn(16, 4)
    big = [timed_pass(layers, x, params, lambda: None, machine.clock)[0][0] for _ in range(repeats)]
    small = [timed_pass(layers, x[:4], params, lambda: None, machine.clock)[0][0] for _ in range(repeats)]
    return fit_fixed(median(big), median(small), 16, 4)


def _alternated_fixed(machine: FakeMachine, repeats: int) -> tuple[float, float]:
    """The first layer's forward fixed part, and the machine's speed factor at the big passes' median."""
    runs = _measure(machine, repeats)
    big = median(runs.fwd_times[0])
    return fit_fixed(big, runs.medians_at(4)[0][0], 16, 4), big / (0.002 + 0.001 * 16)


@settings(max_examples=30, deadline=None)
@given(drift=st.floats(0.02, 0.3), repeats=st.sampled_from([3, 4, 6, 9, 10, 25]))
def test_a_steady_drift_moves_the_fit_far_less_than_timing_the_sizes_in_turn(drift: float, repeats: int) -> None:
    """The machine slows steadily by ``drift`` (2% to 30%) of its speed over the profile (a shared
    VM drifted 5-10% within a minute). The fixed part is 2 ms at the speed of the big passes'
    median; the order of the sizes keeps it there (the passes' unequal lengths leave a little)."""
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
                          Passes(1, 2, 1, (4, 2, 1)), ticks.append)
    assert runs.smaller == () and runs.smaller_times == ()
    assert runs.loss[1] is None and runs.loss[0] is not None
    assert "timing layers at a smaller batch" not in ticks and ticks.count("timing layers") == 2


@pytest.mark.parametrize("repeats", [1, 2, 3])
def test_passes_counts_every_pass_the_progress_bar_shows(repeats: int) -> None:
    ticks: list[str] = []
    _measure(FakeMachine(0.0), repeats, ticks=ticks)
    # the first warm-up pass is the instrumented one, which the profiler ticks itself
    assert Passes(1, repeats, 1, curve_batches_of(16)).count == len(ticks) + 1
    assert ticks.count("timing layers") == repeats + repeats % 2
    assert ticks.count("timing layers at a smaller batch") == 4 * (repeats + repeats % 2)
    assert Passes(0, 3, 1).count == 1 + 3 + 1


def test_loss_times_one_median_per_size() -> None:
    ticks = iter(range(1000))
    times = loss_times((8, 10), 2, torch.float32, torch.device("cpu"), lambda: None, 3, lambda: float(next(ticks)))
    assert times == [1.0, 1.0]  # every call advances the fake clock by one between its two reads
    assert loss_times((8, 10), None, torch.float32, torch.device("cpu"), lambda: None, 3) != []


def test_the_batches_above_the_first_one_the_layers_refuse_keep_their_times() -> None:
    """A batch norm over (N, C) refuses one sample in training: the half and the quarter of the batch are still
    timed (before, one refusal dropped every smaller batch, and the cost model lost the curve)."""
    layers = [nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))]
    params = list(layers[0].parameters())
    runs = measure_passes(layers, layers[0], torch.randn(8, 4), params, lambda: None, (8, 4),
                          Passes(1, 2, 1, (4, 2, 1)), lambda _what: None)
    assert runs.smaller == (4, 2) and len(runs.smaller_times) == 2

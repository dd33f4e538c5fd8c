"""runner.worker.step_terms: a profiled step's terms from the kernels' time on a GPU, the CPU's elsewhere."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from planner.runner.terms import STEP_RANGE
from planner.runner.worker import step_terms


@dataclass
class _Range:
    us: float

    def elapsed_us(self) -> float:
        return self.us


@dataclass
class Ev:
    """A top-level profiler event: its CPU time (``time_range``) and its kernels' (``device_time_total``)."""

    name: str
    cpu_us: float
    device_us: float
    cpu_children: list[Ev] = field(default_factory=list)

    @property
    def time_range(self) -> _Range:
        return _Range(self.cpu_us)

    @property
    def device_time_total(self) -> float:
        return self.device_us


EVENTS = [Ev("aten::linear", 300.0, 9_000.0), Ev("autograd::engine::evaluate_function: MmBackward0", 200.0, 18_000.0),
          Ev("Optimizer.step#Adam.step", 100.0, 1_500.0), Ev("c10d::allreduce_", 50.0, 2_000.0)]


def test_on_a_gpu_an_operator_counts_the_kernels_it_queued() -> None:
    got = step_terms(EVENTS, 0.040, on_gpu=True)
    assert got["compute"] == pytest.approx(0.027) and got["optimizer"] == pytest.approx(0.0015)
    assert got["allreduce"] == pytest.approx(0.002) and got["other"] == pytest.approx(0.040 - 0.0305)


def test_on_the_cpu_or_with_no_kernel_recorded_its_own_time() -> None:
    cpu = step_terms(EVENTS, 0.040, on_gpu=False)
    assert cpu["compute"] == pytest.approx(0.0005) and cpu["optimizer"] == pytest.approx(0.0001)
    silent = [Ev(e.name, e.cpu_us, 0.0) for e in EVENTS]  # a profiler that recorded no kernel (no CUPTI)
    assert step_terms(silent, 0.040, on_gpu=True) == cpu


@dataclass
class _Span:
    start: float
    end: float

    def elapsed_us(self) -> float:
        return self.end - self.start


@dataclass
class TimedEv:
    """A CPU event with its place on the timeline (microseconds) and thread, as torch's profiler gives it."""

    name: str
    start: float
    end: float
    thread: int = 1
    cpu_children: list[TimedEv] = field(default_factory=list)

    @property
    def time_range(self) -> _Span:
        return _Span(self.start, self.end)


def test_on_the_cpu_the_wait_for_gloos_all_reduce_after_the_call_returned_is_allreduce() -> None:
    """DeepSpeed's gradient all-reduce on gloo: ``c10d::allreduce_`` returned in 28 us and the step waited
    ~3 ms for gloo's thread outside any event; that wait was ``other`` (allreduce 0.03 ms)."""
    step = TimedEv(STEP_RANGE, 0, 5_000, cpu_children=[TimedEv("aten::linear", 100, 1_100),
                                                        TimedEv("c10d::allreduce_", 1_800, 1_828)])
    top = [step, TimedEv("gloo:all_reduce", 1_820, 4_800, thread=3)]
    got = step_terms(top, 0.005, on_gpu=False)
    assert got["allreduce"] == pytest.approx(0.0030) and got["compute"] == pytest.approx(0.001)
    assert got["other"] == pytest.approx(0.005 - 0.004)

"""runner.machine: the machine's busy CPU time, the cores other work used, waiting for an idle machine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from planner.runner.machine import background_cores, busy_cpu_s, wait_idle


def test_busy_seconds_sum_the_busy_columns_of_the_cpu_line(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 20 30 5000 70 4 6 10 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
    assert busy_cpu_s(stat) == pytest.approx((100 + 20 + 30 + 4 + 6 + 10) / os.sysconf("SC_CLK_TCK"))


def test_no_stat_file_is_unknown(tmp_path: Path) -> None:
    assert busy_cpu_s(tmp_path / "missing") is None
    (tmp_path / "odd").write_text("intr 1 2 3\n")
    assert busy_cpu_s(tmp_path / "odd") is None


def test_this_machines_busy_time_grows() -> None:
    first = busy_cpu_s()
    if first is None:
        pytest.skip("no /proc/stat here")
    sum(range(2_000_000))
    later = busy_cpu_s()
    assert later is not None and later >= first


def test_background_is_the_machines_busy_time_beyond_the_runs_own() -> None:
    assert background_cores(3.0, 1.0, 2.0) == pytest.approx(1.0)
    assert background_cores(0.9, 1.0, 2.0) == 0.0  # the clocks' ticks differ: never negative
    assert background_cores(1.0, 0.0, 0.0) == 0.0


def _fake(busy_per_window: list[float]) -> tuple[list[float], list[float]]:
    """Cumulative busy seconds, one reading per window (0.5 s each), and a record of the sleeps."""
    readings, total = [0.0], 0.0
    for b in busy_per_window:
        total += b
        readings.append(total)
    return readings, []


def test_wait_idle_returns_after_the_first_quiet_window() -> None:
    readings, slept = _fake([1.0, 0.9, 0.05, 1.0])  # 2, 1.8, 0.1 cores in 0.5 s windows
    it = iter(readings)
    waited = wait_idle(0.3, 0.5, 60.0, busy=lambda: next(it), sleep=slept.append)
    assert waited == pytest.approx(1.5) and slept == [0.5, 0.5, 0.5]


def test_wait_idle_gives_up_at_its_timeout() -> None:
    readings, slept = _fake([1.0] * 10)
    it = iter(readings)
    assert wait_idle(0.3, 0.5, 2.0, busy=lambda: next(it), sleep=slept.append) == pytest.approx(2.0)
    assert len(slept) == 4


def test_wait_idle_without_a_load_reading_does_not_wait() -> None:
    slept: list[float] = []
    assert wait_idle(busy=lambda: None, sleep=slept.append) is None and slept == []


def test_wait_idle_with_no_time_to_wait_returns_at_once() -> None:
    slept: list[float] = []
    assert wait_idle(0.3, 0.5, 0.0, busy=lambda: 0.0, sleep=slept.append) == 0.0 and slept == []


def test_idle_timeout_comes_from_the_environment_when_set(monkeypatch: pytest.MonkeyPatch) -> None:
    from planner.errors import UsageError
    from planner.runner.machine import IDLE_TIMEOUT_ENV, idle_timeout_s

    monkeypatch.delenv(IDLE_TIMEOUT_ENV, raising=False)
    assert idle_timeout_s(30.0) == 30.0
    monkeypatch.setenv(IDLE_TIMEOUT_ENV, "2.5")
    assert idle_timeout_s(30.0) == 2.5
    for bad in ("soon", "-1", "nan"):
        monkeypatch.setenv(IDLE_TIMEOUT_ENV, bad)
        with pytest.raises(UsageError, match=IDLE_TIMEOUT_ENV):
            idle_timeout_s(30.0)


def test_on_idle_machine_measures_again_while_other_work_took_cores() -> None:
    from planner.runner.machine import on_idle_machine

    backgrounds, waits = iter([0.9, 0.5, 0.1, 0.0]), []
    value, bg = on_idle_machine(lambda: ("m", next(backgrounds)), 5, 2.0, waits.append)
    assert (value, bg) == ("m", 0.1) and waits == [2.0, 2.0, 2.0]
    always_busy = on_idle_machine(lambda: (1, 0.8), 2, 2.0, waits.append)
    assert always_busy == (1, 0.8) and len(waits) == 5  # gives up after its attempts, with the last value


def test_on_idle_machine_with_no_time_to_wait_measures_once() -> None:
    from planner.runner.machine import on_idle_machine

    calls: list[float] = []
    assert on_idle_machine(lambda: (len(calls), 0.9), 3, 0.0, calls.append) == (0, 0.9) and calls == []


def test_steps_background_counts_the_timed_steps_and_is_unknown_without_readings() -> None:
    from planner.runner.machine import steps_background

    timing = {"machine_busy_s": [9.0, 3.0, 3.0], "all_cpu_s": [1.0, 2.0, 2.0], "iteration_s": [5.0, 1.0, 1.0]}
    assert steps_background(timing, 1) == pytest.approx(1.0)  # 6 busy - 4 own over 2 s; the warm-up step left out
    assert steps_background({**timing, "machine_busy_s": [0.0, 0.0, 0.0]}, 1) is None


def test_machine_memory_is_the_hosts_or_its_cgroups_limit_where_lower() -> None:
    from pathlib import Path

    from planner.runner.machine import machine_memory_bytes

    found = machine_memory_bytes()
    assert found > 0
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        total = next(int(line.split()[1]) * 1024 for line in meminfo.read_text().splitlines()
                     if line.startswith("MemTotal:"))
        assert found <= total

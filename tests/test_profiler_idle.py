"""profiler.idle: a CPU profile's timed passes wait for an idle machine, are timed again beside other work, and
say what they ran beside."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from planner.cli import main
from planner.profiler.idle import ATTEMPTS, Quiet, on_idle_cpu


def _machine(monkeypatch: pytest.MonkeyPatch, busy_cores: list[float], *, timeout_s: str = "30") -> list[float]:
    """A machine on which other work takes ``busy_cores[i]`` cores during the i-th timed call (the machine's busy
    CPU seconds read before and after it, one second of wall and none of this process's own); the waits it is
    asked for are returned."""
    waits: list[float] = []
    reads: Iterator[float] = iter([x for cores in busy_cores for x in (0.0, cores)])
    clock = iter(float(i) for i in range(100))
    monkeypatch.setenv("PLANNER_IDLE_TIMEOUT_S", timeout_s)
    monkeypatch.setattr("planner.runner.machine.busy_cpu_s", lambda: next(reads))
    monkeypatch.setattr("planner.runner.machine.wait_idle", lambda timeout_s: waits.append(timeout_s) or 2.5)
    monkeypatch.setattr("planner.profiler.idle.time.perf_counter", lambda: next(clock))
    monkeypatch.setattr("planner.profiler.idle.time.process_time", lambda: 0.0)
    return waits


def test_passes_timed_beside_other_work_are_timed_again_after_waiting() -> None:
    with pytest.MonkeyPatch.context() as mp:
        waits = _machine(mp, [1.5, 0.1])
        calls = []
        value, quiet = on_idle_cpu(lambda: calls.append(1) or len(calls))
    assert value == 2 and waits == [30.0, 30.0]  # waited before each attempt, kept the second's times
    assert quiet == Quiet(pytest.approx(0.1), 5.0, 2) and quiet.warning is None


def test_the_last_attempt_is_kept_and_named_when_the_machine_stays_busy() -> None:
    with pytest.MonkeyPatch.context() as mp:
        _machine(mp, [1.5] * ATTEMPTS)
        value, quiet = on_idle_cpu(lambda: "times")
    assert value == "times" and quiet.attempts == ATTEMPTS and quiet.background_cores == pytest.approx(1.5)
    assert quiet.warning and "other work used 1.50 of" in quiet.warning and "profile again" in quiet.warning


def test_a_zero_timeout_neither_waits_nor_times_again() -> None:
    """PLANNER_IDLE_TIMEOUT_S=0: runs that share the cores on purpose (a test suite on several workers)."""
    with pytest.MonkeyPatch.context() as mp:
        waits = _machine(mp, [1.5, 0.0], timeout_s="0")
        _, quiet = on_idle_cpu(lambda: None)
    assert waits == [] and quiet.attempts == 1 and quiet.waited_for_idle_s == 0.0 and quiet.warning


def test_an_unreadable_machine_is_recorded_as_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLANNER_IDLE_TIMEOUT_S", "0")
    monkeypatch.setattr("planner.runner.machine.busy_cpu_s", lambda: None)
    _, quiet = on_idle_cpu(lambda: None)
    assert quiet.background_cores is None and quiet.warning is None
    assert Quiet.from_meta(quiet.meta()) == quiet


def test_a_profile_without_the_record_or_with_values_no_profile_writes_has_none() -> None:
    """A file's ``meta`` is free-form: values of the wrong kind read as no record, not an error."""
    assert Quiet.from_meta({"threads": 1}) is None
    good = {"timing_attempts": 2, "background_cores": 0.5, "waited_for_idle_s": 30.0}
    assert Quiet.from_meta(good) == Quiet(0.5, 30.0, 2)
    for key, bad in (("timing_attempts", "2"), ("timing_attempts", 0), ("timing_attempts", True),
                     ("timing_attempts", 1.5), ("background_cores", "x"), ("background_cores", -1.0),
                     ("background_cores", float("nan")), ("waited_for_idle_s", [1]), ("waited_for_idle_s", None)):
        assert Quiet.from_meta({**good, key: bad}) is None, (key, bad)


def test_a_cpu_profile_records_and_warns_what_its_timing_ran_beside(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's measured CPU profile keeps the record in ``meta`` and warns on stderr; an analytic one has none."""
    reads = iter(float(i) * 10 for i in range(10_000))  # 10 busy CPU seconds between any two reads
    monkeypatch.setattr("planner.runner.machine.busy_cpu_s", lambda: next(reads))
    out = tmp_path / "p.json"
    res = CliRunner().invoke(main, ["profile", "mlp", "-b", "4", "--threads", "1", "--repeats", "1", "-o", str(out)])
    assert res.exit_code == 0, res.output
    meta = json.loads(out.read_text())["meta"]
    assert meta["timing_attempts"] == 1 and meta["waited_for_idle_s"] == 0 and meta["background_cores"] > 0.3
    assert "warning: other work used" in res.stderr and "cores while the layers were timed" in res.stderr
    res = CliRunner().invoke(main, ["profile", "mlp", "-b", "4", "--mode", "analytic", "-o", str(out)])
    assert res.exit_code == 0 and "timing_attempts" not in json.loads(out.read_text())["meta"]
    assert "other work" not in res.stderr

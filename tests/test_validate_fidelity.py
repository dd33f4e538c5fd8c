"""scripts/validate_fidelity.py: a group whose attempt loses a worker is measured again, not the whole run lost."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import validate_fidelity as vf
from fidelity_table import Row

from planner.errors import PlannerError


def _row(drift: float, attempt: int) -> Row:
    return Row("cnn", "torch", 2, 2, 0.1, 0.1, 0.1, 0.1, 0.0, drift, 1.0, attempt)


def _run(monkeypatch: pytest.MonkeyPatch, outcomes: list[Any], attempts: int) -> tuple[list[Row], list[int]]:
    calls: list[int] = []

    def once(name: str, engine: str, world: int, args: argparse.Namespace, cl: dict[int, Any],
             attempt: int) -> list[Row]:
        calls.append(attempt)
        got = outcomes[len(calls) - 1]
        if isinstance(got, Exception):
            raise got
        return [_row(got, attempt)]

    monkeypatch.setattr(vf, "group_once", once)
    return vf.group("cnn", "torch", 2, argparse.Namespace(group_attempts=attempts), {}), calls


def test_a_failed_attempt_is_measured_again(monkeypatch: pytest.MonkeyPatch) -> None:
    lost = PlannerError("calibration workers failed measuring shared cores: process 1 terminated with signal SIGABRT")
    rows, calls = _run(monkeypatch, [lost, 1.01], attempts=1)  # one attempt asked: a lost one is retried
    assert calls == [1, 2] and rows[0].attempts == 2


def test_the_steadiest_attempt_is_kept_and_every_failure_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    rows, calls = _run(monkeypatch, [1.2, 1.1, 1.15], attempts=3)
    assert calls == [1, 2, 3] and rows[0].attempts == 2
    rows, calls = _run(monkeypatch, [1.01], attempts=3)  # steady at once: no more attempts
    assert calls == [1]
    lost = PlannerError("workers failed")
    with pytest.raises(PlannerError, match="workers failed"):
        _run(monkeypatch, [lost, lost], attempts=2)

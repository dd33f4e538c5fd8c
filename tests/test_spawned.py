"""planner.spawned: a result written before a worker dies at exit is kept; without one the failure is named."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from planner.errors import PlannerError, RunError
from planner.spawned import run_spawned


def _worker(rank: int, out: str, when: str) -> None:
    """Rank 0 writes the result where ``when`` is ``after``; rank 1 aborts as a C++ thread torn down at exit does
    (SIGABRT), after the result is on disk (``after``) or at once (``before``); ``never``: nothing is written."""
    if rank == 0 and when == "after":
        Path(out).write_text(json.dumps({"value": 1.5}))
        return
    if rank == 1 and when == "after":
        deadline = time.monotonic() + 60
        while not Path(out).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    if rank == 1 and when != "never":
        os.abort()


def test_a_result_written_before_a_worker_aborts_is_kept(tmp_path: Path) -> None:
    out = str(tmp_path / "result.json")
    assert run_spawned(_worker, (out, "after"), 2, out, "measuring failed", "retry") == {"value": 1.5}


def test_a_worker_that_dies_before_the_result_is_named(tmp_path: Path) -> None:
    out = str(tmp_path / "result.json")
    with pytest.raises(PlannerError, match=r"measuring failed: .*(signal|SIGABRT)") as err:
        run_spawned(_worker, (out, "before"), 2, out, "measuring failed", "retry")
    assert err.value.hint == "retry"


def test_workers_that_write_nothing_are_a_failure(tmp_path: Path) -> None:
    out = str(tmp_path / "result.json")
    Path(out).write_text('{"cut sh')  # a file cut short is no result
    with pytest.raises(RunError, match="the workers wrote no result"):
        run_spawned(_worker, (out, "never"), 1, out, "measuring failed", "retry", RunError)

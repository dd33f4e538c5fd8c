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


def _heap_worker(rank: int, out: str) -> None:
    """Rank 0 writes whether an 8 MiB block came from the heap (glibc's ``mallinfo2``: no bytes mapped on their own)."""
    import ctypes

    from planner.runner.memory import _MallInfo2

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = _MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    block = libc.malloc(8 * 2**20)
    mapped = libc.mallinfo2().hblkhd
    libc.free(block)
    if rank == 0:
        Path(out).write_text(json.dumps({"mapped": mapped}))


@pytest.mark.skipif(__import__("platform").libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_every_worker_starts_with_freed_memory_kept(tmp_path: Path) -> None:
    """As planner run's workers: a fresh process maps an 8 MiB block on its own (tests/test_heap.py); a spawned one
    takes it from the heap, whose freed blocks the next step reuses (planner.heap)."""
    out = str(tmp_path / "heap.json")
    got = run_spawned(_heap_worker, (out,), 1, out, "heap worker failed", "none")
    assert got["mapped"] < 8 * 2**20

"""Spawned worker processes that leave one JSON result file: run them, read the result.

``planner calibrate`` measures links, shared cores and engines in groups of spawned processes; rank 0
writes the group's result before the last barrier, so a result on disk is a finished measurement. A
worker can still die after it, as the group shuts down: a validation run of 2026-11-28 lost an hour
when one of two processes measuring shared cores ended with SIGABRT ("terminate called without an active
exception", a C++ thread torn down at exit) after its measurement was written. Such a result is kept;
without one the failure is a :class:`~planner.errors.PlannerError` naming the workers' last line. Every worker
starts with freed memory kept for reuse (:func:`planner.heap.keep_freed_memory`), as ``planner run``'s do.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from planner.errors import PlannerError
from planner.heap import keep_freed_memory

__all__ = ["run_spawned"]


def run_spawned(worker: Callable[..., None], args: tuple[Any, ...], nprocs: int, out: str, failed: str,
                hint: str, error: type[PlannerError] = PlannerError) -> Any:
    """Spawn ``nprocs`` processes of ``worker(rank, *args)`` and return the JSON document rank 0 wrote to ``out``;
    an ``error`` (``failed``: what failed, ``hint``) where none was written whole."""
    import torch.multiprocessing as mp

    try:
        mp.start_processes(_started, args=(worker, *args), nprocs=nprocs, join=True, start_method="spawn")
    except Exception as exc:
        doc = _result(out)
        if doc is None:
            raise error(f"{failed}: {str(exc).strip().splitlines()[-1]}", hint) from None
        return doc
    doc = _result(out)
    if doc is None:
        raise error(f"{failed}: the workers wrote no result to {out}", hint)
    return doc


def _started(rank: int, worker: Callable[..., None], *args: Any) -> None:
    """One spawned process: freed memory kept for reuse, then ``worker(rank, *args)``."""
    keep_freed_memory()
    worker(rank, *args)


def _result(out: str) -> Any:
    """The JSON document at ``out``, or None where there is none or it is cut short."""
    try:
        return json.loads(Path(out).read_text())
    except (OSError, ValueError):
        return None

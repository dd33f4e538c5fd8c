"""The cores this process may run on, and the torch threads per process an option may ask for.

Beyond the cores, threads only take turns; and torch starts as many as it is told (``torch.set_num_threads``
of a million ended the process in a segmentation fault at its first parallel kernel, with no message), so
``planner profile``, ``calibrate`` and ``run`` refuse ``--threads`` above them.
"""

from __future__ import annotations

import os

from planner.errors import UsageError


def usable_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def check_threads(threads: int, why: str) -> None:
    """UsageError unless 1 <= ``threads`` <= the cores this process may run on: threads beyond them only take
    turns, and torch starts as many as it is told (a million ended the process in a segmentation fault, no
    message); ``why`` ends the hint (what else to do)."""
    cores = usable_cores()
    if not 1 <= threads <= cores:
        raise UsageError(f"--threads must be 1 to the {cores} cores this process may run on, got {threads}",
                         f"use --threads {min(max(threads, 1), cores)} ({why})")

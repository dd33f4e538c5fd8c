"""How busy this machine is: the CPU time other work takes beside a timed run (Linux ``/proc/stat``).

A timed run on a machine shared with other users runs slower than its cost model says when
their processes take cores from it (measured on a 2-core machine: a 2-process pipeline beside
one other busy process ran at 1.4 to 2.1 times its idle time, with its own processes' CPU time
unchanged). These helpers say how much of the machine such other work took, so that a
measurement can wait for an idle machine and report what it ran beside:

* :func:`busy_cpu_s`: the machine's cumulative busy CPU seconds over every core (user, nice,
  system, irq, softirq and steal time of ``/proc/stat``'s ``cpu`` line; ``proc(5)``), None
  where there is no ``/proc/stat``.
* :func:`background_cores`: the cores other work used during a run: the machine's busy CPU
  seconds minus the run's own processes' CPU seconds, per wall second; :func:`steps_background`
  the same over a process group's timed steps.
* :func:`wait_idle`: wait (polling in short windows) until the machine's busy cores stay
  below a threshold, so that a timed round starts on an idle machine; for how long at most,
  :func:`idle_timeout_s` (``PLANNER_IDLE_TIMEOUT_S`` overrides it: 0 never waits nor retries,
  for runs that share the cores on purpose, such as a test suite on several workers).
* :func:`on_idle_machine`: a measurement started on an idle machine and taken again while
  other work took cores during it (what calibrate and scripts/validate_fidelity.py time with).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

STAT = Path("/proc/stat")
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)
"""user, nice, system, irq, softirq, steal: the busy columns of ``/proc/stat``'s ``cpu`` line (``proc(5)``)."""
IDLE_CORES = 0.3
"""Busy cores below which the machine counts as idle (the polling's own reads and a waiting
process's wake-ups stay well under it)."""
IDLE_TIMEOUT_S = 30.0
"""How long a measurement waits for an idle machine unless ``PLANNER_IDLE_TIMEOUT_S`` says (:func:`idle_timeout_s`):
``planner calibrate`` before it times and before each engine round, a CPU profile before its timed passes."""


def busy_cpu_s(stat: Path = STAT) -> float | None:
    """The machine's busy CPU seconds so far, summed over its cores; None without ``/proc/stat``."""
    try:
        first = stat.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    ticks = [int(v) for v in first[1:]]
    return sum(ticks[i] for i in BUSY_FIELDS if i < len(ticks)) / os.sysconf("SC_CLK_TCK")


IDLE_TIMEOUT_ENV = "PLANNER_IDLE_TIMEOUT_S"


def idle_timeout_s(default_s: float) -> float:
    """How long a measurement waits for an idle machine: ``$PLANNER_IDLE_TIMEOUT_S`` when set, else
    ``default_s``; a UsageError when the variable is not a number of seconds >= 0."""
    from planner.errors import UsageError

    text = os.environ.get(IDLE_TIMEOUT_ENV)
    if text is None:
        return default_s
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise UsageError(f"{IDLE_TIMEOUT_ENV}={text!r} is not a number of seconds >= 0",
                         "unset it, or set it to e.g. 30 (0: never wait for an idle machine)")
    return value


def background_cores(machine_busy_s: float, own_cpu_s: float, wall_s: float) -> float:
    """Cores that other work used during ``wall_s``: the machine's busy CPU seconds beyond the
    run's own (never below 0: the two clocks tick at different rates)."""
    if wall_s <= 0:
        return 0.0
    return max(0.0, machine_busy_s - own_cpu_s) / wall_s


def steps_background(timing: Mapping[str, Sequence[float]], first: int = 0) -> float | None:
    """Cores other work used during the steps from ``first`` on, from a process group's per-step
    ``machine_busy_s``, ``all_cpu_s`` and ``iteration_s`` (planner.runner.worker.group_timing);
    None when the machine's busy time could not be read."""
    busy = timing["machine_busy_s"][first:]
    if not any(busy):
        return None
    return background_cores(sum(busy), sum(timing["all_cpu_s"][first:]), sum(timing["iteration_s"][first:]))


def wait_idle(max_busy_cores: float = IDLE_CORES, window_s: float = 0.5, timeout_s: float = 60.0,
              busy: Callable[[], float | None] = busy_cpu_s, sleep: Callable[[float], None] = time.sleep,
              ) -> float | None:
    """Wait until a ``window_s`` window in which the machine used fewer than ``max_busy_cores``
    cores (or ``timeout_s`` has passed): the seconds waited, None when the load cannot be read."""
    if timeout_s <= 0:
        return 0.0
    start = busy()
    if start is None:
        return None
    waited = 0.0
    while True:
        sleep(window_s)
        waited += window_s
        now = busy()
        if now is None:
            return None
        if (now - start) / window_s < max_busy_cores or waited >= timeout_s:
            return waited
        start = now


def on_idle_machine(measure: Callable[[], tuple[T, float]], attempts: int, timeout_s: float,
                    wait: Callable[[float], object] | None = None) -> tuple[T, float]:
    """``measure()`` -- its value and the cores other work used during it -- after waiting up to
    ``timeout_s`` for an idle machine (``wait(timeout_s)``, :func:`wait_idle` by default), taken
    again (``attempts`` in all) while that other work exceeded :data:`IDLE_CORES`: the last
    value and its background cores. ``timeout_s`` 0 neither waits nor retries."""
    wait_for = wait or (lambda limit_s: wait_idle(timeout_s=limit_s))
    for _ in range(max(1, attempts) if timeout_s > 0 else 1):
        if timeout_s > 0:
            wait_for(timeout_s)
        value, background = measure()
        if background <= IDLE_CORES:
            break
    return value, background


def machine_memory_bytes() -> int:
    """This machine's memory (``/proc/meminfo``'s MemTotal, else the OS's page count), or its cgroup's limit where
    lower (cgroup v2, then v1): what a container may really use."""
    total = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        total = 0
    if total <= 0:
        total = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            total = min(total, int(Path(limit).read_text().strip()))
        except (OSError, ValueError):
            continue
    return total

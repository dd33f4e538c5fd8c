"""A measured profile's timed passes on this machine's CPU, taken while no other work takes its cores.

A layer's wall time counts the time it waited for a core, so a CPU profile measured beside other work is slow, and
every plan searched from it is predicted slow: the README's mlp, profiled a minute after a test suite had loaded the
machine, took 18.7 ms a step where three profiles on the idle machine took 15.1-18.4 ms, and its plan then ran at
0.84-0.86 of its prediction. As ``planner calibrate`` does, the timed passes of a CPU profile wait for an idle
machine (:func:`planner.runner.machine.wait_idle`, at most ``IDLE_TIMEOUT_S`` there; ``PLANNER_IDLE_TIMEOUT_S``
overrides it, 0 neither waits nor measures again) and are timed again, :data:`ATTEMPTS` times in all, while other
work took more than ``IDLE_CORES`` cores during them. :class:`Quiet` says what they ran beside, kept in the
profile's ``meta`` (``background_cores``, ``waited_for_idle_s``, ``timing_attempts``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from planner.errors import is_whole
from planner.jsonio import is_finite_number

T = TypeVar("T")

ATTEMPTS = 2
"""Timings of a CPU profile's passes at most: one more where other work took cores during the first."""


@dataclass(frozen=True)
class Quiet:
    """What a CPU profile's timed passes ran beside: the cores other work used during the last attempt (None where
    ``/proc/stat`` cannot be read), the seconds waited for an idle machine, and the attempts made."""

    background_cores: float | None
    waited_for_idle_s: float
    attempts: int

    def meta(self) -> dict[str, Any]:
        return {"background_cores": self.background_cores, "waited_for_idle_s": self.waited_for_idle_s,
                "timing_attempts": self.attempts}

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any]) -> Quiet | None:
        """The record :meth:`meta` wrote, None in a profile without it (analytic, on a GPU, or older) or with values
        no profile writes (a file's ``meta`` is free-form)."""
        attempts, background = meta.get("timing_attempts"), meta.get("background_cores")
        waited = meta.get("waited_for_idle_s", 0.0)
        if not isinstance(attempts, int) or not is_whole(attempts, 1) or not _seconds(waited):
            return None
        if background is not None and not _seconds(background):
            return None
        return cls(None if background is None else float(background), float(waited), attempts)

    @property
    def warning(self) -> str | None:
        """What to tell the user where other work still took cores during the passes kept, else None."""
        from planner.cores import usable_cores
        from planner.runner.machine import IDLE_CORES

        if self.background_cores is None or self.background_cores <= IDLE_CORES:
            return None
        return (f"other work used {self.background_cores:.2f} of this machine's {usable_cores()} cores while the "
                f"layers were timed ({self.attempts} attempt(s), {self.waited_for_idle_s:.0f} s waited for an idle "
                "machine): the times are likely slow, and so every plan's prediction from them; profile again when "
                "nothing else runs")


def _seconds(value: Any) -> bool:
    """Whether ``value`` is a finite number >= 0 (:func:`planner.jsonio.is_finite_number`)."""
    return is_finite_number(value) and float(value) >= 0.0


@dataclass
class _Tally:
    waited_s: float = 0.0
    attempts: int = 0


def on_idle_cpu(timed: Callable[[], T], attempts: int = ATTEMPTS) -> tuple[T, Quiet]:
    """``timed()`` after waiting for an idle machine, again while other work took cores during it
    (:func:`planner.runner.machine.on_idle_machine`); its last value and what it ran beside."""
    from planner.runner.machine import (
        IDLE_TIMEOUT_S,
        background_cores,
        busy_cpu_s,
        idle_timeout_s,
        on_idle_machine,
        wait_idle,
    )

    tally = _Tally()

    def wait(limit_s: float) -> None:
        tally.waited_s += wait_idle(timeout_s=limit_s) or 0.0

    def measure() -> tuple[tuple[T, bool], float]:
        tally.attempts += 1
        busy0, wall0, own0 = busy_cpu_s(), time.perf_counter(), time.process_time()
        value = timed()
        busy1 = busy_cpu_s()
        if busy0 is None or busy1 is None:
            return (value, False), 0.0
        return (value, True), background_cores(busy1 - busy0, time.process_time() - own0, time.perf_counter() - wall0)

    (value, readable), background = on_idle_machine(measure, attempts, idle_timeout_s(IDLE_TIMEOUT_S), wait)
    return value, Quiet(background if readable else None, tally.waited_s, tally.attempts)

"""The error tree of planner: every failure a user can cause or meet.

Each error carries a one-line cause (what is wrong, with the values) and a hint (how to
fix it). The CLI prints ``error: <cause>`` and ``hint: <hint>`` and exits with the
error's ``exit_code``: 1 for errors, 2 for usage errors, 3 when no plan fits.
"""

from __future__ import annotations


class PlannerError(Exception):
    """Base of every error planner raises on purpose."""

    exit_code: int = 1

    def __init__(self, cause: str, hint: str = "") -> None:
        super().__init__(cause)
        self.cause = cause
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.cause} ({self.hint})" if self.hint else self.cause


class UsageError(PlannerError):
    """A command-line value is malformed or out of range (exit 2)."""

    exit_code = 2


class FormatError(PlannerError):
    """A JSON document is malformed, of the wrong kind or version, or has a bad field."""


class ProfileError(PlannerError):
    """A model could not be built, traced, split or measured."""


class ModelLoadError(ProfileError):
    """A model name or ``package.module:factory`` path could not be turned into a module."""


class TraceError(ProfileError):
    """The model could not be traced into layers."""


class ClusterError(PlannerError):
    """A cluster description is invalid or a preset is unknown."""


class PlanError(PlannerError):
    """A plan is inconsistent, or asks for something the search cannot do."""


class ScheduleError(PlannerError):
    """A pipeline schedule is unknown or invalid."""


class InfeasibleError(PlannerError):
    """No plan fits in the devices' memory (exit 3)."""

    exit_code = 3

    def __init__(self, cause: str, hint: str = "", needed_bytes: int | None = None) -> None:
        super().__init__(cause, hint)
        self.needed_bytes = needed_bytes


class ExportError(PlannerError):
    """A plan cannot be turned into a program for the requested engine."""


class RunError(PlannerError):
    """Real training of a plan failed (launch, worker crash, mismatch)."""


def is_whole(value: object, low: int | None = None, high: int | None = None) -> bool:
    """Whether ``value`` is a whole number (an ``int``, not a ``bool``, a ``float`` or a string) in ``low..high``
    (None: unbounded): what every check of a library caller's or a file's count asks."""
    if isinstance(value, bool) or not isinstance(value, int):
        return False
    return (low is None or value >= low) and (high is None or value <= high)


def shown_devices(devices: object, most: int = 4) -> str:
    """A device list as a message shows it: every name up to ``most``, else the first and last with the count
    (``['s8.g0', 's8.g1', .., 's71.g7'] (512 devices)``): a stage of a large cluster has hundreds."""
    names = [str(d) for d in devices] if isinstance(devices, (list, tuple)) else [str(devices)]
    if len(names) <= most:
        return repr(names)
    return f"[{names[0]!r}, {names[1]!r}, .., {names[-1]!r}] ({len(names)} devices)"


"""Small text helpers every command's output shares: units and plurals."""

from __future__ import annotations

from collections.abc import Iterable


def plural(n: int, noun: str) -> str:
    """``noun`` for one, its plural otherwise (``micro-batch`` -> ``micro-batches``, ``GPU`` -> ``GPUs``)."""
    if n == 1:
        return noun
    return noun + ("es" if noun.endswith(("s", "sh", "ch", "x")) else "s")


def count(n: int, noun: str) -> str:
    """``1 micro-batch``, ``2 micro-batches``, ``8 GPUs``."""
    return f"{n} {plural(n, noun)}"


def ms(seconds: float | None) -> str:
    """Seconds shown in milliseconds with two decimals (``-`` for None)."""
    return "-" if seconds is None else f"{seconds * 1e3:.2f} ms"


def device_noun(device_names: Iterable[str]) -> str:
    """What a cluster's devices are called in output: ``CPU process`` for a calibrated CPU cluster
    (devices ``cpu0``, ``cpu1``, ...: planner calibrate), else ``GPU``."""
    names = list(device_names)
    return "CPU process" if names and all(n.startswith("cpu") for n in names) else "GPU"

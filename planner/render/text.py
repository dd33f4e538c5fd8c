"""Small text helpers every command's output shares: units and plurals."""

from __future__ import annotations


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

"""Text helpers every command's output shares: names from files made safe to show, units and plurals.

A layer, GPU, model or cluster name comes from a JSON file or a model factory; printed as is it
could close a rich markup tag (``[/]``), set the terminal's title (an escape sequence) or break a
matplotlib label (``$``). :func:`safe_text` is applied wherever such a name is printed on the
terminal, :func:`plot_text` wherever it is drawn in a picture. :func:`count`, :func:`ms` and
:func:`device_noun` keep units and plurals the same in every command.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from rich.markup import escape

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def plain_text(value: object) -> str:
    """``value`` as a string with every control character (C0, C1, line and bidi controls) written as ``\\xNN``."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                        else f"\\u{ord(m.group()):04x}", str(value))


def safe_text(value: object) -> str:
    """``value`` for rich: control characters escaped (:func:`plain_text`) and markup brackets escaped."""
    return escape(plain_text(value))


def plot_text(value: object) -> str:
    """``value`` for a matplotlib label: control characters escaped and ``$`` kept literal (no mathtext)."""
    return plain_text(value).replace("$", r"\$")


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

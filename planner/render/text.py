"""Text taken from files, made safe to show: no rich markup, no terminal control codes, no mathtext.

A layer, GPU, model or cluster name comes from a JSON file or a model factory; printed as is it
could close a rich markup tag (``[/]``), set the terminal's title (an escape sequence) or break a
matplotlib label (``$``). :func:`safe_text` is applied wherever such a name is printed on the
terminal, :func:`plot_text` wherever it is drawn in a picture.
"""

from __future__ import annotations

import re

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

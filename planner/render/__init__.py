"""Terminal and picture output: the only place rich and matplotlib are imported.

One module per command's output (``render.profile``, ``render.search``, ...).
"""

from __future__ import annotations

import os
from typing import Any

from rich.console import Console

from planner.errors import PlannerError
from planner.jsonio import atomic_path

GIB = 1024**3  # bytes per GiB, the unit memory is shown in


PIPED_WIDTH = 200
"""Columns of output when stderr is not a terminal (a pipe, a log): wide enough that tables keep
their names whole (rich would squeeze them to 80 columns)."""


def stderr_console(width_when_piped: int = PIPED_WIDTH) -> Console:
    """A rich console on stderr: progress, tables and logs never pollute ``--json`` stdout; a closed stderr
    silences it without stopping the command (the CLI's streams, ``planner.pipes``).

    ``width_when_piped``: the least width when stderr is not a terminal (rich's default: 80)."""
    console = Console(stderr=True, highlight=False)
    if not console.is_terminal and console.width < width_when_piped:
        console = Console(stderr=True, highlight=False, width=width_when_piped)
    return console


def write_png(path: str | os.PathLike[str], fig: Any, **savefig: Any) -> None:
    """Save a matplotlib figure as PNG atomically (a temporary sibling renamed into place), then close it;
    ``savefig``: more arguments of ``Figure.savefig`` (dpi, bbox_inches)."""
    import matplotlib.pyplot as plt

    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", **savefig)
    except OSError as exc:
        raise PlannerError(f"cannot write {path}: {exc.strerror}", "choose a writable output path") from None
    finally:
        plt.close(fig)

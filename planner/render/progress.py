"""Progress on stderr for the steps that take more than a moment (search, compare, run, calibrate).

On a terminal a rich spinner with the step's latest news and the elapsed time, gone when the
step ends; quiet under ``--json`` or when stderr is not a terminal, unless asked for with
``--progress`` or ``PLANNER_PROGRESS=1`` (then, off a terminal, one plain line per news item,
with the elapsed seconds, as a log wants it). ``--no-progress`` or ``PLANNER_PROGRESS=0``
silences it everywhere.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.markup import escape

from planner.render import stderr_console

ENV = "PLANNER_PROGRESS"
"""Environment variable: 1 shows progress even under --json or off a terminal, 0 never."""


def wanted(flag: bool | None, as_json: bool, is_terminal: bool) -> bool:
    """Whether to show progress: the flag when given, else the environment, else a terminal without --json."""
    if flag is not None:
        return flag
    env = os.environ.get(ENV, "").strip().lower()
    if env in ("1", "true", "yes", "on"):
        return True
    if env in ("0", "false", "no", "off"):
        return False
    return is_terminal and not as_json


@contextmanager
def status(title: str, flag: bool | None = None, as_json: bool = False) -> Iterator[Callable[[str], None]]:
    """Yields ``update(news)``; shows ``title`` and the latest news with the elapsed time while the block runs."""
    console = stderr_console()
    if not wanted(flag, as_json, console.is_terminal):
        yield lambda news: None
        return
    t0 = time.perf_counter()
    if not console.is_terminal:
        console.print(f"{escape(title)} ...", highlight=False)
        yield lambda news: console.print(f"  {time.perf_counter() - t0:6.1f} s  {escape(news)}", highlight=False)
        return
    with console.status(f"[bold]{escape(title)}[/]") as spinner:
        def update(news: str) -> None:
            spinner.update(f"[bold]{escape(title)}[/] [dim]{time.perf_counter() - t0:.0f} s[/] {escape(news)}")

        yield update

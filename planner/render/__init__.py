"""Terminal and picture output: the only place rich and matplotlib are imported.

One module per command's output (``render.profile``, ``render.search``, ...).
"""

from __future__ import annotations

from rich.console import Console


def stderr_console() -> Console:
    """A rich console on stderr: progress, tables and logs never pollute ``--json`` stdout."""
    return Console(stderr=True, highlight=False)

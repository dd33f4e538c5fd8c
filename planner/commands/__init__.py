"""One module per CLI command; each defines a click command named after it."""

from __future__ import annotations

from pathlib import Path

from planner.errors import PlannerError, UsageError

RERANK = 16
"""planner.search.RERANK, repeated so that ``--help`` loads no algorithm module (test_cmd_search checks they agree)."""


def parse_microbatches(value: str) -> int | str:
    """``--microbatches``: ``N`` (a positive integer) or ``auto``; anything else is a UsageError (exit 2)."""
    if value == "auto":
        return value
    try:
        n = int(value)
    except ValueError:
        raise UsageError(f"--microbatches {value!r} is neither a positive integer nor 'auto'",
                         "e.g. --microbatches 4 or --microbatches auto") from None
    if n < 1:
        raise UsageError(f"--microbatches {value!r} must be a positive integer or 'auto'", "e.g. --microbatches 4")
    return n


def check_folder(path: str | None) -> None:
    """Fail before any work if the folder an output file goes into does not exist (``None``: no output)."""
    if path and not Path(path).resolve().parent.is_dir():
        raise PlannerError(f"cannot write {path}: folder {Path(path).parent} does not exist",
                           "create the folder or choose another path")

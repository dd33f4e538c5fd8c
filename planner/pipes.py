"""What a command's output streams do when their reader goes away (``planner search ... 2>&1 | head -1``, ``planner
search --json ... | head -c 100``): the rest of the output is dropped and the command goes on to write its files
and exit as it would have. Python raises ``BrokenPipeError`` at the first write after the reader has gone, wherever it
happens (a ``note:`` line before a plan is written, the ``--json`` document before the files are committed, the
``wrote ...`` line after), which would end the command there with exit 1 and, before the commit, none of its files.

Owns :func:`silence` (a stream's file descriptor pointed at the null device) and :func:`reader_safe` (the command's
``sys.stdout`` and ``sys.stderr`` for its run, silenced at their first broken pipe).
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator
from typing import Any


def silence(stream: Any) -> None:
    """Point ``stream``'s file descriptor at the null device: later writes to it, and the flush of what it still
    buffers at exit, go nowhere instead of failing. A stream without one (a test's captured stream) is left."""
    with contextlib.suppress(OSError, ValueError, AttributeError, io.UnsupportedOperation):
        fd = stream.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, fd)
        finally:
            os.close(devnull)


class _ReaderSafe:
    """A text stream that drops what it is given once its reader has gone (:func:`silence` at the first broken
    pipe); everything else is the wrapped stream's."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except BrokenPipeError:
            silence(self._stream)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            silence(self._stream)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def reader_safe() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` that outlive their readers (module doc) while the block runs."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (None if s is None else _ReaderSafe(s) for s in saved)  # None: no stream (pythonw)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved

"""pipes: a command's stdout and stderr outlive their readers."""

from __future__ import annotations

import os
import sys

from planner.pipes import reader_safe


def test_a_write_to_a_stream_whose_reader_has_gone_is_dropped_and_the_stream_silenced() -> None:
    """Once the reader has gone, writes and flushes succeed (nothing raised) and the file descriptor points at the
    null device, so the flush at exit does not fail either; the streams are the process's own again after."""
    read, write = os.pipe()
    os.close(read)
    saved = os.dup(2)
    before = sys.stdout, sys.stderr
    try:
        os.dup2(write, 2)
        stream = open(2, "w", closefd=False)  # noqa: SIM115 -- a text stream on fd 2, as sys.stderr is
        sys.stderr = stream
        with reader_safe():
            assert sys.stderr.write("gone\n") == 5
            sys.stderr.flush()
            print("more", file=sys.stderr, flush=True)
        assert os.path.samestat(os.fstat(2), os.stat(os.devnull))
        stream.close()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(write)
        sys.stderr = before[1]
    assert (sys.stdout, sys.stderr) == before

"""How the planner's own CPU processes keep the memory their tensors free: glibc's malloc told to reuse it.

On a GPU, PyTorch's caching allocator keeps the blocks one step frees for the next, and the cost model prices a
step so (no term for getting memory from the operating system). On a CPU torch allocates through glibc's
``malloc``, whose two thresholds move as the program runs: a block larger than the mmap threshold (128 KiB at
start, raised to the size of each such block freed, at most 32 MiB) is mapped on its own and unmapped when freed,
and free memory at the heap's top beyond the trim threshold (twice the mmap threshold) is handed back. A
training step frees and allocates the same large tensors again, so in some steps their pages are mapped and
faulted in again and in others not, as the thresholds happen to stand (``mallopt(3)``: M_MMAP_THRESHOLD,
M_TRIM_THRESHOLD). Measured on this project's 2-core VM (2026-11-29): eight measured profiles of the README's mlp
(batch 64, 1 thread) summed to 13.3-18.4 ms, each run of them steady in itself; with the thresholds fixed,
13.1-14.1 ms; the one-process torch plan of that mlp ran steps alternating between about 15 and 20 ms, and with
the thresholds fixed 15.4-16.2 ms every step.

:func:`keep_freed_memory` fixes them in the calling process, as a caching allocator behaves: blocks up to
:data:`MMAP_THRESHOLD_BYTES` come from the heap and are reused, and up to :data:`TRIM_THRESHOLD_BYTES` of free
heap is kept rather than handed back (the memory stays the process's until it exits). The planner calls it
where it times CPU work and where it runs a plan: a measured CPU profile (:func:`planner.profiler.profile_model`,
the caller's process), ``planner run``'s workers, and every worker :func:`planner.spawned.run_spawned` starts
(``planner calibrate``'s: links, shared cores, engines), so
that the profile and the run it predicts hold freed memory alike. Where the user set glibc's own
``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` or a ``glibc.malloc`` tunable, their setting stands and
nothing is changed; off glibc (macOS, musl) there is nothing to set.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
from collections.abc import Mapping

__all__ = ["MMAP_THRESHOLD_BYTES", "TRIM_THRESHOLD_BYTES", "USER_SETTINGS", "keep_freed_memory"]

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
"""``mallopt``'s parameter numbers (glibc's malloc.h)."""

MMAP_THRESHOLD_BYTES = 32 * 2**20
"""Blocks up to this size come from the heap: the largest mmap threshold glibc accepts on a 64-bit machine (half
its heap size, ``HEAP_MAX_SIZE``), the ceiling its dynamic threshold rises to by itself."""

TRIM_THRESHOLD_BYTES = 2**30
"""Free memory at the heap's top kept rather than handed back (``mallopt`` takes a C int: under 2 GiB)."""

USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
"""glibc's own variables for these settings: where the user set one, their choice stands."""

def _user_chose(env: Mapping[str, str]) -> bool:
    """Whether the environment already says how glibc's malloc keeps memory."""
    return any(name in env for name in USER_SETTINGS) or "glibc.malloc" in env.get("GLIBC_TUNABLES", "")


@functools.cache
def keep_freed_memory() -> bool:
    """Fix glibc's malloc thresholds in this process (module doc), once; whether they are fixed. False where the user
    set them (theirs stand), or off glibc."""
    if _user_chose(os.environ) or platform.libc_ver()[0] != "glibc":
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)  # the process's own symbols: glibc's (no ldconfig run)
    return mallopt is not None and bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and \
        bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))

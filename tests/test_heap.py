"""planner.heap: glibc's malloc told to keep and reuse freed blocks, unless the user said otherwise.

Each case runs in a fresh interpreter (the thresholds are per process and cannot be set back): it allocates an
8 MiB block with libc's ``malloc``, reads ``mallinfo2`` (bytes mapped on their own, ``hblkhd``), frees it and
reads what the heap kept free (``fordblks``)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")

PROBE = """
import ctypes, ctypes.util, json, sys
from planner.heap import keep_freed_memory

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]

libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
kept = [keep_freed_memory() for _ in range(int(sys.argv[1]))]
block = libc.malloc(8 * 2**20)
mapped = libc.mallinfo2().hblkhd
libc.free(block)
print(json.dumps({"kept": kept, "mapped": mapped, "free": libc.mallinfo2().fordblks}))
"""


def probe(calls: int, **env: str) -> dict[str, Any]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", PROBE, str(calls)], capture_output=True, text=True, check=True,
                         cwd=ROOT, env={**base, "PYTHONPATH": str(ROOT), **env}, timeout=60)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


BLOCK = 8 * 2**20


def test_glibc_left_alone_maps_a_large_block_on_its_own() -> None:
    got = probe(0)
    assert got["mapped"] >= BLOCK  # above the 128 KiB threshold a fresh process starts with


def test_kept_the_block_comes_from_the_heap_and_stays_there_when_freed() -> None:
    got = probe(2)
    assert got["kept"] == [True, True]  # once set, a second call says so again
    assert got["mapped"] < BLOCK
    assert got["free"] >= BLOCK  # not handed back: the next step reuses it


@pytest.mark.parametrize("env", [{"MALLOC_TRIM_THRESHOLD_": "131072"}, {"MALLOC_MMAP_THRESHOLD_": "131072"},
                                 {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=131072"}])
def test_the_users_own_setting_stands(env: dict[str, str]) -> None:
    got = probe(1, **env)
    assert got["kept"] == [False]
    assert got["mapped"] >= BLOCK  # their 128 KiB threshold, not ours

"""A worker's peak memory in training, comparable with the plan's predicted ``memory_bytes``.

- On CUDA: ``torch.cuda.max_memory_allocated`` over the engine's set-up and every step (its peak
  reset before the engine is built), the allocator's live tensors as the cost model counts them.
- On CPU (Linux, glibc): the heap in use (``mallinfo2``: small blocks in use plus mmapped ones, where
  torch's CPU allocator puts every tensor), sampled by a thread every 0.2 ms over one more step after
  the timed ones (a sampling thread during the timed steps would take CPU time from them; by then the
  optimizer's state exists, so the step is the steady one the prediction describes), or, where more, the
  heap before that step plus the most torch's allocations grew in a steady step, recorded in order by its profiler
  (:func:`torch_growth_bytes`: a tensor that lives a moment, which the sampler can miss), above the heap
  after the model was built and one forward of it had run (:func:`warm_math`: the math library's workspace,
  allocated once at a process's first large matrix product, 4.5-7.4 MB here, is the process's, not the
  plan's), plus the bytes of the layers this rank runs (built before that base: an
  engine that casts, shards or copies them moves the heap from there). The layers of other stages,
  which every worker builds too, are left out. This is what ``max_memory_allocated`` counts on a GPU,
  without the allocator's slack and the process's own floor that the resident set holds.
- Elsewhere (no ``mallinfo2``): the growth of the process's peak resident set (``ru_maxrss``) from
  before the engine is built, a rougher figure.
"""

from __future__ import annotations

import ctypes
import resource
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

SAMPLE_S = 2e-4
"""How often the sampling thread reads the heap: a peak shorter than this can be missed, and on a loaded machine
one that lasts while the thread waits for a core (a 32 MB tensor that lived 3-5 ms was, once in a suite run)."""


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]


def _mallinfo2() -> Callable[[], _MallInfo2] | None:
    try:
        fn = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):  # not glibc, or glibc before 2.33
        return None
    fn.restype = _MallInfo2
    return fn  # type: ignore[no-any-return]


_MALLINFO2 = _mallinfo2()


def heap_in_use_bytes() -> int | None:
    """Bytes glibc's allocator has handed out and not taken back (small blocks and mmapped ones);
    None where there is no ``mallinfo2``."""
    if _MALLINFO2 is None:
        return None
    info = _MALLINFO2()
    return int(info.uordblks + info.hblkhd)


def _peak_rss_bytes() -> int:
    """This process's peak resident set so far (Linux reports ru_maxrss in KiB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def layer_bytes(layers: Iterable[nn.Module]) -> int:
    """The bytes of ``layers``' parameters and buffers, each storage once (tied weights)."""
    seen: dict[int, int] = {}
    for layer in layers:
        for t in (*layer.parameters(), *layer.buffers()):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


@contextmanager
def heap_peak() -> Iterator[list[int]]:
    """Sample the heap in use until the block ends; the one-element list holds its peak."""
    first = heap_in_use_bytes() or 0
    peak, done = [first], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], heap_in_use_bytes() or 0)
            time.sleep(SAMPLE_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield peak
    finally:
        done.set()
        sampler.join()
        peak[0] = max(peak[0], heap_in_use_bytes() or 0)


STEADY_MARK = "planner::steady_step"
"""The profiler range around the second of :func:`torch_growth_bytes`'s two steps, the one read."""


def torch_growth_bytes(step: Callable[[], object]) -> int | None:
    """The most bytes torch's CPU allocations grew within a steady ``step`` beyond what they held as it began, however
    briefly a tensor lived: two steps under the profiler (``profile_memory``: every allocation and free, in order),
    the second read. The first makes every tensor the second frees one the profiler saw allocated (torch's CPU
    allocator reports nothing for the free of a block allocated before profiling began, so a step that frees the
    last step's gradients and allocates new ones read as growing by all of them). None where a profiler already runs
    here (starting another would end its session) or the record cannot be read."""
    if torch._C._autograd._profiler_enabled():
        return None
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
        with record_function(STEADY_MARK):
            step()
    return _growth_after(prof, STEADY_MARK)


def _growth_after(prof: object, mark: str) -> int | None:
    """The highest running sum of ``prof``'s CPU memory records (bytes allocated, minus bytes freed) after the range
    ``mark`` began, over the sum there; None without the record or the mark."""
    try:
        events = prof.profiler.kineto_results.events()  # type: ignore[attr-defined]
    except AttributeError:
        return None
    begun = min((e.start_ns() for e in events if e.name() == mark), default=None)
    if begun is None:
        return None
    records = sorted((e.start_ns(), e.nbytes()) for e in events
                     if e.name() == "[memory]" and str(e.device_type()).endswith("CPU"))
    before = sum(nbytes for at, nbytes in records if at < begun)
    total = most = before
    for _, nbytes in (r for r in records if r[0] >= begun):
        total += nbytes
        most = max(most, total)
    return most - before


@dataclass(frozen=True)
class MemoryProbe:
    """Where a worker's memory stood before its engine was built (:func:`start`), and how it is read."""

    how: str
    """``cuda`` (max_memory_allocated), ``heap`` (mallinfo2 over one step) or ``rss`` (peak RSS growth)."""
    base_bytes: int
    own_bytes: int
    """The bytes of this rank's own layers (``heap`` adds them back: they were built before the base)."""

    def peak_bytes(self, step: Callable[[], object]) -> int:
        """The peak memory of the run; ``step`` trains one more step where the heap is read (``how == "heap"``),
        sampled, and two more with torch's allocations recorded (:func:`torch_growth_bytes`: the sampler alone missed
        peaks shorter than its wait for a core, DeepSpeed's flat copy of a stage's gradients read at 34.8 MB
        against 40.2 predicted, 42.4 on the next run); the higher of the two."""
        if self.how == "cuda":
            return int(torch.cuda.max_memory_allocated())
        if self.how == "rss":
            return max(0, _peak_rss_bytes() - self.base_bytes)
        start = heap_in_use_bytes() or 0
        with heap_peak() as peak:
            step()
        grown = torch_growth_bytes(step) or 0  # steps of their own: the profiler's buffers are not the plan's
        return max(0, max(peak[0], start + grown) - self.base_bytes + self.own_bytes)


def warm_math(layers: Iterable[nn.Module], x: torch.Tensor) -> None:
    """One forward of ``layers`` in turn on ``x`` in eval mode without gradients (no running statistic moves, no
    weight changes), so that what the CPU's math library allocates once per process, at its first large matrix
    product (a Linear of 1024 on 16 samples: 5.9 MB that stay; of 256 4.5 MB, of 2048 7.4 MB; an 8 x 8 product
    none), is in the base :func:`start` reads, not in the plan's peak. Only where the heap is read (CPU)."""
    if torch.cuda.is_available() or _MALLINFO2 is None:
        return
    from planner.export.data import eval_forward

    eval_forward(list(layers), x)


def start(own_layers: Iterable[nn.Module]) -> MemoryProbe:
    """Read memory where it stands now (after the model is built, before the engine is)."""
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
        return MemoryProbe("cuda", 0, 0)
    heap = heap_in_use_bytes()
    if heap is None:
        return MemoryProbe("rss", _peak_rss_bytes(), 0)
    return MemoryProbe("heap", heap, layer_bytes(own_layers))

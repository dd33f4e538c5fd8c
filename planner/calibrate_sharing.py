"""What a process keeps of its share of the cores while others compute beside it (``planner calibrate``).

Owns :func:`measure_sharing`: ``nproc`` processes each run a kernel the same number of times
alone (the others waiting in a barrier) and with all of them computing at once, alternately
(:data:`ROUNDS` times, so that a drift of the machine's speed moves both), and report the mean
of the CPU seconds per call alone over together (:func:`work_ratio`). That ratio is the
node's ``sharing_efficiency`` (:func:`sharing_efficiency`, :meth:`planner.ir.Node.speed`): the
work a core does for a process while others compute beside it, whether the processes share
the cores by time slices or only the caches and the memory bus. CPU time, not calls per wall
second: a wall-clock rate over a time window overstated what was kept, because the ranks
whose window ended first left the cores to the others (4 GPT-2 processes on 2 cores together
took 2.14 cores' worth of the fair share by wall rates), and the same number of calls on
every rank keeps all of them computing until nearly the end.

Together, the processes compute the way the stages of a pipeline do: after each call a
process hands a token to the next rank and waits for one from the previous (a ring, so that
every rank does the same), blocking as a stage blocks for its input; only the call's own CPU
seconds are counted, since what the hand-off itself costs is the engine's per-action overhead
(:mod:`planner.calibrate_engines`). A process that blocks and is woken between calls computes
slower than one that runs on: on this project's 2-core VM, GPT-2 (width 128) at 2 and 4
samples a call on 4 processes kept 0.84-0.85 of its work rate alone running on, and 0.79-0.80
handing off between calls; 2 processes 0.99 and 0.95 (they block although each has a core).
A matmul on a 4 MiB weight lost nothing running on and 4-6% handing off.

The kernel is the profile's own model (a forward and backward of the whole model at the
profile's batch, :func:`sharing_model`; a caller that knows the plan's micro-batch passes that:
the smaller the batch, the more a process loses, 0.88 of its work rate for GPT-2 at 2 samples
against 0.94 at 16, 4 processes on 2 cores) when it was measured on a CPU and builds here, else a
512 x 512 matmul and a 3 x 3 convolution.
The model matters: processes on separate cores still share the last-level cache and the
memory bus, and on this project's 2-core VM two processes training GPT-2 (width 128) at once
each ran 12-15% slower than one alone, with as much more CPU time, a CNN 5-9% slower, while
the matmul and convolution lost 1-2%. Four such processes on the 2 cores kept 0.89 of their
fair half each (GPT-2), the same loss as two: the cores are time-sliced fairly, the caches
are what is shared.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from planner import ir
from planner.errors import PlannerError

ROUNDS, WINDOW_S = 3, 0.3
"""How many times each process's kernel is timed alone and with all computing, and for how long (at least one call)."""

Kernel = Callable[[], object]


def sharing_efficiency(ratio: float) -> float | None:
    """The node's ``sharing_efficiency`` from a measured :func:`work_ratio` (CPU seconds per call
    alone over together): at most 1 (noise above it is no gain); None when the measure is unusable."""
    if not ratio > 0:
        return None
    return min(1.0, ratio)


def _benchmark_kernel() -> Kernel:
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    x, w = torch.randn(8, 64, 32, 32), torch.randn(64, 64, 3, 3)

    def kernel() -> None:
        with torch.no_grad():
            a @ b
            torch.nn.functional.conv2d(x, w, padding=1)

    return kernel


@dataclass(frozen=True)
class SharingModel:
    """The model to time: a ``planner profile`` spec, its batch and input shape (without the batch)."""

    spec: str
    batch_size: int
    input_shape: tuple[int, ...] | None = None


def model_kernel(model: SharingModel) -> Kernel:
    """A forward and backward of the whole model at its batch."""
    from planner.profiler.loader import load_model
    from planner.profiler.measure import whole_model_pass

    loaded = load_model(model.spec, model.batch_size, model.input_shape)
    params = list(loaded.module.parameters())
    return lambda: whole_model_pass(loaded.module, loaded.example_input, params, lambda: None)


def sharing_model(profile: ir.ModelProfile | None) -> SharingModel | None:
    """The profile's own model, when it was measured on this kind of machine (a CPU) and builds
    here with as many parameters as the profile counts (a profile made with ``--set`` names its
    base model only); else None: the benchmark kernel."""
    if profile is None or profile.mode != "measured" or profile.device != "cpu":
        return None
    from planner.profiler.loader import load_model

    model = SharingModel(profile.model, profile.batch_size, profile.input_shape or None)
    try:
        loaded = load_model(model.spec, model.batch_size, model.input_shape)
    except Exception:  # any model that does not build here: the benchmark kernel instead
        return None
    params = sum(p.numel() for p in loaded.module.parameters())
    return model if params == sum(layer.param_count for layer in profile.layers) else None


def _cpu_per_call_s(fn: Kernel, calls: int, handoff: Callable[[], None] | None = None) -> float:
    """CPU seconds of this process (all its threads) per call of ``fn`` over ``calls`` calls, after
    one untimed; with ``handoff``, that runs after every call and its CPU seconds are not counted."""
    fn()
    if handoff is not None:
        handoff()
    cpu_s = 0.0
    for _ in range(calls):
        c0 = time.process_time()
        fn()
        cpu_s += time.process_time() - c0
        if handoff is not None:
            handoff()
    return cpu_s / calls


def ring_handoff(rank: int, world: int) -> Callable[[], None]:
    """A token sent to the next rank and one received from the previous, both waited for: what
    a pipeline stage does between its actions (module doc)."""
    import torch.distributed as dist

    token, got = torch.zeros(1), torch.zeros(1)

    def handoff() -> None:
        send = dist.isend(token, (rank + 1) % world)
        recv = dist.irecv(got, (rank - 1) % world)
        send.wait()
        recv.wait()

    return handoff


def _agreed_calls(kernel: Kernel, window_s: float) -> int:
    """Calls of ``kernel`` that take the slowest rank about ``window_s`` alone (all ranks agree)."""
    import torch.distributed as dist

    kernel()
    t0 = time.perf_counter()
    kernel()
    calls = torch.tensor([max(1, int(window_s / max(time.perf_counter() - t0, 1e-9)))])
    dist.all_reduce(calls, op=dist.ReduceOp.MIN)
    return int(calls)


def work_ratio(kernel: Kernel, rank: int, world: int, rounds: int = ROUNDS, window_s: float = WINDOW_S,
               handoff: Callable[[], None] | None = None) -> float:
    """This rank's CPU seconds per call of ``kernel`` alone over the same with every rank
    computing and calling ``handoff`` between calls (module doc; default :func:`ring_handoff`,
    none with one rank): every rank makes the same number of calls, so that all compute at once
    until nearly the end."""
    import torch.distributed as dist

    if handoff is None and world > 1:
        handoff = ring_handoff(rank, world)
    calls = _agreed_calls(kernel, window_s)
    alone, together = [], []
    for _ in range(rounds):
        for r in range(world):
            dist.barrier()
            if r == rank:
                alone.append(_cpu_per_call_s(kernel, calls))
        dist.barrier()
        together.append(_cpu_per_call_s(kernel, calls, handoff))
    return statistics.median(alone) / statistics.median(together)


def _worker(rank: int, world: int, init: str, threads: int, model: SharingModel | None, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    kernel = model_kernel(model) if model is not None else _benchmark_kernel()
    ratio = torch.tensor([work_ratio(kernel, rank, world)], dtype=torch.float64)
    dist.all_reduce(ratio)
    if rank == 0:
        Path(out).write_text(json.dumps({"work_ratio": float(ratio[0]) / world}))
    dist.barrier()
    dist.destroy_process_group()


def measure_sharing(nproc: int, threads: int, model: SharingModel | None = None) -> float:
    """The mean :func:`work_ratio` of ``nproc`` processes of ``threads`` threads computing ``model``
    (or the benchmark kernel) alone and all at once (module doc)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="planner-calibrate-sharing-") as tmp:
        out = os.path.join(tmp, "sharing.json")
        init = "file://" + os.path.join(tmp, "store")
        try:
            mp.start_processes(_worker, args=(nproc, init, threads, model, out), nprocs=nproc, join=True,
                               start_method="spawn")
        except Exception as exc:
            raise PlannerError(f"calibration workers failed measuring shared cores: "
                               f"{str(exc).strip().splitlines()[-1]}", "try fewer --nproc") from None
        return float(json.loads(Path(out).read_text())["work_ratio"])

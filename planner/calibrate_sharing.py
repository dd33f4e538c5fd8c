"""What a process keeps of its share of the cores while others compute beside it (``planner calibrate``).

Owns :func:`measure_sharing`: ``nproc`` processes each run a kernel the same number of times
alone (the others waiting in a barrier) and with all of them computing at once, alternately
(:data:`ROUNDS` times, so that a drift of the machine's speed moves both), and report the mean
of the CPU seconds per call alone over together (:func:`rank_sharing`). That ratio is the
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
seconds count towards the ratio. A process that blocks and is woken between calls may compute
slower than one that runs on: on this project's 2-core VM, GPT-2 (width 128) at 2 and 4
samples a call on 4 processes kept 0.84-0.85 of its work rate alone running on, and 0.79-0.80
handing off between calls, in one measurement, but 0.81 and 0.82 in the next (2 processes: 0.99
and 0.95); a matmul on a 4 MiB weight lost nothing running on and 4-6% handing off. A small
effect, if any, beside the noise; the hand-off's own cost is the larger one (below).

The hand-offs' own CPU seconds are measured too, with every rank computing and with every rank
only handing off, each after :data:`IDLE_GAP_S` asleep (idle cores); the difference is the
node's ``handoff_s`` (:meth:`Sharing.on`), which the cost model charges with each micro-batch
sent (:mod:`planner.costmodel.engine`). What a hand-off costs on idle cores is the engine's
per-micro-batch overhead, fitted on a tiny model that leaves the cores mostly idle
(:mod:`planner.calibrate_engines`); on busy, time-sliced cores it costs more: a token handed
round 4 processes on 2 cores took 0.9-1.7 ms of CPU per process between calls of GPT-2,
rescnn and Llama models (the woken process waits for, and takes, a core from one that
computes), against 0.25-0.47 ms on idle cores; on 2 processes no more than idle.

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
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from planner import ir

ROUNDS, WINDOW_S = 5, 0.8
"""How many times each process's kernel is timed alone and with all computing, and for how long (at least one call).
The hand-off cost is a small difference of two noisy figures: three measurements in a row of a CNN's on 4 processes
spread over 0.20-1.11 ms with 5 rounds of 0.3 s, 0.79-0.96 ms with 5 rounds of 0.8 s (about 15 s a measurement)."""
IDLE_GAP_S = 0.002
"""How long each rank sleeps before each hand-off timed on idle cores."""

Kernel = Callable[[], object]


def sharing_efficiency(ratio: float) -> float | None:
    """The node's ``sharing_efficiency`` from a measured :attr:`Sharing.work_ratio` (CPU seconds per call
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
    """The model to time: a ``planner profile`` spec, its batch and input shape (without the batch), and
    the ``--set`` overrides it was profiled with (a zoo transformer's config fields)."""

    spec: str
    batch_size: int
    input_shape: tuple[int, ...] | None = None
    overrides: tuple[tuple[str, Any], ...] = ()

    def load(self) -> Any:
        """The model built here (planner.profiler.loader.LoadedModel)."""
        from planner.profiler.loader import load_model

        return load_model(self.spec, self.batch_size, self.input_shape, overrides=dict(self.overrides))


def model_kernel(model: SharingModel) -> Kernel:
    """A forward and backward of the whole model at its batch."""
    from planner.profiler.measure import whole_model_pass

    loaded = model.load()
    params = list(loaded.module.parameters())
    return lambda: whole_model_pass(loaded.module, loaded.example_input, params, lambda: None)


def sharing_model(profile: ir.ModelProfile | None, memory_bytes: float = math.inf) -> SharingModel | None:
    """The profile's own model, when it was measured on this kind of machine (a CPU), a forward and
    backward of it takes at most half of ``memory_bytes`` (each process's share of the machine; by the
    profile's own weights, gradients and activations), and it builds here, with the profile's ``--set``
    overrides, with as many parameters as the profile counts; else None: the benchmark kernel."""
    if profile is None or profile.mode != "measured" or profile.device != "cpu":
        return None
    if pass_bytes(profile) > memory_bytes / 2:
        return None
    from planner.profiler.loader import overrides_for

    try:
        overrides = overrides_for(profile.model, profile.model, profile.meta)
        model = SharingModel(profile.model, profile.batch_size, profile.input_shape or None,
                             tuple(sorted(overrides.items())))
        loaded = model.load()
    except Exception:  # any model that does not build here: the benchmark kernel instead
        return None
    params = sum(p.numel() for p in loaded.module.parameters())
    return model if params == sum(layer.param_count for layer in profile.layers) else None


def pass_bytes(profile: ir.ModelProfile) -> int:
    """What a forward and backward of the profile's whole model holds: weights, gradients, the bytes
    saved for backward and the largest output."""
    layers = profile.layers
    return (2 * sum(x.param_bytes for x in layers) + sum(x.saved_bytes for x in layers)
            + max(x.output_bytes for x in layers))


def _cpu_per_call_s(fn: Kernel, calls: int, handoff: Callable[[], None] | None = None) -> tuple[float, float]:
    """CPU seconds of this process (all its threads) per call of ``fn`` over ``calls`` calls, after
    one untimed, and per ``handoff`` run after each call (0 without one): counted apart."""
    fn()
    if handoff is not None:
        handoff()
    call_s = handoff_s = 0.0
    for _ in range(calls):
        c0 = time.process_time()
        fn()
        c1 = time.process_time()
        if handoff is not None:
            handoff()
        call_s += c1 - c0
        handoff_s += time.process_time() - c1
    return call_s / calls, handoff_s / calls


def _idle_handoff_s(handoff: Callable[[], None], calls: int) -> float:
    """CPU seconds per ``handoff`` of this process while every rank only hands off, each after
    :data:`IDLE_GAP_S` asleep: what a hand-off costs on idle cores."""
    handoff()
    c0 = time.process_time()
    for _ in range(calls):
        time.sleep(IDLE_GAP_S)
        handoff()
    return (time.process_time() - c0) / calls


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


@dataclass(frozen=True)
class Sharing:
    """What processes computing side by side measured (module doc): ``work_ratio``, CPU seconds
    per call alone over together; ``handoff_s``, CPU seconds per hand-off with all computing less
    the same on idle cores (below 0 only by noise)."""

    work_ratio: float
    handoff_s: float = 0.0

    def on(self, node: ir.Node) -> ir.Node:
        """``node`` carrying this measurement: its ``sharing_efficiency`` (:func:`sharing_efficiency`)
        and its ``handoff_s``, 0 where noise put it below (None where either is unusable)."""
        handoff_s = max(0.0, self.handoff_s) if self.handoff_s == self.handoff_s else None  # NaN: unusable
        return replace(node, sharing_efficiency=sharing_efficiency(self.work_ratio), handoff_s=handoff_s)


def rank_sharing(kernel: Kernel, rank: int, world: int, rounds: int = ROUNDS, window_s: float = WINDOW_S,
                 handoff: Callable[[], None] | None = None) -> Sharing:
    """This rank's :class:`Sharing`: CPU seconds per call of ``kernel`` alone over the same with
    every rank computing and calling ``handoff`` between calls (module doc; default
    :func:`ring_handoff`, none with one rank), and the hand-offs' CPU seconds then less on idle
    cores. Every rank makes the same number of calls, so that all compute at once until nearly the end."""
    import torch.distributed as dist

    if handoff is None and world > 1:
        handoff = ring_handoff(rank, world)
    calls = _agreed_calls(kernel, window_s)
    alone, together, busy, idle = [], [], [], []
    for _ in range(rounds):
        for r in range(world):
            dist.barrier()
            if r == rank:
                alone.append(_cpu_per_call_s(kernel, calls)[0])
        dist.barrier()
        call_s, handoff_s = _cpu_per_call_s(kernel, calls, handoff)
        together.append(call_s)
        busy.append(handoff_s)
        if handoff is not None:
            dist.barrier()
            idle.append(_idle_handoff_s(handoff, calls))
    extra_s = statistics.median(busy) - statistics.median(idle) if idle else 0.0
    return Sharing(statistics.median(alone) / statistics.median(together), extra_s)


def _worker(rank: int, world: int, init: str, threads: int, model: SharingModel | None, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    kernel = model_kernel(model) if model is not None else _benchmark_kernel()
    got = rank_sharing(kernel, rank, world)
    means = torch.tensor([got.work_ratio, got.handoff_s], dtype=torch.float64)
    dist.all_reduce(means)
    if rank == 0:
        Path(out).write_text(json.dumps({"work_ratio": float(means[0]) / world, "handoff_s": float(means[1]) / world}))
    dist.barrier()
    dist.destroy_process_group()


def measure_sharing(nproc: int, threads: int, model: SharingModel | None = None) -> Sharing:
    """The mean :class:`Sharing` of ``nproc`` processes of ``threads`` threads computing ``model``
    (or the benchmark kernel) alone and all at once (module doc)."""
    from planner.spawned import run_spawned

    with tempfile.TemporaryDirectory(prefix="planner-calibrate-sharing-") as tmp:
        out = os.path.join(tmp, "sharing.json")
        init = "file://" + os.path.join(tmp, "store")
        doc = run_spawned(_worker, (nproc, init, threads, model, out), nproc, out,
                          "calibration workers failed measuring shared cores", "try fewer --nproc")
        return Sharing(float(doc["work_ratio"]), float(doc["handoff_s"]))

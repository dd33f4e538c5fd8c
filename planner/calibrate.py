"""`planner calibrate`: measure this machine as a cluster of P processes (one "GPU" each).

* Compute: ``flops`` per device is the FLOP/s one process reaches with ``threads`` threads
  on a matmul and a convolution benchmark (the median of the two). A measured profile's
  ``device_flops`` is the FLOP/s its model reached; ``--match-profile PROFILE`` takes that
  figure instead, so that a device computing alone runs the profile's measured times unchanged
  (its ``flops`` is that figure times the share below, so the cost model's scale
  ``device_flops / flops`` is 1 / share, and the simulator gives a device computing alone its
  speed back).
* Links: point-to-point latency (half the round trip of a 4-byte message) and bandwidth
  (a 16 MiB message one way, latency removed) between ranks 0 and 1 over gloo, with all P
  processes running; the fastest of 20 (latency) and of 5 (bandwidth) round trips: the
  link's own cost, not the time a process waited for a core on a machine shared with other
  work (on an idle machine the fastest and the median differ by a few microseconds); and
  the bus bandwidth collectives reach over the links: an all-reduce, an all-gather and a
  reduce-scatter of 1, 4 and 16 MiB over all P (the median of 11 each), a line fitted through each
  one's times over its bus bytes (``2(n-1)/n * S``, ``(n-1)/n * S``): its slope the bandwidth, its
  intercept less the ring's latencies the fixed cost of a call; the all-reduce's bandwidth is the links'
  ``allreduce_bandwidth_Bps`` and its fixed cost their ``collective_latency_s``, the all-gather's and
  reduce-scatter's bandwidths together their ``allgather_bandwidth_Bps`` (each one's times, bandwidth and
  fixed cost in ``meta``). gloo's collectives on this project's 2-core VM reach a half (all-reduce) to a
  fifth (reduce-scatter) of the point-to-point bandwidth, which is what a data-parallel or ZeRO step's
  gradients and weights pay, and each call costs 0.4-2.9 ms besides: timed at 4 MiB alone, the
  all-reduce's bandwidth read 0.77-1.6 GB/s from run to run and its 11.6 MB in a step was predicted
  7.4 ms where it took 10.3-12.7 (docs/fidelity.md, "2026-11-30").
* Memory: the machine's memory divided among the P processes; ``memory_bandwidth_Bps``
  per device is what one process reaches with ``threads`` threads adding two 32 MiB
  tensors into a third (STREAM "add", McCalpin 1995: 3 x 32 MiB moved per call), the
  kind of element-wise pass an optimizer step is (the cost model's optimizer term).

* Sharing the cores: with more threads (P x T) than the cores this process may run on, each
  device gets ``core_share = cores / (P x T)`` of its measured (or profile's) ``flops`` and
  memory bandwidth, times the node's ``sharing_efficiency``: their speed when all P compute at
  once. The node's ``concurrent_devices`` is ``cores / T``, so that the simulator gives the
  cores of the stages waiting for their input to the ones computing (processor sharing,
  :mod:`planner.simulate.cores`: on 2 cores, 4 processes of a CNN pipeline ran at 0.70 of the
  flat share's prediction). ``sharing_efficiency`` is measured, after the links: every process
  runs the profile's model (or a matmul and a convolution) alone, the others waiting in a
  barrier, and with all P computing at once, handing a token round a ring between calls as
  pipeline stages hand on their outputs, alternately, 5 times each; the mean of CPU seconds
  per call alone over together, at most 1 (:mod:`planner.calibrate_sharing`);
  ``meta.concurrent_share`` is it times the fair share ``cores / (P x T)``. The same
  measurement gives the node's ``handoff_s``: the CPU seconds a process spends on each hand-off
  while all compute, less the same on idle cores (the cost model charges it with each
  micro-batch sent).
  Processes computing beside each other do less work per CPU second than one alone: 4
  one-thread GPT-2 processes on this project's 2 cores 0.78-0.86 (2 to 4 samples a call, handing
  off between calls; 0.85-0.90 at 2 to 16 samples running on), 2 on 2 0.87-0.99, a matmul and a
  convolution 0.93; and a hand-off among 4 on 2 cores cost 0.35-1.6 ms of CPU beyond its 0.25-0.47
  ms on idle cores. The efficiency applies while two or more devices
  compute (:meth:`planner.ir.Node.speed`). The machine is measured idle (below), so other
  users' work does not enter it (beside another user's busy process, 4 processes once
  measured 0.24).
* Engines (:mod:`planner.calibrate_engines`): what DeepSpeed's and torch pipelining's own work
  adds to the cost model, per action, per micro-batch sent and per step, fitted by least
  squares over tiny pipelines trained by each engine (``engine_overheads``) on the cluster's own
  P processes (with more processes than cores, their costs grow faster than the core share says).
* Other work: calibrate first waits (up to :data:`IDLE_TIMEOUT_S`) until the machine is idle
  (:func:`planner.runner.machine.wait_idle`: other processes' busy cores below 0.3; ``meta.waited_for_idle_s``):
  on a machine shared with other users a benchmark beside a busy process measures the time it
  waited for a core (a p2p latency of 1.2 ms was measured so, 0.12 ms idle).

The result is a cluster JSON (kind cluster, version 1) with one node ``cpu`` of P devices
``cpu0..cpu{P-1}``; ``inter_node`` repeats ``intra_node`` (there is one node).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from planner import ir
from planner.calibrate_sharing import measure_sharing, sharing_model
from planner.cores import check_threads, usable_cores
from planner.errors import UsageError
from planner.runner.machine import IDLE_TIMEOUT_S, idle_timeout_s, machine_memory_bytes, wait_idle

"""How long calibrate waits for an idle machine before it measures (module doc)."""


def _median_time(fn: Callable[[], object], repeats: int = 7, warmup: int = 2) -> float:
    """Median wall seconds of ``repeats`` calls of ``fn`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_flops(threads: int = 1, repeats: int = 7) -> dict[str, float]:
    """FLOP/s of a 512x512 fp32 matmul and of a 3x3 convolution at ``threads`` threads (median of ``repeats``)."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            a, b = torch.randn(512, 512), torch.randn(512, 512)
            mm = 2 * 512**3 / _median_time(lambda: a @ b, repeats)
            x, w = torch.randn(8, 64, 32, 32), torch.randn(64, 64, 3, 3)
            conv_flops = 2 * 8 * 64 * 32 * 32 * 64 * 9
            conv = conv_flops / _median_time(lambda: torch.nn.functional.conv2d(x, w, padding=1), repeats)
    finally:
        torch.set_num_threads(old)
    return {"matmul_flops": mm, "conv_flops": conv, "flops": statistics.median([mm, conv])}


def measure_memory_bandwidth(threads: int = 1, mib: int = 32) -> float:
    """Bytes/s of ``c = a + b`` on fp32 tensors of ``mib`` MiB each (read a, b; write c)."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        n = mib * 2**20 // 4
        a, b, c = torch.rand(n), torch.rand(n), torch.empty(n)
        t = _median_time(lambda: torch.add(a, b, out=c), repeats=9)
    finally:
        torch.set_num_threads(old)
    return 3 * n * 4 / t


def _pingpong(t: torch.Tensor, rank: int) -> None:
    """Rank 0 sends ``t`` to rank 1 and receives it back; other ranks do nothing."""
    import torch.distributed as dist

    if rank == 0:
        dist.send(t, 1)
        dist.recv(t, 1)
    elif rank == 1:
        dist.recv(t, 0)
        dist.send(t, 0)


def _measure_p2p(rank: int) -> dict[str, float]:
    """Latency (half a 4-byte round trip) and bandwidth (16 MiB one way, latency removed), ranks 0 and 1."""
    import torch.distributed as dist

    small = torch.zeros(1)
    big = torch.zeros(4 * 1024 * 1024)  # 16 MiB
    for _ in range(3):
        _pingpong(small, rank)
        _pingpong(big, rank)
    dist.barrier()
    lat, bw = [], []
    for _ in range(20):
        t0 = time.perf_counter()
        _pingpong(small, rank)
        lat.append((time.perf_counter() - t0) / 2)
    for _ in range(5):
        t0 = time.perf_counter()
        _pingpong(big, rank)
        bw.append((time.perf_counter() - t0) / 2)
    latency = min(lat)
    one_way = min(bw)
    return {"latency_s": latency, "bandwidth_Bps": big.numel() * 4 / max(one_way - latency, 1e-9)}


COLLECTIVE_SIZES = (1024 * 1024, 4 * 1024 * 1024, 16 * 1024 * 1024)
"""The sizes :func:`_measure_collectives` times each collective at (the all-gather's output, the others' input):
the range a step's gradient buckets and FSDP units span on a CPU; the fit over them separates a call's fixed cost
from its bandwidth (module doc)."""


def _median_s(op: Callable[[], object], repeats: int = 11) -> float:
    """The median of ``repeats`` timed calls of ``op`` after two untimed ones, every rank starting together."""
    import torch.distributed as dist

    for _ in range(2):
        op()
    times = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        op()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def fit_collective(bus_bytes: Sequence[float], times_s: Sequence[float], ring_latency_s: float) -> tuple[float, float]:
    """A collective's bus bandwidth and fixed cost per call from its median times at several sizes: the least-squares
    line ``time = fixed + ring_latency_s + bus_bytes / bandwidth`` (Hockney's alpha-beta over sizes, as nccl-tests'
    sweep reads; the ring's per-step latencies are the point-to-point ones). Where the times do not grow with the
    size (a noisy sweep), the largest size's bytes over its time less the ring's latencies, and no fixed cost."""
    slope, intercept = statistics.linear_regression(bus_bytes, times_s) if len(set(bus_bytes)) > 1 else (0.0, 0.0)
    if slope <= 0:
        t, b = max(zip(times_s, bus_bytes, strict=True), key=lambda tb: tb[1])
        return b / max(t - ring_latency_s, 1e-9), 0.0
    return 1.0 / slope, max(intercept - ring_latency_s, 0.0)


def _measure_collectives(world: int, latency_s: float) -> dict[str, float]:
    """An all-reduce, all-gather and reduce-scatter over every rank at each of :data:`COLLECTIVE_SIZES`, each
    collective's bus bandwidth and fixed cost per call fitted over the sizes (:func:`fit_collective`; nccl-tests'
    ``busbw``: the ring formula's bandwidth); the link's ``allgather_bandwidth_Bps`` is the all-gather's and the
    reduce-scatter's bus bytes over their time, its ``collective_latency_s`` the all-reduce's fixed cost (on this
    project's 2-core VM, gloo: all-reduce 1.4-2.3 GB/s and 0.4-2.9 ms a call, all-gather 0.8, reduce-scatter 0.4;
    point to point 2.5-5.3)."""
    n = world
    out: dict[str, float] = {}
    for name, rings in (("allreduce", 2), ("allgather", 1), ("reduce_scatter", 1)):
        bus, times = [], []
        for size in COLLECTIVE_SIZES:
            t = _median_s(_collective(name, size, n))
            out[f"{name}_{size // 1024 // 1024}mib_s"] = t
            bus.append(rings * (n - 1) / n * size)
            times.append(t)
        bw, fixed = fit_collective(bus, times, rings * (n - 1) * latency_s)
        out[f"{name}_bus_bandwidth_Bps"], out[f"{name}_fixed_s"] = bw, fixed
    gather, scatter = out["allgather_bus_bandwidth_Bps"], out["reduce_scatter_bus_bandwidth_Bps"]
    out["allreduce_bandwidth_Bps"] = out["allreduce_bus_bandwidth_Bps"]
    out["allgather_bandwidth_Bps"] = 2 / (1 / gather + 1 / scatter)  # the pair's bus bytes over its time
    out["collective_latency_s"] = out["allreduce_fixed_s"]
    return out


def _collective(name: str, size: int, n: int) -> Callable[[], object]:
    """One call of collective ``name`` over ``n`` ranks of ``size`` bytes (the all-gather's output, the others'
    input: ``n`` equal shards)."""
    import torch.distributed as dist

    part = torch.zeros(size // 4 // n)
    whole = torch.zeros(part.numel() * n)
    if name == "allreduce":
        return lambda: dist.all_reduce(whole)
    if name == "allgather":
        return lambda: dist.all_gather_single(whole, part)
    return lambda: dist.reduce_scatter_single(part, whole)


def _worker(rank: int, world: int, init: str, threads: int, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    res = _measure_p2p(rank)
    dist.barrier()
    res.update(_measure_collectives(world, res["latency_s"]))
    if rank == 0:
        import json

        Path(out).write_text(json.dumps(res))
    dist.barrier()
    dist.destroy_process_group()


def measure_links(nproc: int, threads: int) -> dict[str, float]:
    """p2p latency/bandwidth and the collectives' bus bandwidth over gloo with ``nproc`` processes."""
    from planner.spawned import run_spawned

    with tempfile.TemporaryDirectory(prefix="planner-calibrate-") as tmp:
        out = os.path.join(tmp, "links.json")
        init = "file://" + os.path.join(tmp, "store")
        return run_spawned(_worker, (nproc, init, threads, out), nproc, out,  # type: ignore[no-any-return]
                           "calibration workers failed", "try fewer --nproc")


def core_share(nproc: int, threads: int) -> float:
    """The share of a core each of ``nproc x threads`` threads gets on the cores this process may use
    (:meth:`planner.ir.Node.fair_share` of a node that runs ``cores / threads`` processes at once)."""
    return ir.Node("cpu", (), usable_cores() / threads).fair_share(nproc)


def calibrate(nproc: int, threads: int = 1, name: str | None = None, profile: ir.ModelProfile | None = None,
              engines: Sequence[str] = ()) -> tuple[ir.Cluster, dict[str, Any]]:
    """Measure this machine as ``nproc`` devices; ``profile`` pins ``flops`` to its device_flops;
    ``engines``: the engines whose overheads to measure (none: the cluster carries none)."""
    if nproc < 2:
        raise UsageError(f"--nproc must be 2 or more to measure links, got {nproc}", "use --nproc 2")
    check_threads(threads, "one per core, and --nproc for more devices")
    waited_s = wait_idle(timeout_s=idle_timeout_s(IDLE_TIMEOUT_S))
    compute = measure_flops(threads)
    bandwidth = measure_memory_bandwidth(threads)
    links = measure_links(nproc, threads)
    kernel = sharing_model(profile, machine_memory_bytes() / nproc)
    shared = measure_sharing(nproc, threads, kernel).on(ir.Node("cpu", (), usable_cores() / threads))
    share = links["concurrent_share"] = shared.speed(nproc)
    compute["memory_bandwidth_Bps"] = bandwidth * share
    flops = (profile.device_flops if profile is not None else compute["flops"]) * share
    memory = machine_memory_bytes() // nproc
    link = ir.Link(links["bandwidth_Bps"], links["latency_s"], links["allreduce_bandwidth_Bps"],
                   links["allgather_bandwidth_Bps"], links["collective_latency_s"])
    gpus = tuple(ir.GPU(f"cpu{i}", float(flops), memory, compute["memory_bandwidth_Bps"]) for i in range(nproc))
    node = dataclasses.replace(shared, gpus=gpus, threads=threads)  # run and export start processes with them
    cluster = ir.Cluster(name or f"calibrated-cpu-{nproc}x{threads}t", (node,),
                         (("intra_node", link), ("inter_node", link)))
    meta: dict[str, Any] = {**compute, **links, "threads": threads, "nproc": nproc, "core_share": share,
                            "sharing_efficiency": shared.sharing_efficiency, "handoff_s": shared.handoff_s,
                            "sharing_kernel": kernel.spec if kernel is not None else "matmul+conv",
                            "flops_source": "profile" if profile is not None else "benchmark",
                            "waited_for_idle_s": waited_s}
    if engines:
        from planner.calibrate_engines import measure_engines

        overheads, runs = measure_engines(cluster, engines, threads)
        cluster = dataclasses.replace(cluster, engine_overheads=overheads)
        meta["engine_runs"] = runs
    return cluster, meta


def cluster_doc(cluster: ir.Cluster, meta: dict[str, Any]) -> dict[str, Any]:
    doc = cluster.to_dict()
    doc["meta"] = meta
    return doc

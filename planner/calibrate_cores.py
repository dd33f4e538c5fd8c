"""``planner calibrate``'s core step: how many devices a node with fewer cores than processes really runs at once.

With P one-thread processes on C < P cores, the simulator shares a node's cores among the
stages computing (:mod:`planner.simulate.cores`): ``concurrent_devices`` of them at full
speed. Taking that to be C assumes the cores do the same work however many processes take
turns on them. A pipeline's processes do not: they block and wake at every micro-batch, and
time-sharing costs them CPU (measured on a 2-core machine, 4 processes of a CNN pipeline: 0.62
CPU seconds a step against 0.49 for the same work in 1 process, while 4 processes of plain
matrix products without communication used the same CPU time as 1). The fidelity table's
4-process rows ran 1.12-1.23 times their prediction with C; 1- and 2-process rows 0.99-1.09.

So calibrate measures it: a compute-bound pipeline of :func:`heavy_mlp` (16 Linear layers of
width 512; about 1 ms per layer and micro-batch of 64 on one core), one stage per process,
1F1B at 2P micro-batches, trained by torch pipelining on the cluster's P processes
(:func:`planner.calibrate_engines.time_plans`: idle machine, fastest of the rounds). Its
prediction, with the engine's measured overheads, falls as the capacity ``c`` rises; ``c`` is
the value where prediction and measurement meet (bisection), at most C (never more than
the cores), at least C/4. The node then computes ``c`` devices at full speed at once, and each
device's flops are its speed when all P compute at once: ``min(1, c / P)`` of one alone.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from planner import ir

MODEL = "planner.calibrate_cores:heavy_mlp"
WIDTH, DEPTH, MICRO_BATCH = 512, 16, 64
"""The measuring model: DEPTH Linear+ReLU layers of WIDTH features; samples per micro-batch."""
STEPS, ROUNDS = 6, 3
BISECTIONS = 30


def heavy_mlp() -> Any:
    """DEPTH Linear+ReLU layers of WIDTH features, then 10 classes (compute in every layer)."""
    from torch import nn

    layers: list[nn.Module] = []
    for _ in range(DEPTH):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(WIDTH, 10))


def with_capacity(cluster: ir.Cluster, capacity: float, device_flops: float) -> ir.Cluster:
    """``cluster``'s first node running ``capacity`` devices at once, each at ``min(1, capacity / P)``
    of ``device_flops`` (and of its memory bandwidth, which the cluster holds at the plain core share)."""
    node = cluster.nodes[0]
    nproc = len(node.gpus)
    share = min(1.0, capacity / nproc)
    base = node.concurrent_devices or float(nproc)
    bandwidth_scale = share / min(1.0, base / nproc)
    gpus = tuple(dataclasses.replace(g, flops=device_flops * share, memory_bandwidth_Bps=None
                                     if g.memory_bandwidth_Bps is None else g.memory_bandwidth_Bps * bandwidth_scale)
                 for g in node.gpus)
    return dataclasses.replace(cluster, nodes=(dataclasses.replace(node, gpus=gpus, concurrent_devices=capacity),
                                               *cluster.nodes[1:]))


def fit_capacity(predict: Any, measured_s: float, cores: float) -> float:
    """The capacity in ``[cores / 4, cores]`` at which ``predict(capacity)`` (falling as it rises)
    equals ``measured_s``: ``cores`` when even that is slower than measured, ``cores / 4`` when
    even that is faster."""
    lo, hi = cores / 4, cores
    if predict(hi) >= measured_s:
        return hi
    if predict(lo) <= measured_s:
        return lo
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if predict(mid) > measured_s else (lo, mid)
    return (lo + hi) / 2


def measure_capacity(cluster: ir.Cluster, threads: int, cores: float) -> tuple[float, dict[str, Any]]:
    """The node's measured capacity (module doc) and what it was fitted from. ``cluster``: the
    calibrated P-process cluster, with the torch engine's overheads when they were measured."""
    from planner.api import profile_model
    from planner.calibrate_engines import time_plans
    from planner.search import search
    from planner.simulate import SimOptions, simulate

    nproc = len(cluster.nodes[0].gpus)
    profile = profile_model(MODEL, batch_size=MICRO_BATCH * 2 * nproc, input_shape=(WIDTH,), threads=threads)
    shape = with_capacity(cluster, cores, profile.device_flops)
    plan = search(profile, shape, config=(1,) * nproc, microbatches=2 * nproc, engine="torch", schedule="1f1b",
                  optimizer="sgd", candidates=0)
    measured_s = min(time_plans([plan], "torch", threads, STEPS, ROUNDS, MODEL).times_s[0])
    quiet = SimOptions(record_events=False)

    def predict(capacity: float) -> float:
        return simulate(dataclasses.replace(plan, cluster=with_capacity(cluster, capacity, profile.device_flops)),
                        quiet).iteration_s

    capacity = fit_capacity(predict, measured_s, cores)
    return capacity, {"model": MODEL, "processes": nproc, "microbatches": 2 * nproc, "measured_s": measured_s,
                      "predicted_at_cores_s": predict(cores), "cores": cores, "capacity": capacity}

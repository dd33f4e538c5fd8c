"""``planner calibrate``'s engine step: what DeepSpeed and torch pipelining add to the cost model.

For each engine, a few plans of a tiny model (:func:`tiny_mlp`, profiled here and now; its
compute is a fraction of a millisecond, so that what the engine adds dominates each step and an
error in the layer times hardly moves the fit) on the cluster's own P processes -- one stage of
P data-parallel ranks at 1 and 4 micro-batches, and P pipeline stages at P, 2P and 4P
micro-batches, 1F1B, and for torch the data-parallel stage under ZeRO-2 and 3 too (FSDP: on this
2-core VM each gather or reduction of one unit of the tiny model cost 1.2-2.3 ms where its bytes
take microseconds, a 4-unit ZeRO-2 step 16-18 ms more than ZeRO-0; GPT-2 small's 2-process
data-parallel step took 114 ms under ZeRO-2 against 71 under ZeRO-0) and as one tensor group, every layer
row-parallel (each all-reduce or all-gather of a layer's activation cost about 1 ms on this VM where a 256 KB
all-reduce alone took 0.5: the README's mlp, searched without it, was planned as a tensor group of 2 predicted at
14.4 ms and ran at 24.6-32.9; :func:`shapes`) -- are
trained by the engine itself, through the runner's own code
(:func:`planner.runner.worker.train_plan`, the engines' ``make_trainer``), all plans of one
engine in one process group. They run on P processes, not on 2 scaled to P: with more
processes than cores the engine's per-action and per-step costs grew twice as fast as the core
share says (4 processes on 2 cores, torch: 1.05 ms per action and 17.9 ms per step, against
0.86 and 8.5 from 2 processes scaled), so only a measurement at P predicts P. Each plan's
time is the median of its timed steps after warm-up, the fastest over :data:`ROUNDS` rounds
(the engine's cost, not another user's load); each round waits for an idle machine first and is
timed again while other work took cores from it (:mod:`planner.runner.machine`: on a 2-core
machine one other busy process made 2-process pipelines 1.4 to 2 times slower), until :data:`BUSY_ROUNDS` rounds
were spoiled so (a machine busy for good: the later rounds run at once, and the report warns). The cost model
predicts each plan without overheads (``T0``) and, by the simulator, how much one second of each overhead adds to it
(its features ``f = dT / d overhead``: about ``2(M+K-1)`` actions on the critical path, the
boundary's sends, one step, the FSDP units' collectives, the tensor group's collectives). The overheads
``x >= 0`` minimise ``sum (T - T0 - f.x)^2`` (non-negative least squares: the unconstrained fit on every subset of
them, the best non-negative one), so a model that is already pessimistic charges nothing.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import socket
import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from planner import ir
from planner.errors import PlannerError, RunError
from planner.heap import keep_freed_memory
from planner.runner.machine import IDLE_CORES, IDLE_TIMEOUT_S

MODEL = "planner.calibrate_engines:tiny_mlp"
INPUT_SHAPE = (32,)
BATCH = 16
"""The least batch the calibration model is profiled and trained at (:func:`batch_size`)."""
Shape = tuple[tuple[int, ...], int, int, int]
"""(GPUs per stage, micro-batches, ZeRO stage, tensor degree) of one calibration plan."""


def shapes(nproc: int, engine: str) -> tuple[Shape, ...]:
    """The calibration plans on ``nproc`` processes: one data-parallel stage at M = 1 and 4, and
    ``nproc`` pipeline stages at M = P, 2P and 4P (torch's 1F1B needs M >= K); on 2 processes
    ((2,), 1, 0, 1), ((2,), 4, 0, 1), ((1, 1), 2, 0, 1), ((1, 1), 4, 0, 1), ((1, 1), 8, 0, 1). An engine that runs
    ZeRO-2 and 3 (torch's FSDP) also trains the data-parallel stage at ZeRO-2, M = 1 and 4, and at
    ZeRO-3, M = 4: what each unit's gathers and reductions cost beyond their bytes (``per_shard_s``);
    one whose ZeRO-1 pays it (DeepSpeed's) trains the stage at ZeRO-1, M = 1 and 4; one that runs tensor
    parallelism (torch's) trains the stage as one tensor group at M = 1 and 4, every layer row-parallel: what each
    of its collectives costs beyond its bytes (``per_collective_s``)."""
    from planner.runnable import ENGINES

    pipe = (1,) * nproc
    out: tuple[Shape, ...] = (((nproc,), 1, 0, 1), ((nproc,), 4, 0, 1), (pipe, nproc, 0, 1), (pipe, 2 * nproc, 0, 1),
                              (pipe, 4 * nproc, 0, 1))
    limits = ENGINES.get(engine)
    if limits is not None and {2, 3} <= set(limits.zero):
        out += (((nproc,), 1, 2, 1), ((nproc,), 4, 2, 1), ((nproc,), 4, 3, 1))
    if limits is not None and limits.zero1_per_unit:
        out += (((nproc,), 1, 1, 1), ((nproc,), 4, 1, 1))
    if limits is not None and limits.tensor_parallel:
        out += (((nproc,), 1, 0, nproc), ((nproc,), 4, 0, nproc))
    return out


def batch_size(nproc: int) -> int:
    """The least multiple of ``4 * nproc`` (every shape's micro-batches divide it) that is at least :data:`BATCH`."""
    step = 4 * nproc
    return step * -(-BATCH // step)


STEPS, WARMUP, ROUNDS = 8, 2, 3
ATTEMPTS = 3
"""A round is timed again (up to ATTEMPTS times in all) while other work took more than
:data:`planner.runner.machine.IDLE_CORES` cores during it; each attempt first waits up to
IDLE_TIMEOUT_S for an idle machine."""
BUSY_ROUNDS = 2
"""Rounds a process group lets other work spoil (each after waiting up to ``IDLE_TIMEOUT_S`` and measured
``ATTEMPTS`` times) before it stops waiting for an idle machine: on a machine busy for good, 3 attempts of up to 30 s
for each of a dozen rounds per engine kept ``calibrate`` waiting for most of an hour, saying nothing (a review,
2026-11-29). The rounds after run at once, and the report says how many ran on a busy machine."""
DELTA_S = 1e-3  # the overhead step the features are measured with
PROBE_REPEATS = 3
"""Whole-model passes of each speed probe after a round (:func:`time_plans`), after one untimed one."""


def tiny_mlp() -> Any:
    """The calibration model: four Linear layers of width 64 on 32 features, 10 classes (~11k parameters)."""
    from torch import nn

    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 10))


def fit_overheads(features: np.ndarray, residual_s: np.ndarray) -> ir.EngineOverhead:
    """The non-negative least-squares overheads: ``min |features @ x - residual|`` with ``x >= 0``."""
    best: tuple[float, np.ndarray] | None = None
    n = features.shape[1]
    for size in range(n + 1):
        for cols in itertools.combinations(range(n), size):
            x = np.zeros(n)
            if cols:
                sol, *_ = np.linalg.lstsq(features[:, cols], residual_s, rcond=None)
                if (sol < 0).any():
                    continue
                x[list(cols)] = sol
            err = float(np.sum((features @ x - residual_s) ** 2))
            if best is None or err < best[0] - 1e-18:
                best = (err, x)
    assert best is not None  # the empty subset always qualifies
    return ir.EngineOverhead(*(float(v) for v in best[1]))


def overhead_features(plan: ir.Plan, engine: str) -> tuple[float, np.ndarray]:
    """The plan's prediction without overheads, and what one second of each overhead adds to it."""
    from planner.simulate import SimOptions, simulate

    quiet = SimOptions(record_events=False)

    def predicted(overhead: ir.EngineOverhead | None) -> float:
        cluster = dataclasses.replace(plan.cluster, engine_overheads=((engine, overhead),) if overhead else ())
        return simulate(dataclasses.replace(plan, cluster=cluster, engine=engine), quiet).iteration_s

    base = predicted(None)
    units = [ir.EngineOverhead(**{f: DELTA_S}) for f in ir.EngineOverhead.FIELDS]
    return base, np.array([(predicted(u) - base) / DELTA_S for u in units])


def calibration_plans(profile: ir.ModelProfile, cluster: ir.Cluster, engine: str,
                      plan_shapes: Sequence[Shape]) -> list[ir.Plan]:
    """The calibration plans for ``engine`` on the devices of ``cluster``'s first node (flops pinned
    to the profile's times the node's core share, so that the cost model predicts its measured
    layer times as the cores are shared): a stage of P devices at tensor degree 1 is P data-parallel ranks, at
    degree P one tensor group whose every layer is row-parallel (``split_in``: an all-reduce of its output in
    forward, an all-gather of its input's gradient in backward). The node's hand-off cost is left out: it is what a
    hand-off costs on busy cores, and the tiny model leaves them mostly idle."""
    from planner.export.partition import manual_plan
    from planner.search import search

    node = cluster.nodes[0]
    gpus = tuple(dataclasses.replace(g, flops=profile.device_flops * node.core_share, peak_flops=()) for g in node.gpus)
    own = dataclasses.replace(cluster, nodes=(dataclasses.replace(node, gpus=gpus, handoff_s=None),),
                              engine_overheads=())
    plans = []
    for config, m, zero, tp in plan_shapes:
        if tp == 1:
            plans.append(search(profile, own, config=config, microbatches=m, engine=engine, schedule="1f1b",
                                candidates=0, tp=1, zero=zero))
            continue
        split = manual_plan(profile, own, [0, len(profile.layers)], config[0], microbatches=m, tp=tp,
                            forms=[["split_in"] * len(profile.layers)])
        plans.append(dataclasses.replace(split, engine=engine))
    return plans


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _timed_round(plan: ir.Plan, model: str, engine: str, steps: int, idle_timeout_s: float,
                 busy_rounds: list[int]) -> tuple[float, float]:
    """One round of ``plan`` on an idle machine (module doc): the median of its steps after
    :data:`WARMUP` (the slowest rank's), and the cores other work used meanwhile; the same on every rank.
    ``busy_rounds`` (one counter, the same on every rank: the background is the group's) counts the rounds other
    work spoiled; after :data:`BUSY_ROUNDS` of them the rounds neither wait nor retry."""
    import torch

    from planner.runner.machine import on_idle_machine, steps_background, wait_idle
    from planner.runner.worker import group_timing, train_plan

    dist = torch.distributed

    def measure() -> tuple[float, float]:
        dist.barrier()
        timing = group_timing(train_plan(plan, model, engine, steps, 0, "cross_entropy", profile_terms=False,
                                            measure_memory=False))
        return statistics.median(timing["iteration_s"][WARMUP:]), steps_background(timing, WARMUP) or 0.0

    def wait(limit_s: float) -> None:  # rank 0 watches the machine; the others meet it at the barrier
        if dist.get_rank() == 0:
            wait_idle(timeout_s=limit_s)

    patient = busy_rounds[0] < BUSY_ROUNDS
    t, background = on_idle_machine(measure, ATTEMPTS, idle_timeout_s if patient else 0.0, wait)
    busy_rounds[0] += background > IDLE_CORES
    return t, background


def speed_probe(model: str, batch_size: int, input_shape: tuple[int, ...] | None = None,
                repeats: int = PROBE_REPEATS) -> Callable[[], float]:
    """A probe of how fast this machine runs ``model`` now: built once, each call times its whole
    forward and backward at ``batch_size`` on this process (:func:`planner.profiler.measure.speed_s`).
    :func:`time_plans` probes after every round; scripts/validate_fidelity.py beside each profile."""
    from planner.profiler.loader import load_model
    from planner.profiler.measure import speed_s

    keep_freed_memory()  # timed as the profile and the run are (planner.heap)
    loaded = load_model(model, batch_size, input_shape)
    return lambda: speed_s(loaded.module, loaded.example_input, repeats)


def _engine_worker(rank: int, world: int, port: int, engine: str, plans_path: str, model: str, threads: int,
                   steps: int, rounds: int, idle_timeout_s: float, out: str, probe: bool = False) -> None:
    """One rank: join the group through the engine, time every plan ``rounds`` times (each round
    followed by rank 0's speed probe when ``probe``), rank 0 writes the times, the background cores
    and the probes."""
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                       "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "OMP_NUM_THREADS": str(threads)})
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch

    from planner.runner.worker import init_group

    torch.set_num_threads(threads)
    init_group(engine)
    plans = [ir.Plan.from_dict(d) for d in json.loads(Path(plans_path).read_text())]
    first = plans[0]
    speed = speed_probe(model, first.batch_size, first.profile.input_shape) if probe and rank == 0 else None
    got: dict[str, list[list[float]]] = {key: [[] for _ in plans] for key in ("times", "background_cores", "probe_s")}
    busy_rounds = [0]
    for _ in range(rounds):
        for i, plan in enumerate(plans):
            t, bg = _timed_round(plan, model, engine, steps, idle_timeout_s, busy_rounds)
            got["times"][i].append(t)
            got["background_cores"][i].append(bg)
            if probe:
                torch.distributed.barrier()
                if speed is not None:
                    got["probe_s"][i].append(speed())
                torch.distributed.barrier()
    if rank == 0:
        Path(out).write_text(json.dumps(got))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


@dataclasses.dataclass(frozen=True)
class Timings:
    """Per plan, per round: seconds per step, the cores other work used during the round, and the
    seconds of the speed probe that followed it (no probes when not asked for)."""

    times_s: tuple[tuple[float, ...], ...]
    background_cores: tuple[tuple[float, ...], ...]
    probe_s: tuple[tuple[float, ...], ...]

    @property
    def last_probe_s(self) -> float | None:
        """The probe taken last (after the last plan's last round: the rounds run plan after plan), or None."""
        return self.probe_s[-1][-1] if self.probe_s and self.probe_s[-1] else None


def time_plans(plans: Sequence[ir.Plan], engine: str, threads: int, steps: int = STEPS, rounds: int = ROUNDS,
               model: str = MODEL, idle_timeout_s: float | None = None, probe: bool = False) -> Timings:
    """Seconds per step of each plan (of one world size) trained by ``engine``, once per round: the
    median of the steps after :data:`WARMUP`, the slowest rank's, each round started on an idle
    machine (waiting up to ``idle_timeout_s``, default :data:`IDLE_TIMEOUT_S` or
    ``$PLANNER_IDLE_TIMEOUT_S``, planner.runner.machine.idle_timeout_s) and retried while
    other work took cores from it (module doc); 0: neither waiting nor retrying. ``probe``: after
    each round rank 0 times the whole model at the plan's batch on its own
    (:func:`planner.profiler.measure.speed_s`), the machine's speed then, against which a round
    can be compared with a profile taken minutes before (``probe_s``)."""
    from planner.runner.machine import idle_timeout_s as configured
    from planner.spawned import run_spawned

    idle_timeout_s = configured(IDLE_TIMEOUT_S) if idle_timeout_s is None else idle_timeout_s

    world = plans[0].world_size
    if steps <= WARMUP or any(p.world_size != world for p in plans):
        raise RunError(f"{len(plans)} plans of world sizes {sorted({p.world_size for p in plans})} with {steps} "
                       "steps", f"time plans of one world size, with more than {WARMUP} steps")
    with tempfile.TemporaryDirectory(prefix="planner-calibrate-engine-") as tmp:
        plans_path, out = os.path.join(tmp, "plans.json"), os.path.join(tmp, "times.json")
        Path(plans_path).write_text(json.dumps([p.to_dict() for p in plans]))
        args = (world, _free_port(), engine, plans_path, model, threads, steps, rounds, idle_timeout_s, out, probe)
        doc = run_spawned(_engine_worker, args, world, out, f"training with {engine} failed",
                          f"leave the engine out (calibrate --engines), or run `planner run` on a plan with "
                          f"--engine {engine} to see the cause", RunError)
        return Timings(*(tuple(tuple(float(t) for t in row) for row in doc[key])
                         for key in ("times", "background_cores", "probe_s")))


def measure_engine(cluster: ir.Cluster, engine: str, threads: int, profile: ir.ModelProfile,
                   plan_shapes: Sequence[Shape], steps: int = STEPS,
                   rounds: int = ROUNDS) -> tuple[ir.EngineOverhead, list[dict[str, Any]]]:
    """``engine``'s fitted overheads on this machine, and every calibration run (plan, measured, predicted)."""
    plans = calibration_plans(profile, cluster, engine, plan_shapes)
    timings = time_plans(plans, engine, threads, steps, rounds)
    measured = [min(row) for row in timings.times_s]
    rows = [overhead_features(p, engine) for p in plans]
    base = np.array([b for b, _ in rows])
    features = np.array([f for _, f in rows])
    overhead = fit_overheads(features, np.array(measured) - base)
    fitted = base + features @ np.array([getattr(overhead, f) for f in ir.EngineOverhead.FIELDS])
    runs = [{"config": p.config, "microbatches": p.microbatches, "zero": p.stages[0].zero, "tp": p.stages[0].tp,
             "measured_s": t,
             "predicted_s": float(b), "fitted_s": float(f), "busy_rounds": sum(c > IDLE_CORES for c in cores)}
            for p, t, b, f, cores in zip(plans, measured, base, fitted, timings.background_cores, strict=True)]
    return overhead, runs


def measure_engines(cluster: ir.Cluster, engines: Sequence[str], threads: int,
                    ) -> tuple[tuple[tuple[str, ir.EngineOverhead], ...], dict[str, Any]]:
    """Every engine's overheads (in the cluster's engine order) and their runs, over one tiny profile,
    on the processes of ``cluster``'s first node (at its core share)."""
    from planner.api import profile_model
    from planner.runner.launch import engine_available

    for engine in engines:
        try:
            engine_available(engine)
        except PlannerError as exc:
            others = [e for e in engines if e != engine]
            raise RunError(exc.cause, f"install it, or leave it out: --engines {','.join(others) or 'none'}",
                               ) from None
    nproc = len(cluster.nodes[0].gpus)
    batch = batch_size(nproc)
    profile = profile_model(MODEL, batch_size=batch, input_shape=INPUT_SHAPE, threads=threads)
    overheads, runs = [], {}
    for engine in engines:
        overhead, rows = measure_engine(cluster, engine, threads, profile, shapes(nproc, engine))
        overheads.append((engine, overhead))
        runs[engine] = rows
    return tuple(overheads), {"model": MODEL, "batch_size": batch, "processes": nproc, "runs": runs}

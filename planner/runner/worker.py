"""The torchrun worker of ``planner run`` (``python -m planner.runner.worker``), one per rank.

Each worker builds the model from the same seed, splits it into the profiled layers, builds
the engine's pipeline (planner.export.deepspeed or planner.export.torch), trains ``steps``
steps on synthetic data of the profile's input shape (the same data on every process: a
seeded generator per step) and times every step between barriers (the slowest rank counts).
After the timed steps it trains one more step under the torch profiler (CPU events) and puts
its time in terms (:mod:`planner.runner.terms`). It measures its peak memory as
:mod:`planner.runner.memory` says: on CUDA over the whole run, on CPU the heap in use over one
more untimed step, the layers this rank runs counted and the other stages' left out. Under ``--check`` (any
server's launcher asking: ``--weights``) every rank projects its layers' weights after the timed steps
(:mod:`planner.runner.fingerprint`) and the projections are gathered. Local rank 0
of every server writes the result (losses, times, every rank's peak, node rank and terms) as
JSON; a worker that fails writes when and why in ``error-rank<N>.txt`` first. :func:`train_plan` (one plan in
a process group that is already up) is also what ``planner calibrate`` times its pipelines with.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from planner import ir
from planner.export import ENGINES, deepspeed
from planner.export.building import build_turn, release_others
from planner.export.data import data_spec
from planner.export.layers import disable_dropout, load_layers
from planner.export.nodes import rank_chunks
from planner.export.program import engine_module
from planner.export.torch import device
from planner.heap import keep_freed_memory
from planner.runner import memory
from planner.runner.fingerprint import fingerprints, merge
from planner.runner.machine import busy_cpu_s
from planner.runner.processes import error_line, write_error
from planner.runner.terms import MEASURED, STEP_RANGE, Span, classify, timeline_terms

Step = Callable[[torch.Tensor, torch.Tensor], float]


def init_group(engine: str) -> None:
    """Join the process group: gloo on CPU, nccl on CUDA (DeepSpeed through its own init)."""
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if engine == "deepspeed":
        import deepspeed as ds

        deepspeed.skip_shm_build()
        ds.init_distributed(dist_backend=backend)
    else:
        torch.distributed.init_process_group(backend)
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))


def _train(step_fn: Step, data: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[list[float], ...]:
    """Every step between barriers: losses, wall seconds, this process's CPU seconds and the
    machine's busy CPU seconds (all its cores, every process: :mod:`planner.runner.machine`; 0 where unknown)."""
    losses, times, cpu, machine = [], [], [], []
    for x, y in data:
        torch.distributed.barrier()
        b0, t0, c0 = busy_cpu_s(), time.perf_counter(), time.process_time()
        loss = step_fn(x, y)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        b1 = busy_cpu_s()
        machine.append(b1 - b0 if b0 is not None and b1 is not None else 0.0)
        losses.append(loss)
    return losses, times, cpu, machine


def group_timing(res: dict[str, Any]) -> dict[str, list[float]]:
    """:func:`train_plan`'s per-step times over the process group, the same on every rank: the
    slowest rank's wall (``iteration_s``) and CPU (``cpu_s``) seconds, every rank's CPU seconds
    summed (``all_cpu_s``) and the machine's busy seconds as rank 0 read them (``machine_busy_s``;
    :func:`planner.runner.machine.steps_background` turns the last two into other work's cores)."""
    dist = torch.distributed
    slowest = torch.tensor([res["iteration_s"], res["cpu_s"]], dtype=torch.float64, device=device())
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    machine = res["machine_busy_s"] if dist.get_rank() == 0 else [0.0] * len(res["machine_busy_s"])
    used = torch.tensor([res["cpu_s"], machine], dtype=torch.float64, device=device())
    dist.all_reduce(used)
    return {"iteration_s": slowest[0].tolist(), "cpu_s": slowest[1].tolist(), "all_cpu_s": used[0].tolist(),
            "machine_busy_s": used[1].tolist()}


def _any_rank(flag: bool) -> bool:
    """Whether ``flag`` is set on any rank of the group."""
    value = torch.tensor([int(flag)], dtype=torch.int64, device=device())
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
    return bool(value.item())


def _gather_objects(value: dict[str, float]) -> list[dict[str, float]]:
    """Every rank's ``value``, in rank order."""
    out: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, value)
    return out


def _gather(values: list[int]) -> list[list[int]]:
    """Every rank's ``values``, in rank order."""
    dev = device()
    out = [torch.zeros(len(values), dtype=torch.int64, device=dev) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(out, torch.tensor(values, dtype=torch.int64, device=dev))
    return [[int(v) for v in t.tolist()] for t in out]


def profiled_step(step_fn: Step, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """One more step under the torch profiler: its seconds per measured term (:func:`step_terms`; on a GPU
    the kernels' time too)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    on_gpu = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if on_gpu else [])]
    torch.distributed.barrier()
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        with record_function(STEP_RANGE):
            step_fn(x, y)
        if on_gpu:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    return step_terms([e for e in prof.events() if e.cpu_parent is None], wall, on_gpu)


def step_terms(top: Sequence[Any], wall_s: float, on_gpu: bool) -> dict[str, float]:
    """Seconds per measured term from a step's top-level profiler events: on a GPU the time of the kernels
    each operator launched (``device_time_total``: its CPU event ends when it has queued them, so its CPU
    time says little), else, or where the profiler recorded no kernel, the operator's CPU time: on the
    timeline of the step's :data:`STEP_RANGE` (gloo's waits, :func:`planner.runner.terms.timeline_terms`)
    where it is among ``top``."""
    if on_gpu:
        terms = classify(top, wall_s, _device_s)
        if any(terms[t] > 0 for t in MEASURED if t != "other"):
            return terms
    step = next((e for e in top if e.name == STEP_RANGE), None)
    if step is None:
        return classify(top, wall_s, _host_s)
    return timeline_terms(_span(step), [_span(e) for e in top if e is not step], wall_s)


def _span(event: Any) -> Span:
    """A profiler event (and those inside it) as a :class:`planner.runner.terms.Span`."""
    return Span(event.name, int(event.thread), event.time_range.start * 1e-6, event.time_range.end * 1e-6,
                tuple(_span(c) for c in event.cpu_children))


def _device_s(event: Any) -> float:
    return float(event.device_time_total) * 1e-6


def _host_s(event: Any) -> float:
    return float(event.time_range.elapsed_us()) * 1e-6


def train_plan(plan: ir.Plan, model: str, engine: str, steps: int, seed: int, loss: str,
               profile_terms: bool = True, measure_memory: bool = True, weights: bool = False) -> dict[str, Any]:
    """Train ``plan`` for ``steps`` timed steps in this (already joined) process group: this rank's
    ``losses``, ``iteration_s``, ``cpu_s``, the machine's ``machine_busy_s`` per step,
    ``terms`` (one profiled step, where ``profile_terms``), ``peak_memory_bytes`` (where
    ``measure_memory``: on CPU three more untimed steps, :mod:`planner.runner.memory`) and, where
    ``weights``, the projections of its layers' weights after the timed steps (``--check``:
    :mod:`planner.runner.fingerprint`)."""
    with build_turn(plan):  # planner.export.building: a server's processes build in turns where needed
        layers, example = load_layers(model, plan, seed)
        for layer in layers:
            disable_dropout(layer)
        spec = data_spec(layers, example, loss)
        data = [spec.batch(s, plan.batch_size, seed) for s in range(steps + 2)]
        if measure_memory:
            memory.warm_math(layers, data[0][0][:max(1, plan.batch_size // plan.microbatches)])
        release_others(layers, plan, torch.distributed.get_rank())  # this rank's stages' weights only
    probe = memory.start(_own_layers(plan, layers))
    step_fn = engine_module(engine).make_trainer(layers, plan, spec.loss)
    losses, times, cpu, machine = _train(step_fn, data[:steps])
    res: dict[str, Any] = {"losses": losses, "iteration_s": times, "cpu_s": cpu, "machine_busy_s": machine}
    if weights:  # before the untimed steps below train the weights further
        res["weights"] = fingerprints(layers, _own_indices(plan))
    if measure_memory:  # before the profiled step: the profiler's buffers are not the plan's
        res["peak_memory_bytes"] = probe.peak_bytes(lambda: _barrier_step(step_fn, *data[steps + 1]))
    res["terms"] = profiled_step(step_fn, *data[steps]) if profile_terms else {}
    return res


def _own_indices(plan: ir.Plan) -> list[int]:
    """The indices of the layers this rank runs, in the order of its chunks (the same on every rank of a stage)."""
    return [i for chunk in rank_chunks(plan, torch.distributed.get_rank()) for i in range(*chunk.layers)]


def _own_layers(plan: ir.Plan, layers: Sequence[torch.nn.Module]) -> list[torch.nn.Module]:
    """The layers this rank runs (every worker builds the whole model, and keeps these)."""
    return [layers[i] for i in _own_indices(plan)]


def _barrier_step(step_fn: Step, x: torch.Tensor, y: torch.Tensor) -> None:
    """One untimed step, every rank starting together."""
    torch.distributed.barrier()
    step_fn(x, y)


def _worker(args: argparse.Namespace) -> None:
    keep_freed_memory()  # freed tensors reused, as on a GPU and in the CPU profile (planner.heap)
    torch.set_num_threads(args.threads)
    plan = ir.Plan.from_dict(json.loads(Path(args.plan).read_text()))
    init_group(args.engine)
    weights = _any_rank(args.weights)  # each server's launcher says whether it checks: all ranks gather alike
    res = train_plan(plan, args.model, args.engine, args.steps, args.seed, args.loss, weights=weights)
    # torchrun's node rank (GROUP_RANK) says which server really ran each rank
    peaks, nodes = zip(*_gather([res["peak_memory_bytes"], int(os.environ.get("GROUP_RANK", "0"))]), strict=True)
    timing = group_timing(res)
    dev, ranks = device(), torch.distributed.get_world_size()
    terms = [torch.zeros(len(MEASURED), dtype=torch.float64, device=dev) for _ in range(ranks)]
    mine = torch.tensor([res["terms"][k] for k in MEASURED], dtype=torch.float64, device=dev)
    torch.distributed.all_gather(terms, mine)
    projections = _gather_objects(res["weights"]) if weights else None
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:  # every server's launcher gets the result
        (Path(args.out) / "result.json").write_text(json.dumps(
            {"losses": res["losses"], **timing, "peak_memory_bytes": peaks, "node_rank": nodes,
             "terms": [dict(zip(MEASURED, x.tolist(), strict=True)) for x in terms],
             **({"weights": merge(projections)} if projections is not None else {})}))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m planner.runner.worker", description="planner run's worker (torchrun)")
    ap.add_argument("--plan", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--engine", choices=ENGINES, required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--loss", default="cross_entropy")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True)
    ap.add_argument("--weights", action="store_true", help="report the weights' projections (planner run --check)")
    args = ap.parse_args(argv)
    rank = os.environ.get("RANK", "0")
    try:
        _worker(args)
        # The result is written and the group destroyed: leave without the interpreter's teardown. torch's
        # profiler (Kineto) can abort in its static destructors at exit ("terminate called without an active
        # exception", SIGABRT, seen once in the suite after a profiled step), failing a run that succeeded.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            write_error(Path(args.out), rank, error_line(exc))
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)


if __name__ == "__main__":
    main()

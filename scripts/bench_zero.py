#!/usr/bin/env python
"""An engine's ZeRO stages, measured against predicted on this machine (docs/fidelity.md, "torch's ZeRO-2/3").

One data-parallel stage of 2 processes (1 thread each) of ``--model``, searched with ``--engine``
(torch: ZeRO 0-3; deepspeed: 0 and 1) for each of ``--microbatches``, on this machine calibrated by
``planner.calibrate.calibrate`` against the model's own profile (the engine's overheads, torch's
FSDP ``per_shard_s`` among them). Each plan is trained by the runner's own code:

- time: :func:`planner.calibrate_engines.time_plans` (the median step, the fastest of ``--rounds``);
- memory: the heap in use (glibc ``mallinfo2``, sampled every 0.2 ms by a thread) over the trainer's
  set-up and ``--steps`` steps, its peak above the heap before the layers are built, the larger of
  the two ranks': what CUDA's ``max_memory_allocated`` would say on a GPU, without the allocator's
  slack that RSS growth holds (and with buffers allocated but never touched, which a GPU holds too).

It prints per plan measured and predicted, and each over ZeRO-0's at the same M (a machine slower or
faster than at the profile moves both alike), then two checks: at each M the ZeRO stage the model
predicts fastest is the fastest measured (within 5%), and the model puts each stage's memory on the
side of ZeRO-0's that the heap does (under torch ZeRO-2 and 3 hold more than ZeRO-1, as its schedules
keep FSDP's weights gathered and gradients unreduced until the step's end; ZeRO-0 and 1 copy the
gradients into flat buckets to all-reduce them; DeepSpeed's ZeRO-1 holds two reduction buffers).
The heap is measured after one untimed step of the first plan (the process's first-use allocations).
About 1-2 minutes for the default model. Linux only.

    .venv/bin/python scripts/bench_zero.py [--engine torch|deepspeed] [--model mlp] [--batch 16]
        [--microbatches 1,4] [--rounds 3] [--steps 6]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
FASTEST_TOLERANCE = 1.05


def _heap_worker(rank: int, world: int, port: int, plans_path: str, model: str, steps: int, out: str,
                 engine: str) -> None:
    """One rank: every plan's heap peak above the heap before its layers are built."""
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                       "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    import torch

    from planner import ir
    from planner.runner.memory import heap_in_use_bytes, heap_peak
    from planner.runner.worker import init_group, train_plan

    torch.set_num_threads(1)
    init_group(engine)
    docs = json.loads(Path(plans_path).read_text())
    train_plan(ir.Plan.from_dict(docs[0]), model, engine, 1, 0, "cross_entropy", profile_terms=False,
               measure_memory=False)  # first-use allocations
    peaks = []
    for doc in docs:
        gc.collect()  # the last plan's trainer (its reference cycles) freed before the base, not during this plan
        base = heap_in_use_bytes() or 0
        with heap_peak() as peak:
            train_plan(ir.Plan.from_dict(doc), model, engine, steps, 0, "cross_entropy", profile_terms=False,
                       measure_memory=False)
        peaks.append(max(0, peak[0] - base))
    mine = torch.tensor(peaks, dtype=torch.float64)
    torch.distributed.all_reduce(mine, op=torch.distributed.ReduceOp.MAX)
    if rank == 0:
        Path(out).write_text(json.dumps(mine.tolist()))
    torch.distributed.destroy_process_group()


def heap_peaks(plans: list[Any], model: str, steps: int, engine: str) -> list[float]:
    """Each plan's heap peak in bytes (the larger rank's), its ranks in one process group."""
    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    with tempfile.TemporaryDirectory(prefix="planner-bench-zero-") as tmp:
        plans_path, out = os.path.join(tmp, "plans.json"), os.path.join(tmp, "peaks.json")
        Path(plans_path).write_text(json.dumps([p.to_dict() for p in plans]))
        mp.start_processes(_heap_worker, args=(2, port, plans_path, model, steps, out, engine), nprocs=2, join=True,
                           start_method="spawn")
        return [float(x) for x in json.loads(Path(out).read_text())]


def plans_for(args: argparse.Namespace) -> list[Any]:
    """The model profiled, this machine calibrated against it, and one plan per (M, ZeRO stage)."""
    from planner.api import profile_model
    from planner.calibrate import calibrate
    from planner.search import search

    prof = profile_model(args.model, batch_size=args.batch, threads=1)
    cluster, _ = calibrate(2, 1, profile=prof, engines=[args.engine])
    over = cluster.engine_overhead(args.engine)
    print(f"calibrated: {args.engine} per unit's collective (FSDP's gathers and reductions, DeepSpeed ZeRO-1's) "
          f"{(over.per_shard_s if over else 0) * 1e3:.3f} ms", file=sys.stderr)
    return [search(prof, cluster, config=(2,), tp=1, zero=z, microbatches=m, engine=args.engine, schedule="1f1b",
                   candidates=0) for m in args.microbatches for z in zeros(args.engine)]


def zeros(engine: str) -> tuple[int, ...]:
    """The ZeRO stages ``engine`` runs."""
    from planner.runnable import ENGINES

    return ENGINES[engine].zero


def report(plans: list[Any], times_s: list[float], peaks: list[float], stages: tuple[int, ...]) -> bool:
    """The table and the two checks (module doc); whether both pass."""
    print(f"{'M':>3} {'ZeRO':>4} {'measured ms':>11} {'predicted ms':>12} {'ratio':>6} {'meas/ZeRO-0':>11} "
          f"{'pred/ZeRO-0':>11} {'heap MiB':>9} {'predicted MiB':>13}")
    fastest_ok, memory_ok = True, True
    for i in range(0, len(plans), len(stages)):
        group = list(range(i, i + len(stages)))
        pred = [plans[j].predicted.iteration_s for j in group]
        meas = [times_s[j] for j in group]
        mem_pred = [max(s.memory_bytes for s in plans[j].stages) for j in group]
        for z, j in enumerate(group):
            print(f"{plans[j].microbatches:>3} {stages[z]:>4} {meas[z] * 1e3:>11.1f} {pred[z] * 1e3:>12.1f} "
                  f"{meas[z] / pred[z]:>6.3f} {meas[z] / meas[0]:>11.2f} {pred[z] / pred[0]:>11.2f} "
                  f"{peaks[j] / 2**20:>9.1f} {mem_pred[z] / 2**20:>13.1f}")
        best = min(range(len(stages)), key=lambda z: pred[z])
        fastest_ok &= meas[best] <= FASTEST_TOLERANCE * min(meas)
        memory_ok &= all((mem_pred[z] >= mem_pred[0]) == (peaks[group[z]] >= peaks[group[0]])
                         for z in range(1, len(stages)))
    print(f"the predicted fastest ZeRO stage is the measured fastest (within {FASTEST_TOLERANCE - 1:.0%}) at every M: "
          f"{'PASS' if fastest_ok else 'FAIL'}")
    print("the model puts each ZeRO stage's memory on the side of ZeRO-0's that the heap does, at every M: "
          + ("PASS" if memory_ok else "FAIL"))
    return fastest_ok and memory_ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mlp", help="its weights should outweigh its activations, so that "
                    "ZeRO's memory shows (the zoo mlp: 11 MiB of weights, activations of a few KiB a sample)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--microbatches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--engine", choices=["torch", "deepspeed"], default="torch")
    args = ap.parse_args()
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "scripts"), *filter(None, [os.environ.get("PYTHONPATH")])])
    from planner.calibrate_engines import time_plans

    plans = plans_for(args)
    times = [min(r) for r in time_plans(plans, args.engine, 1, args.steps, args.rounds, model=args.model).times_s]
    peaks = heap_peaks(plans, args.model, 4, args.engine)
    print(f"{args.model}, batch {args.batch}, 2 processes x 1 thread, {args.engine}; time: fastest of {args.rounds} "
          f"rounds' median step; heap: peak in use over set-up and 4 steps, the larger rank "
          f"(load {os.getloadavg()[0]:.1f})")
    return 0 if report(plans, times, peaks, zeros(args.engine)) else 1


if __name__ == "__main__":
    sys.exit(main())

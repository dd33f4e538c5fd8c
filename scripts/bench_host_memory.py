#!/usr/bin/env python
"""Host memory of a pipeline's processes while they build the model: measured against what each should hold.

Every rank of a plan builds the whole model in fp32 (the same seed everywhere, so its stages' weights are
those of one process building it), then frees the weights of the layers it does not run
(:func:`planner.export.building.release_others`); a server's processes build in turns where whole models
would not fit half its memory (:func:`planner.export.building.build_turn`). This script shows both on this
machine with the functions ``planner run`` and the exported programs call:

* **per rank**: K processes, one after the other (nothing else in memory), each builds the model as a worker
  does (:func:`planner.export.layers.load_layers`), then releases. Printed: the resident set's growth over
  the bare process (everything the build imports loaded) after the build and after the release, and the
  bytes of the weights and buffers the rank keeps (its stages' layers and their tie groups'). Target: after
  the release, within ``--low``..``--high`` of the kept bytes (plus ``--slack-mib``, 0 by default);
* **a server's peak**: the K processes at once under :func:`build_turn`, first with room for all (every rank
  builds at once), then told the host holds two whole models (one slot: they take turns); the
  summed resident set of the K processes, sampled every 10 ms. Target: with turns, at most one whole model
  plus the others' kept layers, over the bare processes (within ``--high``), and below the all-at-once peak.

Exit 1 if a target is missed. About two minutes for GPT-2 medium on 4 stages.

    .venv/bin/python scripts/bench_host_memory.py [--model gpt2-medium] [--stages 4] [--low 0.9] [--high 1.15]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MIB = 2**20


def rss_bytes(pid: int | str = "self") -> int:
    """A process's resident set now (Linux /proc; 0 once it has gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    kib = next((line.split()[1] for line in text.splitlines() if line.startswith("VmRSS:")), "0")
    return int(kib) * 1024


def trim() -> None:
    """Hand freed heap back to the system (glibc), as a long run's allocator eventually does."""
    import ctypes

    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def make_plan(model: str, stages: int) -> Any:
    """A ``stages``-stage 1F1B pipeline of ``model`` (analytic profile: no compute here) on one server."""
    from planner import api, ir

    prof = api.profile_model(model, batch_size=stages, mode="analytic", device_flops="a100")
    gpus = [{"name": f"n0.g{i}", "flops": 1e12, "memory_bytes": 2**36} for i in range(stages)]
    link = {"bandwidth_Bps": 1e10, "latency_s": 1e-5}
    cluster = ir.Cluster.from_dict({"kind": "cluster", "version": 1, "name": "host", "nodes": [
        {"name": "n0", "gpus": gpus}], "links": {"intra_node": link, "inter_node": link}})
    return api.search_plan(prof, cluster, engine="torch", config=(1,) * stages, microbatches=stages, candidates=0)


def kept_bytes(layers: Any, plan: Any, rank: int) -> int:
    """The bytes of the distinct weights and buffers of the layers ``rank`` keeps (its stages' and their tie
    groups', :func:`planner.export.building.kept_layers`)."""
    from planner.export.building import kept_layers

    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for i in kept_layers(layers, plan, rank)
                for t in [*layers[i].parameters(), *layers[i].buffers()]}
    return sum(storages.values())


def bare_rss(plan: Any, model: str) -> int:
    """The process's resident set once everything the build imports is loaded (the model built once on the
    meta device: no weights), so that the growth after it is the weights'."""
    import torch

    from planner.export.layers import load_layers

    torch.set_num_threads(1)
    with torch.device("meta"):
        load_layers(model, plan, seed=0)
    trim()
    return rss_bytes()


def _one_rank(plan: Any, model: str, rank: int, queue: Any) -> None:
    """Build, measure, release, measure (one rank alone)."""
    from planner.export.building import release_others
    from planner.export.layers import load_layers

    bare = bare_rss(plan, model)
    layers, _ = load_layers(model, plan, seed=0)
    built = rss_bytes()
    want = kept_bytes(layers, plan, rank)
    freed = release_others(layers, plan, rank)
    trim()
    queue.put((rank, bare, built, rss_bytes(), freed, want))


def _turn_rank(plan: Any, model: str, rank: int, host_bytes: int, folder: str, port: str, queue: Any) -> None:
    """One of the server's processes building under build_turn, then holding its layers a moment."""
    import torch

    from planner.export.building import build_turn, release_others
    from planner.export.layers import load_layers

    torch.set_num_threads(1)
    env = {"LOCAL_WORLD_SIZE": str(plan.world_size), "LOCAL_RANK": str(rank), "MASTER_PORT": port,
           "MASTER_ADDR": "127.0.0.1"}
    with build_turn(plan, env=env, host_bytes=host_bytes, folder=folder, poll_s=0.02):
        layers, _ = load_layers(model, plan, seed=0)
        want = kept_bytes(layers, plan, rank)
        release_others(layers, plan, rank)
        trim()
    queue.put(want)
    time.sleep(0.5)


def per_rank(plan: Any, model: str) -> list[tuple[int, int, int, int, int, int]]:
    ctx = mp.get_context("spawn")
    out = []
    for rank in range(plan.world_size):
        queue = ctx.Queue()
        proc = ctx.Process(target=_one_rank, args=(plan, model, rank, queue))
        proc.start()
        out.append(queue.get())
        proc.join()
    return out


def server_peak(plan: Any, model: str, host_bytes: int, port: str) -> tuple[int, int]:
    """(peak summed resident set, summed kept bytes) of the K processes at once."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as folder:
        procs = [ctx.Process(target=_turn_rank, args=(plan, model, r, host_bytes, folder, port, queue))
                 for r in range(plan.world_size)]
        for p in procs:
            p.start()
        peak = 0
        while any(p.is_alive() for p in procs):
            peak = max(peak, sum(rss_bytes(p.pid) for p in procs if p.pid is not None))
            time.sleep(0.01)
        for p in procs:
            p.join()
        kept = sum(queue.get() for _ in procs)
    return peak, kept


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpt2-medium")
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--low", type=float, default=0.9)
    ap.add_argument("--high", type=float, default=1.15)
    ap.add_argument("--slack-mib", type=float, default=0.0)
    args = ap.parse_args()
    plan = make_plan(args.model, args.stages)
    whole = 4 * plan.profile.param_count
    print(f"{args.model}: {plan.profile.param_count / 1e6:.0f}M parameters, whole model {whole / MIB:.0f} MiB fp32; "
          f"{args.stages} stages {'-'.join(str(s.layers[1] - s.layers[0]) for s in plan.stages)} layers")
    print(f"{'rank':>4} {'built MiB':>10} {'kept MiB':>9} {'predicted':>10} {'ratio':>6} {'freed MiB':>10}")
    ok = True
    ranks = per_rank(plan, args.model)
    for rank, bare, built, kept, freed, held in ranks:
        want = held + args.slack_mib * MIB
        ratio = (kept - bare) / want
        ok &= args.low <= ratio <= args.high
        print(f"{rank:>4} {(built - bare) / MIB:>10.0f} {(kept - bare) / MIB:>9.0f} {want / MIB:>10.0f} "
              f"{ratio:>6.2f} {freed / MIB:>10.0f}")
    bare = sum(r[1] for r in ranks)  # every process's own before its build (the imports included)
    together, _ = server_peak(plan, args.model, 2**50, "29911")
    turns, kept_all = server_peak(plan, args.model, 2 * whole, "29912")  # half of it: one slot
    bound = whole + kept_all
    ok &= turns - bare <= args.high * bound and turns < together
    print(f"server peak over the bare processes: all at once {(together - bare) / MIB:.0f} MiB "
          f"({args.stages} whole models: {args.stages * whole / MIB:.0f}); in turns {(turns - bare) / MIB:.0f} MiB "
          f"(target <= one whole model + every rank's kept layers = {bound / MIB:.0f} x {args.high})")
    print(f"{'all targets met' if ok else 'a target missed'} (load {os.getloadavg()[0]:.1f})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

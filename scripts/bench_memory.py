#!/usr/bin/env python
"""A run's peak memory per rank, measured against the plan's prediction, on this machine.

Each plan (2 processes x 1 thread: data parallel under each ZeRO stage an engine runs, a tensor-parallel
stage, two pipeline stages at one and at four micro-batches; Adam, fp32) is searched for its engine on a
2-device cluster (times do not matter here), then trained by ``planner run``'s own code
(:func:`planner.api.run_plan`), which reads each rank's peak as :mod:`planner.runner.memory` says: the heap
in use over one more step, the rank's own layers counted and the other stage's left out. Models: the zoo
MLP (weights 11 MiB, activations a few KiB a sample: the weights, gradients, optimizer state and their
copies show) and a GPT-2 of 4 blocks (``scripts/fidelity_models.py``: activations show).

It prints per plan and rank measured, predicted and their ratio; target: every rank within
``--low``..``--high`` (the heap also holds what a process allocates on its first steps, 2-3 MiB here:
gloo's buffers, autograd's, the engines' own). Exit 1 if a rank is outside. About 4 minutes.

    .venv/bin/python scripts/bench_memory.py [--models mlp,gpt2] [--low 0.9] [--high 1.2]
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from fidelity_models import MODELS, spec  # noqa: E402 (after the path set-up)


@dataclass(frozen=True)
class Case:
    """One plan to run: its engine and the search's fixed choices."""

    engine: str
    config: tuple[int, ...]
    microbatches: int
    zero: int = 0
    tp: int = 1

    @property
    def label(self) -> str:
        shape = "-".join(map(str, self.config))
        return f"{self.engine} {shape} tp{self.tp} ZeRO-{self.zero} M={self.microbatches}"


CASES = {
    "mlp": [Case("torch", (2,), 1, zero=z) for z in (0, 1, 2, 3)] + [
        Case("torch", (2,), 4), Case("torch", (2,), 1, tp=2), Case("torch", (1, 1), 4),
        Case("deepspeed", (2,), 1), Case("deepspeed", (2,), 4, zero=1), Case("deepspeed", (1, 1), 1),
        Case("deepspeed", (1, 1), 4)],
    "gpt2": [Case("torch", (2,), 2), Case("torch", (1, 1), 4), Case("deepspeed", (1, 1), 4)],
}


def cluster() -> Any:
    """Two devices on one server, memory to spare (only the memory prediction matters here)."""
    from planner import ir

    gpus = [{"name": f"n0.g{i}", "flops": 1e11, "memory_bytes": 2**34} for i in range(2)]
    link = {"bandwidth_Bps": 1e9, "latency_s": 1e-5}
    nodes = [{"name": "n0", "gpus": gpus}]
    return ir.Cluster.from_dict({"kind": "cluster", "version": 1, "name": "two", "nodes": nodes,
                                 "links": {"intra_node": link, "inter_node": link}})


def model_spec(name: str) -> tuple[str, int]:
    """(model spec, batch size) of a model name: the zoo MLP, or a table model."""
    return ("mlp", 64) if name == "mlp" else (spec(name), MODELS[name][1])


def run_case(model: str, prof: Any, case: Case) -> list[tuple[float, float]]:
    """Each rank's (measured, predicted) peak bytes of ``case``'s plan for ``model`` profiled as ``prof``."""
    from planner import api

    plan = api.search_plan(prof, cluster(), engine=case.engine, config=case.config, microbatches=case.microbatches,
                           optimizer="adam", zero=case.zero, tp=case.tp, candidates=0)
    doc = api.run_plan(plan, model, engine=case.engine, steps=2, warmup=1)
    return [(r["peak_memory_bytes"], r["predicted_memory_bytes"]) for r in doc["ranks"]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="mlp,gpt2")
    ap.add_argument("--low", type=float, default=0.9)
    ap.add_argument("--high", type=float, default=1.2)
    args = ap.parse_args()
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "scripts"), *filter(None, [os.environ.get("PYTHONPATH")])])
    print(f"{'model':<6} {'plan':<32} {'rank':>4} {'measured MiB':>12} {'predicted MiB':>13} {'ratio':>6}")
    from planner import api

    ratios = []
    for name in args.models.split(","):
        model, batch = model_spec(name)
        prof = api.profile_model(model, batch_size=batch, threads=1, repeats=3, warmup=1)
        for case in CASES[name]:
            for rank, (got, want) in enumerate(run_case(model, prof, case)):
                ratios.append(got / want)
                print(f"{name:<6} {case.label:<32} {rank:>4} {got / 2**20:>12.1f} {want / 2**20:>13.1f} "
                      f"{got / want:>6.2f}", flush=True)
    inside = sum(args.low <= r <= args.high for r in ratios)
    print(f"ranks within {args.low}..{args.high}: {inside} of {len(ratios)} (measured/predicted "
          f"{min(ratios):.2f}..{max(ratios):.2f}; load {os.getloadavg()[0]:.1f})")
    return 0 if inside == len(ratios) else 1


if __name__ == "__main__":
    sys.exit(main())

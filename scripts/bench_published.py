"""Published large-scale configurations as plans, against the planner's own plans.

Megatron-LM's weak-scaling runs (Narayanan et al., "Efficient Large-Scale Language Model
Training on GPU Clusters Using Megatron-LM", SC'21, Table 1): GPT models of 1.7B to 76.1B
parameters (sequence 2048, vocabulary 51200) on 32 to 1024 A100 80GB GPUs (DGX A100 servers:
8 GPUs on NVLink, 8 HDR InfiniBand NICs), mixed precision, Adam, full activation
recomputation, with the tensor (t), pipeline (p) and data-parallel degrees and global batch
the table gives; the paper reports the achieved TFLOP/s per GPU (model FLOPs with
recomputation, 96 B s l h^2 (1 + s/6h + V/16lh), section 5.1).

For each row this prints: the published configuration written as a plan (stages of t x d
GPUs, micro-batch size 1, 1F1B, ZeRO 0 as Megatron-LM ran then) -- whether it fits in 80 GB
and its predicted iteration and TFLOP/s per GPU beside the paper's; and the planner's own
plan for the same model, GPUs and batch (bf16, Adam, every tensor degree, ZeRO stage and
recomputation mode) -- its config, whether it fits, its predicted iteration and the search
time. Targets: the published plan fits; the planner's plan fits and is predicted at least as
fast; predicted/published TFLOP/s within 0.85..1.15 (issue 15's figure).

Profiles are synthetic (scripts/synthetic.py: closed-form FLOPs and activation bytes, times
at 50% of the bf16 peak), so no torch is needed. ``--rows N`` runs the first N rows.
"""

from __future__ import annotations

import argparse
import time

from synthetic import cluster, gpt_profile

from planner import ir
from planner.costmodel import plan_memory, stage_costs
from planner.judge import judge
from planner.search import search

# (name, heads, hidden, layers, t, p, gpus, batch, published TFLOP/s per GPU) -- SC'21 Table 1
ROWS = [
    ("gpt-1.7b", 24, 2304, 24, 1, 1, 32, 512, 137),
    ("gpt-3.6b", 32, 3072, 30, 2, 1, 64, 512, 138),
    ("gpt-7.5b", 32, 4096, 36, 4, 1, 128, 512, 142),
    ("gpt-18.4b", 48, 6144, 40, 8, 1, 256, 1024, 135),
    ("gpt-39.1b", 64, 8192, 48, 8, 2, 512, 1536, 138),
    ("gpt-76.1b", 80, 10240, 60, 8, 4, 1024, 1792, 140),
]
SEQ, VOCAB = 2048, 51200


def model_flops(batch: int, layers: int, hidden: int) -> float:
    """Megatron-LM's FLOPs per iteration with full recomputation (SC'21 section 5.1)."""
    s, h, lay, v = SEQ, hidden, layers, VOCAB
    return 96.0 * batch * s * lay * h * h * (1 + s / (6 * h) + v / (16 * lay * h))


def published_plan(profile: ir.ModelProfile, clus: ir.Cluster, t: int, p: int) -> ir.Plan:
    """The paper's configuration: p stages of equal blocks, each on t x d GPUs, micro-batch 1."""
    names = [g.name for g in clus.gpus]
    width = len(names) // p
    dp = width // t
    n = len(profile.layers)
    bounds = [0] + [1 + round((n - 2) * (s + 1) / p) for s in range(p - 1)] + [n]
    stages = tuple(ir.Stage((bounds[s], bounds[s + 1]), tuple(names[s * width:(s + 1) * width]),
                            tuple(_forms(profile, bounds[s], bounds[s + 1], t)), 0, "full", t, 0)
                   for s in range(p))
    m = profile.batch_size // dp
    draft = ir.Plan(profile, clus, "1f1b", m, "adam", stages, ir.Prediction(0, 0, 0, 0), precision="bf16")
    mem = plan_memory(draft, stage_costs(draft))
    return ir.Plan(profile, clus, "1f1b", m, "adam",
                   tuple(ir.Stage(s.layers, s.devices, s.forms, mm, s.recompute, s.tp, s.zero)
                         for s, mm in zip(stages, mem, strict=True)),
                   ir.Prediction(0, 0, 0, 0), precision="bf16")


def _forms(profile: ir.ModelProfile, first: int, end: int, t: int) -> list[str]:
    if t == 1:
        return ["dp"] * (end - first)
    return ["tp" if profile.layers[i].block is not None else "split_out" for i in range(first, end)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=len(ROWS))
    args = parser.parse_args()
    print(f"{'model':10} {'GPUs':>5} {'batch':>5} | {'published t-p':>13} {'fits':>4} {'GiB':>6} {'iter s':>7} "
          f"{'TF/GPU':>6} {'paper':>5} {'ratio':>5} | {'planner':>18} {'fits':>4} {'iter s':>7} {'<= pub':>6} "
          f"{'search s':>8}")
    for name, heads, hidden, layers, t, p, gpus, batch, paper in ROWS[:args.rows]:
        prof = gpt_profile(name, layers, hidden, heads, SEQ, VOCAB, batch)
        clus = cluster("a100", gpus // 8)
        pub = judge(published_plan(prof, clus, t, p))
        tflops = model_flops(batch, layers, hidden) / pub.prediction.iteration_s / gpus / 1e12
        t0 = time.perf_counter()
        mine = search(prof, clus, optimizer="adam", precision="bf16")
        took = time.perf_counter() - t0
        grid = "-".join(f"{s.tp}x{s.dp}" for s in mine.stages)
        faster = mine.predicted.iteration_s <= pub.prediction.iteration_s * (1 + 1e-9)
        print(f"{name:10} {gpus:>5} {batch:>5} | {f'{t}-{p}':>13} {pub.fits!s:>4} "
              f"{pub.prediction.peak_memory_bytes / 2**30:6.1f} {pub.prediction.iteration_s:7.2f} {tflops:6.0f} "
              f"{paper:>5} {tflops / paper:5.2f} | {grid[:18]:>18} {'True':>4} {mine.predicted.iteration_s:7.2f} "
              f"{faster!s:>6} {took:8.1f}")
    print("targets: published plan fits; planner fits and <= published; TFLOP/s ratio within 0.85..1.15")


if __name__ == "__main__":
    main()

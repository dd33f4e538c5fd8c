"""Published large-scale configurations as plans, against the planner's own plans.

Two sources, each run as written in its paper or log:

- Megatron-LM's weak-scaling runs (Narayanan et al., "Efficient Large-Scale Language Model
  Training on GPU Clusters Using Megatron-LM", SC'21, Table 1): GPT models of 1.7B to 76.1B
  parameters (sequence 2048, vocabulary 51200) on 32 to 1024 A100 80GB GPUs (DGX A100
  servers: 8 GPUs on NVLink, 8 HDR InfiniBand NICs, 25 GB/s per GPU), mixed precision, Adam,
  full activation recomputation, micro-batch size 1, ZeRO 0, with the tensor (t), pipeline
  (p) and data-parallel degrees and global batch the table gives.
- BLOOM-176B (BigScience, "BLOOM: A 176B-Parameter Open-Access Multilingual Language
  Model", 2022, section 3.4; the training's model card and logs): 70 layers, hidden 14336,
  112 heads, vocabulary 250880 (padded), sequence 2048, global batch 2048, micro-batch 2,
  t=4, p=12, d=8 on 384 A100 80GB of Jean Zay (48 servers of 8; four 100 Gbit/s Omni-Path
  links per server: 6.25 GB/s per GPU), bf16, ZeRO 1, activation checkpointing; "about 150
  TFLOPs" per GPU.

Both report model FLOPs with recomputation, 96 B s l h^2 (1 + s/6h + V/16lh) per iteration
(SC'21 section 5.1; Megatron-DeepSpeed logs the same formula), over time and GPUs.

For each row this prints: the published configuration written as a plan (stages of t x d
GPUs, 1F1B, the row's micro-batch size and ZeRO stage) -- whether it fits in 80 GB and its
predicted iteration and TFLOP/s per GPU beside the published one; and the planner's own plan
for the same model, GPUs and batch (bf16, Adam, every tensor degree, ZeRO stage and
recomputation mode) -- its config, whether it fits, its predicted iteration and the search
time. Targets: the published plan fits; the planner's plan fits and is predicted at least as
fast; predicted/published TFLOP/s within 0.85..1.15 (issue 15's figure).

Profiles are synthetic (scripts/synthetic.py: closed-form FLOPs and activation bytes, times
at 50% of the bf16 peak), so no torch is needed. ``--rows N`` runs the first N rows.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from synthetic import cluster, gpt_profile

from planner import ir
from planner.judge import Judged, judge
from planner.search import search


@dataclass(frozen=True)
class Published:
    """One published run: the model, its parallel layout, the cluster's inter-server link per GPU, and
    the throughput the source reports (TFLOP/s per GPU)."""

    name: str
    heads: int
    hidden: int
    layers: int
    t: int
    p: int
    gpus: int
    batch: int
    tflops: float
    seq: int = 2048
    vocab: int = 51200
    micro_batch: int = 1
    zero: int = 0
    inter_Bps: float = 2.5e10  # DGX A100: 8 x 200 Gbit/s HDR per server
    embeddings_count: bool = False
    """Stages balance the embedding and the head as layers too (Megatron-DeepSpeed's
    ``--pp-partition-method type:transformer|embedding``); else blocks only, evenly."""


ROWS = [  # SC'21 Table 1, then BLOOM-176B
    Published("gpt-1.7b", 24, 2304, 24, 1, 1, 32, 512, 137),
    Published("gpt-3.6b", 32, 3072, 30, 2, 1, 64, 512, 138),
    Published("gpt-7.5b", 32, 4096, 36, 4, 1, 128, 512, 142),
    Published("gpt-18.4b", 48, 6144, 40, 8, 1, 256, 1024, 135),
    Published("gpt-39.1b", 64, 8192, 48, 8, 2, 512, 1536, 138),
    Published("gpt-76.1b", 80, 10240, 60, 8, 4, 1024, 1792, 140),
    Published("bloom-176b", 112, 14336, 70, 4, 12, 384, 2048, 150, vocab=250880, micro_batch=2, zero=1,
              inter_Bps=4 * 100e9 / 8 / 8, embeddings_count=True),
]


def model_flops(row: Published) -> float:
    """FLOPs per iteration with full recomputation (SC'21 section 5.1)."""
    b, s, h, lay, v = row.batch, row.seq, row.hidden, row.layers, row.vocab
    return 96.0 * b * s * lay * h * h * (1 + s / (6 * h) + v / (16 * lay * h))


def published_plan(profile: ir.ModelProfile, clus: ir.Cluster, row: Published) -> ir.Plan:
    """The published configuration: p stages of equal blocks, each on t x d GPUs, its micro-batch size
    (unjudged: the judge fills in memory and the prediction)."""
    names = [g.name for g in clus.gpus]
    width = len(names) // row.p
    dp = width // row.t
    n = len(profile.layers)
    if row.embeddings_count:
        bounds = [round(n * s / row.p) for s in range(row.p + 1)]
    else:
        bounds = [0] + [1 + round((n - 2) * (s + 1) / row.p) for s in range(row.p - 1)] + [n]
    stages = tuple(ir.Stage((bounds[s], bounds[s + 1]), tuple(names[s * width:(s + 1) * width]),
                            tuple(_forms(profile, bounds[s], bounds[s + 1], row.t)), 0, "full", row.t, row.zero)
                   for s in range(row.p))
    m = profile.batch_size // (dp * row.micro_batch)
    return ir.Plan(profile, clus, "1f1b", m, "adam", stages, ir.Prediction(0, 0, 0, 0), precision="bf16")


def _forms(profile: ir.ModelProfile, first: int, end: int, t: int) -> list[str]:
    if t == 1:
        return ["dp"] * (end - first)
    return ["tp" if profile.layers[i].block is not None else "split_out" for i in range(first, end)]


def published_fidelity(row: Published) -> tuple[ir.ModelProfile, ir.Cluster, Judged, float]:
    """A published run written as a plan and judged: its profile and cluster, the judged plan (fits, predicted
    iteration, peak memory) and its predicted/published TFLOP/s per GPU (validate_fidelity.py's second table)."""
    prof = gpt_profile(row.name, row.layers, row.hidden, row.heads, row.seq, row.vocab, row.batch)
    clus = cluster("a100", row.gpus // 8, inter_Bps=row.inter_Bps)
    pub = judge(published_plan(prof, clus, row))
    tflops = model_flops(row) / pub.prediction.iteration_s / row.gpus / 1e12
    return prof, clus, pub, tflops / row.tflops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=len(ROWS))
    args = parser.parse_args()
    print(f"{'model':10} {'GPUs':>5} {'batch':>5} | {'published t-p':>13} {'fits':>4} {'GiB':>6} {'iter s':>7} "
          f"{'TF/GPU':>6} {'paper':>5} {'ratio':>5} | {'planner':>18} {'fits':>4} {'iter s':>7} {'<= pub':>6} "
          f"{'search s':>8}")
    for row in ROWS[:args.rows]:
        prof, clus, pub, ratio = published_fidelity(row)
        pub_s = pub.prediction.iteration_s
        t0 = time.perf_counter()
        mine = search(prof, clus, optimizer="adam", precision="bf16")
        took = time.perf_counter() - t0
        grid = "-".join(f"{s.tp}x{s.dp}" for s in mine.stages)
        faster = mine.predicted.iteration_s <= pub_s * (1 + 1e-9)
        print(f"{row.name:10} {row.gpus:>5} {row.batch:>5} | {f'{row.t}-{row.p}':>13} {pub.fits!s:>4} "
              f"{pub.prediction.peak_memory_bytes / 2**30:6.1f} {pub_s:7.2f} {ratio * row.tflops:6.0f} "
              f"{row.tflops:>5.0f} {ratio:5.2f} | {grid[:18]:>18} {'True':>4} "
              f"{mine.predicted.iteration_s:7.2f} {faster!s:>6} {took:8.1f}", flush=True)
    print("targets: published plan fits; planner fits and <= published; TFLOP/s ratio within 0.85..1.15")


if __name__ == "__main__":
    main()

"""Megatron-LM on V100s (NVIDIA ADLR, "MegatronLM's Supercharged V1.0"), held out: the A100's share on a Volta.

The blog post (nv-adlr.github.io/MegatronLMV1) times Megatron-LM v1.0's GPT-2 models on the V100s of DGX-2H
servers (16 V100 SXM3 32GB on NVSwitch), batch 8 of 1024 tokens, fp16 with fp32 master weights and Adam,
tensor ("model") parallel inside the server, no data or pipeline parallelism, and gives the iteration time:
the 1.2B model on one GPU 1288 ms ("62.4 teraFLOPs which is 48% of the theoretical peak FLOPS for a single GPU
in a DGX2-H server", so that peak is 130 TFLOP/s: the DGX-2H's 2.1 PFLOP/s over 16 GPUs, the V100's 1.53 GHz
boost clock raised to 1.6), 2.0B on two 1242 ms, 4.2B on four 1357 ms, 8.7B on eight 1508 ms. The
widths of the 1.2B and 4.2B models are those of Shoeybi et al., "Megatron-LM: Training Multi-Billion Parameter
Language Models Using Model Parallelism" (2019, Table 1: hidden 1536 and 2304, 40 and 64 layers, 16 and 24
heads; vocabulary padded to 51,200; activation checkpointing of every layer; dropout 0.1); the 2.0B and 8.7B
ones are not published, so those two rows are not reproduced. The paper's own 1.2B figure, 39 TFLOP/s, is the
stack before v1.0's fused kernels (the post: a 60% improvement); it is not a row.

Each row is timed as ``bench_published.py`` times SC'21's runs: Megatron's kernels in closed form
(``megatron_roofline.py``: materialised attention scores, fused memory-bound kernels) by the V100's fp16
roofline at the 130 TFLOP/s peak, GEMMs at ``planner.gpus.SUSTAINED`` of the catalogue's share (fitted on
A100 runs: nothing here is fitted), written as the published plan (one stage of ``t`` GPUs, full
recomputation, one micro-batch of 8) and judged. A second column predicts each row through ``planner
profile``'s own analytic roofline on a Hugging Face GPT-2 of the row's widths (eager PyTorch kernels: the
tanh GELU as separate element-wise kernels, fused attention), a diagnosis printed beside the target's ratio.
``python scripts/published_v100.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_published as bp
from megatron_roofline import Layout, timed
from synthetic import gpt_profile

from planner import gpus, ir
from planner.judge import judge

PEAK_FP16 = 130e12
"""A DGX-2H V100's fp16 tensor-core peak (module doc: 2.1 PFLOP/s over 16 GPUs; the post's 62.4 = 48%)."""
NVSWITCH_BPS = 150e9
"""NVSwitch bandwidth per GPU and direction: six NVLink 2 links of 25 GB/s (DGX-2 data sheet: 300 GB/s both ways)."""
SEQ, VOCAB, BATCH = 1024, 51200, 8
TARGET = (0.85, 1.15)


class V100Run(NamedTuple):
    name: str
    hidden: int
    heads: int
    layers: int
    t: int
    iteration_s: float


ROWS = (V100Run("megatron-1.2b", 1536, 16, 40, 1, 1.288), V100Run("megatron-4.2b", 2304, 24, 64, 4, 1.357))
"""The post's rows whose widths are published (module doc)."""


def server(t: int) -> ir.Cluster:
    """``t`` V100s of one DGX-2H (fp16 at :data:`PEAK_FP16`, 32 GB) on NVSwitch."""
    spec = gpus.gpu_spec("v100-32gb")
    gpu = dataclasses.replace(spec.to_gpu("g"), peak_flops=(("fp32", spec.peak("fp32")), ("fp16", PEAK_FP16)))
    doc = {"kind": "cluster", "version": 1, "name": f"dgx-2h-{t}",
           "nodes": [{"name": "s0", "gpus": [dataclasses.replace(gpu, name=f"s0.g{i}").to_dict() for i in range(t)]}],
           "links": {"intra_node": {"bandwidth_Bps": NVSWITCH_BPS, "latency_s": 3e-6},
                     "inter_node": {"bandwidth_Bps": 100e9 / 8, "latency_s": 5e-6}}}
    return ir.Cluster.from_dict(doc)


def _row(run: V100Run) -> bp.Published:
    return bp.Published(run.name, run.heads, run.hidden, run.layers, run.t, 1, run.t, BATCH, 0.0, seq=SEQ,
                        vocab=VOCAB, micro_batch=BATCH)


def megatron_profile(run: V100Run) -> ir.ModelProfile:
    """The row's model timed kernel by kernel as Megatron runs it, by the V100's fp16 roofline at the DGX-2H peak."""
    roofline = dataclasses.replace(gpus.roofline_of("v100-32gb", "fp16"), peak_flops=PEAK_FP16)
    prof = gpt_profile(run.name, run.layers, run.hidden, run.heads, SEQ, VOCAB, BATCH, peak=PEAK_FP16)
    return timed(prof, Layout(BATCH, SEQ, run.hidden, run.heads, 4 * run.hidden, run.t), VOCAB, roofline)


def hf_profile(run: V100Run) -> ir.ModelProfile:
    """The row's widths as ``planner profile gpt2 --mode analytic --device-flops v100-32gb --dtype float16``."""
    from planner.api import profile_model

    sets = {"n_embd": run.hidden, "n_head": run.heads, "n_layer": run.layers, "vocab_size": VOCAB,
            "n_positions": SEQ}
    return profile_model("gpt2", batch_size=BATCH, mode="analytic", input_shape=(SEQ,), dtype="float16",
                         device_flops="v100-32gb", overrides=sets)


def ratio(run: V100Run, profile: ir.ModelProfile) -> tuple[float, bool]:
    """Predicted over published throughput (the published iteration over the predicted), and whether it fits."""
    plan = bp.published_plan(profile, server(run.t), _row(run))
    judged = judge(dataclasses.replace(plan, precision="fp16"))
    return run.iteration_s / judged.prediction.iteration_s, judged.fits


def lines(with_hf: bool = True) -> Iterator[str]:
    """Per row: layout, fit, the ratio and (``with_hf``) the diagnosis; then the count inside :data:`TARGET`."""
    inside = 0
    for run in ROWS:
        r, fits = ratio(run, megatron_profile(run))
        ok = TARGET[0] <= r <= TARGET[1]
        inside += ok
        hf = f"; via planner profile {ratio(run, hf_profile(run))[0]:.2f}" if with_hf else ""
        yield (f"  {run.name:14} {run.t} V100 t={run.t}, batch {BATCH} x {SEQ} tokens, fp16, full recomputation: "
               f"fits {fits!s:5} predicted/published {r:.2f} (held out){'' if ok else '  (outside)'}{hf}")
    yield f"  {inside} of {len(ROWS)} inside {TARGET[0]}..{TARGET[1]} (sustained share {gpus.SUSTAINED}, the A100's)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--no-profiler", action="store_true", help="skip the planner profile column (no torch needed)")
    args = ap.parse_args()
    print(__doc__.split("\n")[0])
    for line in lines(not args.no_profiler):
        print(line, flush=True)


if __name__ == "__main__":
    main()

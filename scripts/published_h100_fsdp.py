"""torchtitan's eager FSDP runs of Llama 3.1 8B on H100s, bracketed by the planner's predictions.

torchtitan's H100 benchmark (pytorch/torchtitan, ``benchmarks/llama3_h100_202412_torchtitan.md``, December
2024): Llama 3.1 8B trained with FSDP2 alone (ZeRO-3 over all the GPUs), bf16, local batch 2 of 8192
tokens, torchtitan's "selective" activation checkpointing (its per-op policy), on Meta's Grand Teton
servers: 8 H100s with 96 GB HBM2e at 2.4 TB/s, NVLink inside a server, 400 Gbit/s RDMA per GPU, at a
500 W power limit. Its Tables 1 and 3, first rows (eager, no torch.compile, no Float8):

| GPUs | tokens/s/GPU | memory |
|---|---|---|
| 8 | 5,762 | 82.4 GiB |
| 128 | 5,605 | 67.0 GiB |

Two things keep these rows out of the published table (``bench_published.py``, ``published_fsdp.py``):
the report does not know its GPU's peak ("between SXM and NVL"; 989.4 and 835 TFLOP/s bf16 on the
data sheets), and the planner has no per-op checkpointing policy (it recomputes nothing, the attention
core, or every block). So this script brackets them: each row is predicted with no recomputation (an upper
bound on throughput: the per-op policy redoes some element-wise work) and with full recomputation (a lower
bound: it redoes every block's forward), at both peaks. The published throughput should lie between the
two at the GPU's true peak. Profiled as a user would (``planner profile llama3-8b --mode analytic
--device-flops h100 --dtype bfloat16``), judged as the published layout (``published_fsdp.fsdp_plan``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import NamedTuple

from published_fsdp import FsdpRun, fsdp_plan, servers_like

from planner import ir
from planner.judge import judge

PEAKS_BF16 = {"SXM": 989.4e12, "NVL": 835.0e12}
"""bf16 dense peaks of the two H100 data sheets (FLOP/s); the report's GPU is between them."""
MEMORY_BYTES = 96 * 10**9
MEMORY_BANDWIDTH_BPS = 2.4e12
"""The report's H100: 96 GB HBM2e at 2.4 TB/s."""


class H100Row(NamedTuple):
    gpus: int
    tokens_per_s: float
    """Published tokens per second per GPU (eager FSDP, selective per-op checkpointing)."""


ROWS = (H100Row(8, 5762.0), H100Row(128, 5605.0))


def grand_teton(servers: int, peak_bf16: float) -> ir.Cluster:
    """``servers`` Grand Teton servers: the ``h100-8x8-nvlink-ib`` preset's links, its GPU with the report's
    memory and bandwidth and ``peak_bf16``."""
    from planner.cluster import load_cluster

    g0 = load_cluster("h100-8x8-nvlink-ib").nodes[0].gpus[0]
    peaks = tuple((f, peak_bf16 if f in ("bf16", "fp16") else p) for f, p in g0.peak_flops)
    return servers_like("h100-8x8-nvlink-ib", servers, f"grand-teton-{servers}x8", peak_flops=peaks,
                        memory_bytes=MEMORY_BYTES, memory_bandwidth_Bps=MEMORY_BANDWIDTH_BPS)


@functools.cache
def llama31_8b(gpus: int) -> ir.ModelProfile:
    """``planner profile llama3-8b`` (Llama 3.1 8B's shapes) at the global batch of ``gpus`` GPUs."""
    from planner.api import profile_model

    return profile_model("llama3-8b", batch_size=2 * gpus, mode="analytic", input_shape=(8192,),
                         dtype="bfloat16", device_flops="h100")


def predicted(row: H100Row, recompute: str, peak: float) -> float:
    """Predicted tokens per second per GPU of ``row`` with ``recompute`` at bf16 ``peak``."""
    run = FsdpRun(f"llama3.1-8b fsdp {row.gpus}", "llama3-8b", 2, 8192, recompute, row.tokens_per_s)
    judged = judge(fsdp_plan(llama31_8b(row.gpus), grand_teton(row.gpus // 8, peak), run))
    return run.local_batch * run.seq / judged.prediction.iteration_s


def lines() -> Iterator[str]:
    """Per row and peak: the bracket (full, none) and whether the published throughput lies in it."""
    for row in ROWS:
        for label, peak in PEAKS_BF16.items():
            low, high = predicted(row, "full", peak), predicted(row, "none", peak)
            inside = "inside" if low <= row.tokens_per_s <= high else "outside"
            yield (f"  {row.gpus:>3} H100s at the {label} peak ({peak / 1e12:.0f} TFLOP/s): predicted {low:.0f} "
                   f"(full recomputation) .. {high:.0f} (none) tokens/s/GPU; published {row.tokens_per_s:.0f}, "
                   f"{inside} (published over the bounds {row.tokens_per_s / low:.2f} .. "
                   f"{row.tokens_per_s / high:.2f})")


def main() -> None:
    print(__doc__.split("\n")[0])
    for line in lines():
        print(line, flush=True)


if __name__ == "__main__":
    main()

"""Published FSDP runs of Llama models, predicted through the tool's own path (``planner profile`` analytic).

torchtitan's performance report (pytorch/torchtitan, ``docs/performance.md``, "Llama 3 performance
numbers" and "Llama 2 performance numbers"): Llama 2 and Llama 3 trained with FSDP2 (ZeRO-3 over
all the GPUs, one data-parallel group, no pipeline, no tensor parallelism) on 64 A100 80GB GPUs,
bf16 with fp32 master weights, AdamW, one micro-batch of the local batch size per GPU and step,
tokens per second per GPU (``WPS``). Only the rows whose activation checkpointing the planner
expresses exactly are here: none, and full (every transformer block checkpointed). The rows with
torchtitan's "selective op" (a per-op policy) or "selective layer" (every other block) checkpointing
are not, nor are its H100 rows (Float8 and torch.compile):

| model | local batch | sequence | checkpointing | WPS |
|---|---|---|---|---|
| Llama 2 13B | 2 | 4096 | none | 2162 |
| Llama 2 70B | 2 | 4096 | full | 353 |
| Llama 3 70B | 1 | 8192 | full | 331 |

Each row is profiled as a user would (``planner profile <zoo name> --mode analytic --device-flops a100
--dtype bfloat16``, the transformers model of the published config, at the global batch), written as the
published plan (one stage of 64 GPUs, tp 1, ZeRO-3, the row's recomputation, micro-batch = local batch)
on the ``a100-8x8-nvlink-ib`` preset, and judged; its predicted tokens per second per GPU over the
published is the row's ratio (issue 15's target 0.85..1.15). Needs torch (meta device; a few seconds a
row).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from planner import ir
from planner.judge import Judged, judge

GPUS = 64


@dataclass(frozen=True)
class FsdpRun:
    """One published FSDP run: the zoo model, its local batch and sequence, checkpointing and throughput."""

    name: str
    zoo: str
    local_batch: int
    seq: int
    recompute: str
    tokens_per_s: float
    """Published tokens per second per GPU."""


ROWS = (
    FsdpRun("llama2-13b fsdp", "llama2-13b", 2, 4096, "none", 2162.0),
    FsdpRun("llama2-70b fsdp", "llama2-70b", 2, 4096, "full", 353.0),
    FsdpRun("llama3-70b fsdp", "llama3-70b", 1, 8192, "full", 331.0),
)


def servers_like(preset: str, count: int, name: str, **gpu: Any) -> ir.Cluster:
    """``count`` servers like the first of cluster ``preset`` (its links and eight GPUs), their GPU with the fields
    ``gpu`` changes (memory, bandwidth, peaks), named ``s<i>.g<j>``."""
    from planner.cluster import load_cluster

    base = load_cluster(preset)
    g0 = dataclasses.replace(base.nodes[0].gpus[0], **gpu)
    nodes = tuple(dataclasses.replace(base.nodes[0], name=f"s{i}", gpus=tuple(
        dataclasses.replace(g0, name=f"s{i}.g{j}") for j in range(len(base.nodes[0].gpus)))) for i in range(count))
    return dataclasses.replace(base, name=name, nodes=nodes)


def fsdp_plan(profile: ir.ModelProfile, cluster: ir.Cluster, row: FsdpRun) -> ir.Plan:
    """The published layout: every layer on one stage of all the GPUs, ZeRO-3, one micro-batch (unjudged)."""
    devices = tuple(g.name for g in cluster.gpus)
    n = len(profile.layers)
    stage = ir.Stage((0, n), devices, ("dp",) * n, 0, row.recompute, 1, 3)
    return ir.Plan(profile, cluster, "1f1b", 1, "adam", (stage,), ir.Prediction(0, 0, 0, 0), precision="bf16")


def fsdp_fidelity(row: FsdpRun) -> tuple[Judged, float]:
    """The row's plan judged and its predicted/published tokens per second per GPU."""
    from planner.api import profile_model
    from planner.cluster import load_cluster

    profile = profile_model(row.zoo, batch_size=row.local_batch * GPUS, mode="analytic", input_shape=(row.seq,),
                            dtype="bfloat16", device_flops="a100")
    cluster = load_cluster("a100-8x8-nvlink-ib")
    judged = judge(fsdp_plan(profile, cluster, row))
    tokens_per_s = row.local_batch * row.seq / judged.prediction.iteration_s
    return judged, tokens_per_s / row.tokens_per_s


TARGET = (0.85, 1.15)
"""Issue 15's target for predicted over published throughput."""


def describe(row: FsdpRun, judged: Judged, ratio: float) -> str:
    """One row's line: layout, fit and memory, predicted against published tokens per second per GPU."""
    outside = "" if TARGET[0] <= ratio <= TARGET[1] else "  (outside)"
    return (f"  {row.name:16} {GPUS} A100s FSDP (ZeRO-3), local batch {row.local_batch} x {row.seq} tokens, "
            f"{row.recompute} recomputation: fits {judged.fits!s:5} ({judged.prediction.peak_memory_bytes / 2**30:.1f} "
            f"GiB), predicted {row.tokens_per_s * ratio:.0f} tokens/s/GPU against {row.tokens_per_s:.0f} published: "
            f"{ratio:.2f}{outside}")


def report() -> int:
    """Print every row (:func:`describe`) and how many are inside :data:`TARGET`; return that count."""
    inside = 0
    for row in ROWS:
        judged, ratio = fsdp_fidelity(row)
        inside += TARGET[0] <= ratio <= TARGET[1]
        print(describe(row, judged, ratio), flush=True)
    print(f"  {inside} of {len(ROWS)} inside {TARGET[0]}..{TARGET[1]} (torchtitan's docs/performance.md, held out)")
    return inside


def main() -> None:
    print(__doc__.split("\n")[0])
    report()


if __name__ == "__main__":
    main()

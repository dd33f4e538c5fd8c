#!/usr/bin/env python
"""The CUDA checks of issue 15, in one command for a machine with a GPU (prints a Markdown report).

For each model (``gpt``: GPT-2 small, 124M parameters; ``llama``: a Llama of 8 blocks, hidden
2048, 16 heads and 4 KV heads, MLP 5632, vocabulary 32000, about 0.5B parameters), at ``--batch``
sequences of ``--seq`` tokens in bf16:

1. a measured profile on the device (``planner profile --mode measured --device cuda``) and the
   analytic profile of the same model on the catalogued GPU (the roofline, ``--mode analytic``);
2. analytic over measured per layer, forward and backward: the median and the range;
3. the planner's plan for one GPU of that kind (``search`` on the measured profile), its predicted
   iteration from the measured and from the analytic profile, and its iteration measured by
   ``planner run`` on the torch engine (one process, ``--steps`` timed steps): measured/predicted.

``--device cpu`` runs the same steps on the CPU (a test of the script itself, with ``--models tiny
--dtype float32``: the analytic column is then a GPU's roofline against a CPU). Usage::

    python scripts/gpu_checks.py [--gpu h100] [--models gpt,llama] [--batch 8] [--seq 1024] [--out report.md]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner import gpus, ir  # noqa: E402
from planner.api import judge_plan, profile_model, run_plan, search_plan  # noqa: E402

MODELS = {"gpt": "gpt2", "llama": "gpu_checks:llama_small", "tiny": "llama-tiny"}
"""Check name -> model spec (``tiny``: the zoo's 2-block Llama, for a quick run of the script itself)."""


def llama_small() -> Any:
    """The ``llama`` check model (module docstring), built from a ``transformers`` config (no download)."""
    from planner.profiler.hfzoo import llama

    return llama("llama-tiny", hidden_size=2048, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
                 intermediate_size=5632, vocab_size=32000, max_position_embeddings=4096)


def gpu_name(device: str) -> str:
    """The catalogue name of this machine's GPU (h100, a100, a100-40gb, v100, ...)."""
    import torch

    if device != "cuda" or not torch.cuda.is_available():
        return "h100"
    name, memory = torch.cuda.get_device_name().lower(), torch.cuda.get_device_properties(0).total_memory
    for key in ("h100", "a100", "v100"):
        if key in name:
            return "a100-40gb" if key == "a100" and memory < 60 * 2**30 else key
    raise SystemExit(f"no catalogued GPU matches {name!r}: give --gpu (one of {', '.join(gpus.GPU_NAMES)})")


def one_gpu(gpu: str) -> ir.Cluster:
    """A cluster of one catalogued GPU (its links are never used)."""
    link = ir.Link(1e11, 1e-6)
    node = ir.Node("n0", (gpus.gpu_spec(gpu).to_gpu("n0.g0"),))
    return ir.Cluster(f"one-{gpu}", (node,), (("intra_node", link), ("inter_node", link)))


def layer_ratios(analytic: ir.ModelProfile, measured: ir.ModelProfile) -> dict[str, list[float]]:
    """Analytic over measured seconds per layer, forward and backward (layers measured above 0)."""
    out: dict[str, list[float]] = {"forward": [], "backward": []}
    for a, m in zip(analytic.layers, measured.layers, strict=True):
        if m.forward_s > 0:
            out["forward"].append(a.forward_s / m.forward_s)
        if m.backward_s > 0:
            out["backward"].append(a.backward_s / m.backward_s)
    return out


def check(key: str, args: argparse.Namespace, gpu: str) -> dict[str, Any]:
    """The three checks of one model (module docstring)."""
    model = MODELS[key]
    common = {"batch_size": args.batch, "input_shape": (args.seq,), "dtype": args.dtype, "device_flops": gpu}
    measured = profile_model(model, mode="measured", device=args.device, **common)
    analytic = profile_model(model, mode="analytic", **common)
    cluster = one_gpu(gpu)
    plan = search_plan(measured, cluster, optimizer="adam", engine="torch")
    predicted = judge_plan(plan).prediction.iteration_s
    from_analytic = judge_plan(replace(plan, profile=analytic)).prediction.iteration_s
    run = run_plan(plan, model, engine="torch", steps=args.steps, warmup=2)
    return {"model": key, "layers": len(measured.layers), "ratios": layer_ratios(analytic, measured),
            "microbatches": plan.microbatches, "recompute": plan.stages[0].recompute,
            "predicted_s": predicted, "analytic_s": from_analytic, "measured_s": float(run["measured_iteration_s"])}


def report(rows: list[dict[str, Any]], gpu: str, args: argparse.Namespace) -> str:
    lines = [f"# GPU checks on {gpu} ({args.device}), batch {args.batch} x {args.seq} tokens, {args.dtype}", "",
             "| model | layers | analytic/measured fwd: median (min-max) | bwd | plan | predicted s (measured "
             "profile) | predicted s (analytic) | measured s | measured/predicted |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})" for v in r["ratios"].values()]
        lines.append(f"| {r['model']} | {r['layers']} | {cells[0]} | {cells[1]} | M={r['microbatches']}, "
                     f"{r['recompute']} | {r['predicted_s']:.4g} | {r['analytic_s']:.4g} | {r['measured_s']:.4g} | "
                     f"{r['measured_s'] / r['predicted_s']:.4g} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--gpu", help="catalogue name of the GPU (default: read from the device)")
    ap.add_argument("--models", default="gpt,llama")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "scripts"), str(ROOT), os.environ.get("PYTHONPATH", "")])
    sys.path.insert(0, str(ROOT / "scripts"))
    gpu = args.gpu or gpu_name(args.device)
    rows = [check(key.strip(), args, gpu) for key in args.models.split(",")]
    text = report(rows, gpu, args)
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

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

``--save DIR`` writes each model's profiles, plan and run as JSON there, for reading after the machine is given
back; the report ends with the per-layer times and with the GPU's measured bf16 matrix-product rate and memory
bandwidth beside the catalogue's (``peaks``).

``--device cpu`` runs the same steps on the CPU (a test of the script itself, with ``--models tiny
--dtype float32``: the analytic column is then a GPU's roofline against a CPU). Usage::

    python scripts/gpu_checks.py [--gpu h100] [--models gpt,llama] [--batch 8] [--seq 1024] [--out report.md]
    python scripts/gpu_checks.py --sizes 4x512,8x1024,16x1024 --save runs --out report.md   # one device call;
    python scripts/gpu_replay.py runs                                                     # then, anywhere
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner import gpus, ir, jsonio  # noqa: E402
from planner.api import judge_plan, profile_model, run_plan, search_plan  # noqa: E402

MODELS = {"gpt": "gpt2", "llama": "gpu_checks:llama_small", "tiny": "llama-tiny"}
"""Check name -> model spec (``tiny``: the zoo's 2-block Llama, for a quick run of the script itself)."""


def llama_small() -> Any:
    """The ``llama`` check model (module docstring), built from a ``transformers`` config (no download)."""
    from planner.profiler.hfzoo import llama

    return llama("llama-tiny", hidden_size=2048, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
                 intermediate_size=5632, vocab_size=32000, max_position_embeddings=4096)


def gpu_name(device: str) -> str:
    """The catalogue name of this machine's GPU (h100 where there is none)."""
    import torch

    if device != "cuda" or not torch.cuda.is_available():
        return "h100"
    return catalogue_name(torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).total_memory)


def catalogue_name(device_name: str, memory_bytes: int) -> str:
    """The catalogue name (h200, h100, a100, a100-40gb, v100) of a GPU CUDA names ``device_name``."""
    name = device_name.lower()
    for key in ("h200", "h100", "a100", "v100"):
        if key in name:
            return "a100-40gb" if key == "a100" and memory_bytes < 60 * 2**30 else key
    raise SystemExit(f"no catalogued GPU matches {device_name!r}: give --gpu (one of {', '.join(gpus.GPU_NAMES)})")


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


def save(folder: Path, key: str, docs: dict[str, dict[str, Any]]) -> None:
    """Write ``key``'s profiles and plan (planner JSON) to ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, doc in docs.items():
        jsonio.write_json(folder / f"{key}-{name}.json", doc)


def per_layer(analytic: ir.ModelProfile, measured: ir.ModelProfile) -> list[str]:
    """One Markdown row per layer: its name, measured and analytic forward and backward milliseconds."""
    return [f"| {m.name} | {m.forward_s * 1e3:.3f} | {a.forward_s * 1e3:.3f} | {m.backward_s * 1e3:.3f} | "
            f"{a.backward_s * 1e3:.3f} |" for a, m in zip(analytic.layers, measured.layers, strict=True)]


def peaks(device: str, gpu: str) -> list[str]:
    """The device's measured bf16 matrix-product rate (8192 cubed) and copy bandwidth (bytes read and written),
    timed as ``gpu_rates.py`` times them, beside the catalogue's peak and large-GEMM share: Markdown lines."""
    if device != "cuda":
        return []
    from functools import partial

    import gpu_rates
    import torch

    spec, n = gpus.gpu_spec(gpu), 8192
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    flops = 2 * n**3 / gpu_rates.timed(partial(torch.matmul, a, b), 10)
    bandwidth = gpu_rates.bandwidth(10)
    return [f"- bf16 matrix product {n}^3: {flops / 1e12:.1f} TFLOP/s measured, {flops / spec.peak('bf16'):.3f} of "
            f"the catalogue's peak {spec.peak('bf16') / 1e12:.1f} (catalogued large-GEMM share "
            f"{spec.large_gemm_share('bf16'):.3f})",
            f"- device copy: {bandwidth / 1e12:.2f} TB/s measured, catalogue "
            f"{spec.memory_bandwidth_Bps / 1e12:.2f} TB/s"]


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
    if args.save is not None:  # before the run, which may fail
        save(args.save, key, {"measured": measured.to_dict(), "analytic": analytic.to_dict(), "plan": plan.to_dict()})
    run = run_plan(plan, model, engine="torch", steps=args.steps, warmup=2)
    if args.save is not None:
        jsonio.write_text_atomic(args.save / f"{key}-run.json", json.dumps(run, indent=1, default=str))
    return {"model": key, "layers": len(measured.layers), "ratios": layer_ratios(analytic, measured),
            "per_layer": per_layer(analytic, measured),
            "microbatches": plan.microbatches, "recompute": plan.stages[0].recompute,
            "predicted_s": predicted, "analytic_s": from_analytic, "measured_s": float(run["measured_iteration_s"])}


def checked(key: str, args: argparse.Namespace, gpu: str) -> dict[str, Any]:
    """:func:`check`, or a row that says why it failed (the other models' checks still run)."""
    try:
        return check(key, args, gpu)
    except Exception as exc:  # a diagnostic run reports every failure and goes on
        import traceback

        traceback.print_exc()
        return {"model": key, "error": f"{type(exc).__name__}: {exc}".replace("|", "/").splitlines()[0][:300]}


def report(rows: list[dict[str, Any]], gpu: str, args: argparse.Namespace) -> str:
    lines = [f"# GPU checks on {gpu} ({args.device}), batch {args.batch} x {args.seq} tokens, {args.dtype}", "",
             "| model | layers | analytic/measured fwd: median (min-max) | bwd | plan | predicted s (measured "
             "profile) | predicted s (analytic) | measured s | measured/predicted |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | failed: {r['error']} |")
            continue
        cells = [f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})" for v in r["ratios"].values()]
        lines.append(f"| {r['model']} | {r['layers']} | {cells[0]} | {cells[1]} | M={r['microbatches']}, "
                     f"{r['recompute']} | {r['predicted_s']:.4g} | {r['analytic_s']:.4g} | {r['measured_s']:.4g} | "
                     f"{r['measured_s'] / r['predicted_s']:.4g} |")
    for r in rows:
        if "error" in r:
            continue
        lines += ["", f"## {r['model']}: per layer, milliseconds", "",
                  "| layer | measured fwd | analytic fwd | measured bwd | analytic bwd |", "|---|---|---|---|---|",
                  *r["per_layer"]]
    return "\n".join(lines) + "\n"


def per_size(args: argparse.Namespace) -> list[argparse.Namespace]:
    """``args`` once per size of ``--sizes`` (its batch, sequence and folder under ``--save``), or as it is."""
    if not args.sizes:
        return [args]
    out = []
    for size in args.sizes.split(","):
        try:
            batch, seq = (int(n) for n in size.strip().lower().split("x"))
        except ValueError:
            raise SystemExit(f"--sizes: {size!r} is not BATCHxSEQ (e.g. 8x1024)") from None
        save = None if args.save is None else args.save / f"{batch}x{seq}"
        out.append(argparse.Namespace(**{**vars(args), "batch": batch, "seq": seq, "save": save}))
    return out


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
    ap.add_argument("--save", type=Path, help="write each model's profiles, plan and run as JSON in this folder")
    ap.add_argument("--sizes", help="several BATCHxSEQ sizes in one run (e.g. 4x512,8x1024), each saved in "
                                    "its own folder under --save; instead of --batch and --seq")
    args = ap.parse_args(argv)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "scripts"), str(ROOT), os.environ.get("PYTHONPATH", "")])
    sys.path.insert(0, str(ROOT / "scripts"))
    gpu = args.gpu or gpu_name(args.device)
    text = "\n".join(report([checked(key.strip(), one, gpu) for key in args.models.split(",")], gpu, one)
                     for one in per_size(args))
    measured_peaks = peaks(args.device, gpu)
    if measured_peaks:
        text += "\n## The device's own rates\n\n" + "\n".join(measured_peaks) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

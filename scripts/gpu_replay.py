#!/usr/bin/env python
"""The CUDA checks again, without a GPU: saved GPU runs against the cost model as it is now (prints Markdown).

``scripts/gpu_checks.py --save DIR`` keeps, per model, the measured CUDA profile, the plan and the run
(``planner run``'s object: the measured iteration and peak memory). This script reads folders of those
(``docs/gpu/h200-2026-11-27`` holds the H200's, one folder per batch size) and, for each run:

- predicts the plan's iteration and peak memory again from the measured profile (``judge_plan``), and from the
  analytic profile of the same model, batch and GPU made now (the roofline, ``--mode analytic``);
- compares the analytic profile with the measured one per layer (analytic over measured, the median over the
  layers, forward and backward) and in the loss.

So a change to the cost model or the roofline is checked against real GPU runs on any machine. The target
(issue 15): measured over predicted within 0.9..1.1. Usage::

    python scripts/gpu_replay.py [docs/gpu/h200-2026-11-27]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_checks as gc  # noqa: E402
from fidelity_table import TARGET, within  # noqa: E402

from planner import gpus, ir  # noqa: E402
from planner.api import judge_plan, load_profile, profile_model  # noqa: E402
from planner.consistency import load_plan as checked_plan  # noqa: E402

DEFAULT = ROOT / "docs" / "gpu" / "h200-2026-11-27"


def analytic_of(measured: ir.ModelProfile, key: str, gpu: str) -> ir.ModelProfile:
    """The analytic profile of check model ``key`` at ``measured``'s batch and input on catalogued ``gpu``."""
    return profile_model(gc.MODELS[key], mode="analytic", batch_size=measured.batch_size,
                         input_shape=measured.input_shape, dtype=measured.dtype, device_flops=gpu)


def gpu_of(measured: ir.ModelProfile, plan: ir.Plan) -> str:
    """The catalogued GPU a saved run ran on: the name CUDA gave it, or else the one its plan's cluster was made of
    (``gpu_checks.one_gpu``: a run on the CPU, planned for a catalogued GPU)."""
    cluster_gpu = plan.cluster.name.removeprefix("one-")
    if cluster_gpu in gpus.GPU_NAMES and measured.device == "cpu":
        return cluster_gpu
    return gc.catalogue_name(str(measured.meta.get("device_name", "")), plan.cluster.gpus[0].memory_bytes)


def replay(folder: Path, key: str) -> dict[str, Any]:
    """One saved run of check model ``key`` in ``folder``, predicted again (module docstring)."""
    measured = load_profile(folder / f"{key}-measured.json")
    plan, _ = checked_plan(folder / f"{key}-plan.json", check_prediction=False)  # an earlier planner's: again below
    run = json.loads((folder / f"{key}-run.json").read_text())
    gpu = gpu_of(measured, plan)
    analytic = analytic_of(measured, key, gpu)
    judged, from_analytic = judge_plan(plan).prediction, judge_plan(replace(plan, profile=analytic)).prediction
    ratios = gc.layer_ratios(analytic, measured)
    shape = "x".join(str(n) for n in measured.input_shape or ())
    return {"run": folder.name, "model": key, "tokens": f"{measured.batch_size} x {shape}",
            "measured_s": float(run["measured_iteration_s"]), "predicted_s": judged.iteration_s,
            "analytic_s": from_analytic.iteration_s, "fwd": statistics.median(ratios["forward"]),
            "bwd": statistics.median(ratios["backward"]),
            "loss": (analytic.loss_s or 0.0) / measured.loss_s if measured.loss_s else None,
            "peak_bytes": max(r["peak_memory_bytes"] for r in run["ranks"]),
            "predicted_peak_bytes": judged.peak_memory_bytes}


def runs_in(root: Path) -> list[tuple[Path, str]]:
    """Every (folder, model key) under ``root`` with a saved measured profile, plan and run."""
    found = []
    for measured in sorted(root.glob("*/*-measured.json")):
        key = measured.name.removesuffix("-measured.json")
        if key in gc.MODELS and all((measured.parent / f"{key}-{part}.json").exists() for part in ("plan", "run")):
            found.append((measured.parent, key))
    return found


def row(r: dict[str, Any]) -> str:
    loss = "-" if r["loss"] is None else f"{r['loss']:.2f}"
    return (f"| {r['run']} | {r['model']} | {r['tokens']} | {r['measured_s'] * 1e3:.1f} | "
            f"{r['predicted_s'] * 1e3:.1f} | {r['measured_s'] / r['predicted_s']:.3f} | {r['analytic_s'] * 1e3:.1f} | "
            f"{r['measured_s'] / r['analytic_s']:.3f} | {r['fwd']:.2f} / {r['bwd']:.2f} | {loss} | "
            f"{r['peak_bytes'] / 1e9:.2f} | {r['predicted_peak_bytes'] / 1e9:.2f} | "
            f"{r['peak_bytes'] / r['predicted_peak_bytes']:.2f} |")


def report(rows: list[dict[str, Any]]) -> str:
    inside = sum(within(r["measured_s"] / r["predicted_s"]) for r in rows)
    return "\n".join([
        "| run | model | tokens | measured ms | predicted ms (measured profile) | measured/predicted | predicted ms "
        "(analytic) | measured/predicted | analytic/measured per layer, fwd / bwd | loss, analytic/measured | "
        "peak GB measured | predicted | measured/predicted |", "|---" * 13 + "|", *map(row, rows), "",
        f"target: measured/predicted (measured profile) within {TARGET[0]}..{TARGET[1]}: {inside} of {len(rows)}"])


def report_under(root: Path) -> str | None:
    """The report of every saved run under ``root`` (:func:`runs_in`), or None where there is none."""
    found = runs_in(root)
    return report([replay(folder, key) for folder, key in found]) if found else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", nargs="?", type=Path, default=DEFAULT, help="folder of saved runs' folders")
    args = ap.parse_args(argv)
    text = report_under(args.root)
    if text is None:
        print(f"gpu_replay: no saved runs under {args.root} (gpu_checks.py --save writes them)", file=sys.stderr)
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

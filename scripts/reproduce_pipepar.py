#!/usr/bin/env python3
"""Reproduce the PipePar paper's experiment (Figure 4) and PipeDream's VGG16 case.

The six models of the paper (vgg13, vgg16, vgg19, resnet34, resnet50, resnet152) at batch
64 and 128, from the shipped analytic RTX 2080Ti profiles, on the paper's cluster
(``pipepar-4x2-2080ti``: 4 servers x 2 RTX 2080Ti, 1 Gbit/s between servers, 10 Gbit/s
inside): every strategy of ``planner compare``, speedup over dp, as a table and a bar
chart in the style of the paper's Figure 4. Then VGG16 on ``pipedream-4x4-10g`` (16 GPUs in
4 servers on 10 Gbit/s), where PipeDream reported 9-5-1-1 and 3.00x over data parallel.

Writes into ``--out`` (default docs/pipepar/): ``speedups.md`` and ``speedups.csv`` (the
table), ``figure4.png`` (the chart), ``pipedream-vgg16.md`` and ``results.json`` (every
number, with configs and reasons). Pure arithmetic on shipped files: no GPU, no torch;
it takes a few seconds.

    .venv/bin/python scripts/reproduce_pipepar.py
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner import ir  # noqa: E402
from planner.cluster import load_cluster  # noqa: E402
from planner.compare import Comparison, compare  # noqa: E402
from planner.jsonio import read_json, write_json, write_text_atomic  # noqa: E402
from planner.render.compare import plot_speedup_groups  # noqa: E402
from planner.search.baselines import STRATEGIES  # noqa: E402

MODELS = ("vgg13", "vgg16", "vgg19", "resnet34", "resnet50", "resnet152")
BATCHES = (64, 128)
CLUSTER = "pipepar-4x2-2080ti"
PIPEDREAM_CLUSTER = "pipedream-4x4-10g"
PAPER = {"max_vgg_over_dp": 7.62, "max_resnet_over_dp": 2.42, "over_accpar": [1.05, 2.16]}


def load_profile(profiles: Path, model: str, batch: int) -> ir.ModelProfile:
    path = profiles / f"{model}-b{batch}-2080ti.json"
    return ir.ModelProfile.from_dict(read_json(path, "profile"), str(path))


def speedup_table(results: list[Comparison]) -> tuple[str, str]:
    """The Figure 4 numbers as a markdown table and as CSV: speedup over dp per strategy."""
    header = ["model", "batch", *STRATEGIES[1:], "planner config", "planner vs accpar"]
    rows = []
    for c in results:
        row: list[str] = [c.model, str(c.batch_size)]
        for name in STRATEGIES[1:]:
            s = c.get(name)
            row.append(f"{s.speedup_over_dp:.2f}" if s.fits and s.speedup_over_dp else "n/f")
        planner, accpar = c.get("planner"), c.get("accpar")
        row.append(planner.config or "-")
        ours, theirs = planner.iteration_s, accpar.iteration_s
        ratio = theirs / ours if planner.fits and accpar.fits and ours and theirs is not None else None
        row.append("-" if ratio is None else f"{ratio:.2f}")
        rows.append(row)
    md = "| " + " | ".join(header) + " |\n|" + "---|" * len(header) + "\n"
    md += "".join("| " + " | ".join(r) + " |\n" for r in rows)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return md, buf.getvalue()


def config_detail(c: Comparison, name: str) -> str:
    s = c.get(name)
    if not s.fits or s.plan is None or s.iteration_s is None:
        return f"does not fit: {s.reason}"
    stages = ", ".join(f"L{st.layers[0]}-{st.layers[1] - 1} on {st.width}" + (" (split forms)" if any(
        f != "dp" for f in st.forms) else "") for st in s.plan.stages)
    return (f"config {s.config}, {s.schedule}, M={s.microbatches}, {s.iteration_s * 1000:.1f} ms/iteration, "
            f"{s.speedup_over_dp:.2f}x over dp; stages: {stages}")


def reported_config(c: Comparison, args: argparse.Namespace) -> str:
    """PipeDream's own answer, 9-5-1-1, with the planner's best layers and forms for it."""
    from planner.errors import PlannerError
    from planner.judge import judge
    from planner.search import search

    dp = c.get("dp")
    s = c.get("planner")
    assert s.plan is not None
    try:
        plan = search(s.plan.profile, s.plan.cluster, config=(9, 5, 1, 1), schedule=args.schedule,
                      optimizer=args.optimizer)
    except PlannerError as exc:
        return f"does not fit: {exc.cause}"
    j = judge(plan, recompute=True)
    t = j.plan.predicted.iteration_s
    speed = f", {dp.iteration_s / t:.2f}x over dp" if dp.iteration_s else ""
    layers = ", ".join(f"L{st.layers[0]}-{st.layers[1] - 1}" for st in j.plan.stages)
    return (f"M={j.plan.microbatches}, {t * 1000:.1f} ms/iteration{speed}; stages {layers}"
            + ("" if j.fits else f" (does not fit: {j.reason})"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "pipepar"))
    parser.add_argument("--profiles", default=str(ROOT / "profiles"))
    parser.add_argument("--optimizer", default="momentum", help="optimizer state counted in memory")
    parser.add_argument("--schedule", default="1f1b", help="the planner's schedule")
    args = parser.parse_args()
    out, profiles = Path(args.out), Path(args.profiles)
    out.mkdir(parents=True, exist_ok=True)
    cluster = load_cluster(CLUSTER)
    started = time.perf_counter()
    results: list[Comparison] = []
    for batch in BATCHES:
        for model in MODELS:
            c = compare(load_profile(profiles, model, batch), cluster, schedule=args.schedule,
                        optimizer=args.optimizer)
            results.append(c)
            print(f"{model:>10} b{batch:<4} " + "  ".join(
                f"{s.name}={s.speedup_over_dp:.2f}" if s.fits and s.speedup_over_dp else f"{s.name}=n/f"
                for s in c.strategies[1:]), flush=True)
    md, csv_text = speedup_table(results)
    write_text_atomic(out / "speedups.md", md)
    write_text_atomic(out / "speedups.csv", csv_text)
    groups = [(f"batch {b}", [c for c in results if c.batch_size == b]) for b in BATCHES]
    plot_speedup_groups(groups, out / "figure4.png", STRATEGIES[1:],
                        f"Speedup over data parallel on {CLUSTER} (4 servers x 2 RTX 2080Ti, 1 Gbit/s)")

    pd_cluster = load_cluster(PIPEDREAM_CLUSTER)
    pd_lines = [f"# VGG16 on {PIPEDREAM_CLUSTER}\n",
                "PipeDream (SOSP'19) reported config 9-5-1-1 and 3.00x over data parallel for VGG16 on "
                "16 GPUs in 4 servers on 10 Gbit/s.\n"]
    pd_results = []
    for batch in BATCHES:
        c = compare(load_profile(profiles, "vgg16", batch), pd_cluster, schedule=args.schedule,
                    optimizer=args.optimizer)
        pd_results.append(c)
        pd_lines.append(f"\n## batch {batch}\n")
        for name in ("dp", "pipedream", "deepspeed", "accpar", "planner"):
            pd_lines.append(f"- **{name}**: {config_detail(c, name)}\n")
        pd_lines.append(f"- **PipeDream's reported 9-5-1-1**, its layers and forms searched by the planner "
                        f"(`--config 9-5-1-1`), judged by the same simulator: {reported_config(c, args)}\n")
        print(f"vgg16 b{batch} on {PIPEDREAM_CLUSTER}: planner {config_detail(c, 'planner')}; "
              f"pipedream {config_detail(c, 'pipedream')}", flush=True)
    write_text_atomic(out / "pipedream-vgg16.md", "".join(pd_lines))
    write_json(out / "results.json", {
        "kind": "reproduction", "version": 1, "cluster": CLUSTER, "optimizer": args.optimizer,
        "schedule": args.schedule, "paper": PAPER,
        "comparisons": [c.to_dict() for c in results],
        "pipedream_case": {"cluster": PIPEDREAM_CLUSTER, "reported_config": "9-5-1-1",
                           "reported_speedup_over_dp": 3.00, "comparisons": [c.to_dict() for c in pd_results]},
    })
    print()
    print(md)
    print(f"wrote {out}/speedups.md, speedups.csv, figure4.png, pipedream-vgg16.md, results.json "
          f"in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

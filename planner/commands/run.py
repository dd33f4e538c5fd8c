"""``planner run PLAN --model MODEL``: train the plan for real, measured beside the prediction."""

from __future__ import annotations

import os
import sys

import click

from planner.cli import emit_json
from planner.commands import read_plan
from planner.render.text import plain_text


@click.command("run")
@click.argument("plan_path", metavar="PLAN", type=click.Path(dir_okay=False))
@click.option("--model", required=True, help="Zoo name or package.module:factory (the profiled model).")
@click.option("--engine", type=click.Choice(["deepspeed", "torch"]), default="deepspeed", show_default=True)
@click.option("--steps", type=click.IntRange(min=1), default=10, show_default=True, help="Training steps.")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True,
              help="Steps left out of the median.")
@click.option("--loss", type=click.Choice(["cross_entropy", "mse"]), default="cross_entropy", show_default=True)
@click.option("--check", is_flag=True, help="Also train the unsplit model in one process and compare losses.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=None, help="Threads per process (default cores/P).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=1), default=900, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the run JSON document.")
def run(plan_path: str, model: str, engine: str, steps: int, warmup: int, loss: str, check: bool, seed: int,
        threads: int | None, timeout_s: float, as_json: bool) -> None:
    """Launch torchrun with the plan's world size and train on synthetic data."""
    plan, warnings = read_plan(plan_path)  # a bad plan fails before torch is imported

    from planner.runner import run_plan

    click.echo(f"training {plain_text(plan.model)} config {plan.config} on {engine} with {plan.world_size} "
               "processes...", err=True)
    log = sys.stderr if os.environ.get("PLANNER_DEBUG") else None
    doc = run_plan(plan, model, engine=engine, steps=steps, warmup=min(warmup, steps - 1), loss=loss,
                   check=check, seed=seed, threads=threads, timeout_s=timeout_s, log=log)
    if as_json:
        emit_json({**doc, "warnings": warnings})
        return
    ratio = doc["ratio"]
    click.echo(f"measured  {doc['measured_iteration_s']:.6f} s/iteration (median of {steps - doc['warmup']})")
    click.echo(f"predicted {doc['predicted_iteration_s']:.6f} s/iteration"
               + (f"  (measured/predicted {ratio:.2f})" if ratio else ""))
    click.echo("losses    " + " ".join(f"{x:.5f}" for x in doc["losses"]))
    if check:
        click.echo("reference " + " ".join(f"{x:.5f}" for x in doc["reference_losses"]))
        click.echo(f"max relative loss difference {doc['max_rel_loss_diff']:.3g}")

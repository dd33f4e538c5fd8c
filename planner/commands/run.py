"""``planner run PLAN --model MODEL``: train the plan for real, measured beside the prediction."""

from __future__ import annotations

import os
import shlex
import sys
from typing import Any

import click

from planner import ir
from planner.cli import emit_json
from planner.commands import FiniteRange, progress_option, read_plan
from planner.engines import run_engine
from planner.export import SEED_MAX
from planner.render.text import plain_text


@click.command("run")
@click.argument("plan_path", metavar="PLAN", type=click.Path(dir_okay=False))
@click.option("--model", required=True,
              help="The model the plan was made for: a zoo name or package.module:factory (as given to profile; "
                   "the profiled zoo model is built with the profile's --set overrides).")
@click.option("--engine", type=click.Choice(["deepspeed", "torch"]), default=None,
              help="Training engine: DeepSpeed's PipelineModule or torch.distributed.pipelining (default: the one "
                   "the plan was searched for; torch for a torchtitan plan; for a plan of engine any, deepspeed, or "
                   "torch where only torch runs it).")
@click.option("--steps", type=click.IntRange(min=1), default=10, show_default=True,
              help="Training steps (iterations of the plan's batch).")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True,
              help="First steps left out of the median iteration time.")
@click.option("--loss", type=click.Choice(["cross_entropy", "mse"]), default="cross_entropy", show_default=True,
              help="Loss on the synthetic data: cross_entropy (random class labels) or mse (random targets).")
@click.option("--check", is_flag=True, help="Also train the unsplit model in one process and compare losses.")
@click.option("--seed", type=click.IntRange(min=0, max=SEED_MAX), default=0, show_default=True,
              help="Seed of the weights and the synthetic data (the same in every process and in --check), "
                   f"0 to {SEED_MAX}.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="torch threads per process (default: CPU cores / processes).")
@click.option("--timeout", "timeout_s", type=FiniteRange(min=1), default=900, show_default=True,
              help="Seconds before the workers are stopped and the run fails.")
@click.option("--nnodes", type=click.IntRange(min=1), default=1, show_default=True,
              help="Servers to run on: the plan's servers, one `planner run` each (1: every rank here).")
@click.option("--node-rank", type=int, default=0, show_default=True,
              help="This server's place (0..nnodes-1) in the plan's order of servers.")
@click.option("--rdzv-endpoint", default=None, metavar="HOST:PORT",
              help="Node rank 0's address and a free port, the same on every server (needed with --nnodes > 1).")
@click.option("--rdzv-timeout", "rdzv_timeout_s", type=FiniteRange(min=1), default=60, show_default=True,
              help="Seconds the servers have to meet at the endpoint.")
@progress_option
@click.option("--json", "as_json", is_flag=True, help="Print the run JSON document on stdout.")
def run(plan_path: str, model: str, engine: str | None, steps: int, warmup: int, loss: str, check: bool, seed: int,
        threads: int | None, timeout_s: float, nnodes: int, node_rank: int, rdzv_endpoint: str | None,
        rdzv_timeout_s: float, progress: bool | None, as_json: bool) -> None:
    """Launch torchrun with the plan's world size (or this server's share) and train on synthetic data.

    Prints the measured median iteration beside the plan's prediction, the loss per step and
    the peak memory per rank (with --check, the single-process losses and their largest
    relative difference).
    """
    plan, warnings = read_plan(plan_path)  # a bad plan fails before torch is imported
    engine = engine or run_engine(plan)

    from planner.render.progress import status
    from planner.runner import local_processes, run_plan

    local_processes(plan, nnodes, node_rank, rdzv_endpoint)  # servers that do not fit: refused before any command
    if nnodes > 1:
        click.echo(f"{nnodes} servers, this is node rank {node_rank}; on each server:", err=True)
        for r in range(nnodes):
            click.echo(f"  node rank {r}: " + _command(plan_path, model, engine, nnodes, r, rdzv_endpoint), err=True)
    log = sys.stderr if os.environ.get("PLANNER_DEBUG") else None
    with status(_title(plan, engine, steps, check), progress, as_json):
        doc = run_plan(plan, model, engine=engine, steps=steps, warmup=min(warmup, steps - 1), loss=loss,
                       check=check, seed=seed, threads=threads, timeout_s=timeout_s, log=log, nnodes=nnodes,
                       node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, rdzv_timeout_s=rdzv_timeout_s)
    from planner.runner.fingerprint import read_check
    from planner.runner.reference import check_failure

    for found in doc.get("warnings", []):
        warnings = [*warnings, found]
        click.echo(f"warning: {plain_text(found)}", err=True)
    failed = check_failure(plan, doc["losses"], doc["reference_losses"], read_check(doc)) if check else None
    if failed is not None:
        raise failed
    if as_json:
        emit_json({**doc, "warnings": warnings})
        return
    _print(doc, steps, check)


def _title(plan: ir.Plan, engine: str, steps: int, check: bool) -> str:
    """What the progress line says while training: ``2 processes`` on CPU clusters, ``8 GPUs`` otherwise."""
    from planner.render.text import count, device_noun

    noun = "process" if device_noun(g.name for g in plan.cluster.gpus) != "GPU" else "GPU"
    return (f"training {plain_text(plan.model)} config {plan.config} on {engine} with "
            f"{count(plan.world_size, noun)}, {count(steps, 'step')}"
            + (", then the one-process check" if check else ""))


def _command(plan_path: str, model: str, engine: str, nnodes: int, node_rank: int, endpoint: str | None) -> str:
    """The `planner run` line for one server."""
    return shlex.join(["planner", "run", plan_path, "--model", model, "--engine", engine, "--nnodes", str(nnodes),
                       "--node-rank", str(node_rank), "--rdzv-endpoint", endpoint or "HOST:PORT"])


def _print(doc: dict[str, Any], steps: int, check: bool) -> None:
    """The run's summary on stderr, as every command's human output (docs/contracts.md; stdout is ``--json``'s)."""
    ratio = doc["ratio"]
    lines = [f"measured  {doc['measured_iteration_s']:.6f} s/iteration (median of {steps - doc['warmup']})",
             f"predicted {doc['predicted_iteration_s']:.6f} s/iteration"
             + (f"  (measured/predicted {ratio:.2f})" if ratio else ""),
             "losses    " + " ".join(f"{x:.5f}" for x in doc["losses"]),
             "peak memory per rank (MiB, measured/predicted) " + " ".join(
                 f"{r['device']}:{r['peak_memory_bytes'] / 2**20:.1f}/{r['predicted_memory_bytes'] / 2**20:.1f}"
                 for r in doc["ranks"])]
    for stage in doc.get("stages") or []:
        measured = stage["measured"]
        step = f"(one profiled step, {sum(measured.values()) * 1e3:.1f} in all) " if measured else ""
        lines.append(f"stage {stage['stage']} (ms per step)  measured {step}" + _terms_text(measured)
                     + "  predicted " + _terms_text(stage["predicted"]))
    if check:
        lines += ["reference " + " ".join(f"{x:.5f}" for x in doc["reference_losses"]),
                  f"max relative loss difference {doc['max_rel_loss_diff']:.3g}",
                  _weights_text(doc)]
    click.echo("\n".join(lines), err=True)


def _weights_text(doc: dict[str, Any]) -> str:
    """The weights' part of ``--check``: the largest difference from one process's, relative to the update."""
    diff, compared = doc.get("max_rel_weight_diff"), doc.get("weights_compared", 0)
    if not compared:
        return "weights   not compared"
    worst = f" ({plain_text(doc['worst_weight'])})" if doc.get("worst_weight") else ""
    unjudged = len(doc.get("weights_unjudged", []))
    noise = f"; {unjudged} not judged (gradients of rounding noise)" if unjudged else ""
    return (f"weights   {compared} parameters, largest difference {'not finite' if diff is None else f'{diff:.3g}'} "
            f"of its update{worst}{noise}")


def _terms_text(terms: dict[str, float] | None) -> str:
    """``compute 12.3, transfers 0.4, ...`` in milliseconds (``-`` when not measured)."""
    return "-" if not terms else ", ".join(f"{name} {t * 1e3:.1f}" for name, t in terms.items())

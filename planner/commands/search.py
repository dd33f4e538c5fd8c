"""``planner search PROFILE --cluster C -o PLAN``: the fastest plan that fits (HPP inside SP)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import click

from planner import ir
from planner.commands import (
    check_emitted,
    cluster_option,
    grid_options,
    memory_headroom_option,
    microbatches_option,
    optimizer_option,
    outputs,
    parse_grid,
    parse_microbatches,
    planning_cluster,
    profile_argument,
    progress_option,
    rerank_option,
)
from planner.jsonio import check_loadable, dumps, read_json
from planner.schedule import SCHEDULES

if TYPE_CHECKING:
    from planner.explain import Explanation
    from planner.judge import Judged


@click.command("search")
@profile_argument
@cluster_option
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False), default=None,
              help="Write the plan JSON here (self-contained: it embeds the profile and cluster).")
@microbatches_option
@click.option("--schedule", type=click.Choice(SCHEDULES), default="1f1b", show_default=True,
              help="Pipeline schedule the plan is made for.")
@optimizer_option
@click.option("--solver", type=click.Choice(["dp", "brute"]), default="dp", show_default=True,
              help="dp: the exact dynamic programs; brute: exhaustive over the same space (small inputs).")
@click.option("--engine", type=click.Choice(["any", "deepspeed", "torch", "torchtitan"]), default="any",
              show_default=True,
              help="Restrict to plans an engine can run: deepspeed (one pipe x data grid, ZeRO 0-1, no tensor "
                   "parallelism), torch (one tp x dp grid for every stage), torchtitan (as torch, one ZeRO stage).")
@grid_options
@memory_headroom_option
@click.option("--config", "config", default=None, help="Fix the devices per stage in PipeDream notation, e.g. 2-1-1.")
@rerank_option("Judge the N best distinct plans the search met, and its grid seeds, with the event-driven "
               "simulator and keep the fastest; the prediction is the simulator's (0: the exact optimum of "
               "the analytic objective, with its analytic prediction).")
@click.option("--virtual-stages", "virtual_stages", type=click.IntRange(min=1), default=None,
              help="Model chunks per device group under --schedule interleaved (Megatron's virtual stages; "
                   "default 2 with interleaved, else 1): K*v chunks, chunk c on group c mod K.")
@click.option("--explain", "long_explanation", is_flag=True,
              help="Explain the plan in full: per stage where the iteration goes (compute, transfers, all-reduce, "
                   "optimizer, idle) and its memory headroom, and the other plans judged with what bounds each.")
@progress_option
@click.option("--json", "as_json", is_flag=True,
              help="Print the plan as one JSON document on stdout, with an 'explanation' key beside the plan's.")
def search(profile_path: str, cluster_name: str, output: str | None, microbatches: str, schedule: str,
           optimizer: str, solver: str, engine: str, precision: str | None, tp: str, zero: str, recompute: str,
           micro_batch_size: int | None, sequence_parallel: bool, memory_headroom: float, config: str | None,
           rerank: int,
           virtual_stages: int | None, long_explanation: bool, progress: bool | None, as_json: bool) -> None:
    """Find the fastest plan that fits: stages, device groups and per-layer forms.

    The stage DP (PipePar Algorithm 2) splits the layers into pipeline stages over device
    groups that follow the cluster's hierarchy, each a tensor x data grid (tensor groups
    inside a server) with its ZeRO stage and recomputation; inside each stage HPP
    (Algorithm 1) picks each layer's form (dp, split_in, split_out, tp). The objective is
    the iteration time of the schedule with its bubble, transfers and gradient
    synchronisation; every device must fit.
    """
    from planner.consistency import idle_settings
    from planner.render.search import print_plan
    from planner.search import parse_config

    mb = parse_microbatches(microbatches)
    tp_value, zero_value = parse_grid(tp, zero)
    widths = parse_config(config) if config else None
    out = outputs([output], inputs=[profile_path, cluster_name])
    profile = ir.ModelProfile.from_dict(read_json(profile_path, "profile"), profile_path)
    cluster = planning_cluster(cluster_name, memory_headroom)
    t0 = time.perf_counter()
    plan, explanation = _search_explained(
        profile, cluster, progress, as_json, rerank, schedule=schedule, virtual_stages=virtual_stages,
        microbatches=mb, optimizer=optimizer, solver=solver, engine=engine, config=widths, precision=precision,
        tp=tp_value, zero=zero_value, recompute=recompute, micro_batch_size=micro_batch_size,
        sequence_parallel=sequence_parallel)
    elapsed = time.perf_counter() - t0
    check_emitted(plan)  # the plan document is the JSON output: its warnings go to stderr only
    _warn_unrun(plan)
    _warn_unmeasured(plan)
    tight = explanation.tight_memory("the plan")
    for warning in idle_settings(plan, "the plan") + tight:
        click.echo(f"warning: {warning}", err=True)  # a forced option that changes nothing; a GPU nearly full
    doc = _plan_document(plan)
    check_loadable(doc)
    out.write_text(output, dumps(doc))
    print_plan(plan, explanation, elapsed_s=elapsed, output=output, long=long_explanation)
    if as_json:
        from planner.cli import emit_json

        emit_json(dict(doc, explanation=explanation.to_dict()))
    out.commit()


def _warn_unrun(plan: ir.Plan) -> None:
    """A warning on stderr where the plan, searched for no engine, is one no engine runs (planner.runnable)."""
    from planner.render.text import plain_text
    from planner.runnable import unrun_note

    note = unrun_note(plan)
    if note is not None:
        click.echo(f"warning: {plain_text(note[0])}; {plain_text(note[1])}", err=True)


def _warn_unmeasured(plan: ir.Plan) -> None:
    """A warning on stderr where the plan's engine's overheads were not measured on its CPU cluster."""
    from planner.costmodel.engine import unmeasured_note
    from planner.render.text import plain_text

    note = unmeasured_note(plan.cluster, plan.engine)
    if note is not None:
        click.echo(f"warning: {plain_text(note)}", err=True)


def _search_explained(profile: ir.ModelProfile, cluster: ir.Cluster, progress: bool | None, as_json: bool,
                      rerank: int, **options: Any) -> tuple[ir.Plan, Explanation]:
    """The searched plan (``planner.api.search_plan`` with ``options``) and its explanation, under a
    status line; the explanation reuses the judged alternatives of the re-rank."""
    from planner.api import search_plan
    from planner.explain import explain
    from planner.render.progress import status

    judged: list[Judged] | None = [] if rerank > 0 else None
    with status(f"searching plans for {profile.model} on {cluster.name}", progress, as_json) as update:
        plan = search_plan(profile, cluster, candidates=rerank, progress=update, alternatives=judged, **options)
        update("explaining the plan")
        known = [(j.plan, j.prediction) for j in judged] if judged else None  # interleaved: none handed out
        return plan, explain(plan, known)


def _plan_document(plan: ir.Plan) -> dict[str, Any]:
    """The plan's JSON, with the note (also on stderr) when the profile's times were rescaled."""
    from planner.costmodel.precision import rescale_note
    from planner.render.text import plain_text

    doc = plan.to_dict()
    note = rescale_note(plan.profile, plan.cluster, plan.precision)
    if note is not None:  # it names the profile's device and the cluster, as the files spell them
        click.echo(f"note: {plain_text(note.text)}", err=True)
        if note.warning is not None:
            click.echo(f"warning: {plain_text(note.warning)}", err=True)
        doc["rescale"] = note.to_dict()
    return doc

"""``planner simulate PLAN``: play a plan's pipeline schedule event by event."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from planner import ir
from planner.commands import FiniteRange, outputs, plot_option, progress_option, read_plan
from planner.jsonio import dumps

if TYPE_CHECKING:
    from planner.explain import Explanation
    from planner.simulate import SimResult


def _plot(result: SimResult, plan: ir.Plan, plot_path: str, explanation: Explanation) -> None:
    from planner.render.gantt import plot_simulation

    plot_simulation(result, plot_path, title=f"{plan.model} on {plan.cluster.name}: {plan.schedule}, "
                                             f"config {plan.config}, M={plan.microbatches}, "
                                             f"iteration {result.iteration_s * 1000:.3f} ms, "
                                             f"bubble {result.bubble_fraction:.1%}", explanation=explanation)


def _report(result: SimResult, plan: ir.Plan, width: int | None, show_table: bool,
            written: tuple[tuple[str | None, str], ...], explanation: Explanation, long: bool) -> None:
    """Gantt, summary, optional schedule table, prediction against simulation, explanation and files written,
    on stderr."""
    from planner.render import stderr_console
    from planner.render.explain import print_explanation
    from planner.render.simulate import print_simulation
    from planner.render.text import safe_text
    from planner.schedule import make_schedule

    print_simulation(result, plan.batch_size, width)
    console = stderr_console()
    if show_table:
        console.print(make_schedule(plan.schedule, plan.pipeline_stages, plan.microbatches,
                                    plan.virtual_stages).table(),
                      highlight=False, markup=False)
    predicted = plan.predicted.iteration_s
    if predicted > 0:
        console.print(f"plan's prediction {predicted * 1000:.3f} ms; simulated "
                      f"{result.iteration_s * 1000:.3f} ms ({result.iteration_s / predicted:.3f}x)",
                      highlight=False)
    print_explanation(explanation, console, long=long)
    for path, what in written:
        if path:
            console.print(f"wrote {what} {safe_text(path)}", highlight=False)


def _json_doc(result: SimResult, plan: ir.Plan, explanation: Explanation) -> dict[str, Any]:
    """The simulate JSON: the simulation with the plan's model, config, throughput, prediction and explanation."""
    doc: dict[str, Any] = result.to_dict()
    doc.update({"model": plan.model, "config": plan.config, "batch_size": plan.batch_size,
                "samples_per_s": plan.batch_size / result.iteration_s if result.iteration_s > 0 else None,
                "predicted_iteration_s": plan.predicted.iteration_s, "explanation": explanation.to_dict()})
    return doc


@click.command("simulate")
@click.argument("plan_path", metavar="PLAN", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the simulation as one JSON document on stdout.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None,
              help="Write a Chrome trace event JSON (open it in https://ui.perfetto.dev).")
@plot_option("Write a picture to this PNG file: the Gantt of devices and links, memory per device group "
             "over time against capacity, and where each stage's time goes.")
@click.option("--overlap-allreduce", is_flag=True,
              help="All-reduce gradients in DDP buckets overlapped with the last backward (default: after it).")
@click.option("--bucket-mb", type=FiniteRange(min=0.001, max=1e9), default=25.0, show_default=True,
              help="DDP bucket size in MiB for --overlap-allreduce.")
@click.option("--half-duplex", is_flag=True, help="Activations and gradients share a link's bandwidth.")
@click.option("--width", type=click.IntRange(min=16, max=1000), default=None,
              help="Columns of the text Gantt (default: fit the terminal).")
@click.option("--table", "show_table", is_flag=True,
              help="Also print the schedule as a device x time-slot table (torch.distributed.pipelining style).")
@click.option("--explain", "long_explanation", is_flag=True,
              help="Explain in full: per stage where the iteration goes and its memory headroom, as tables.")
@progress_option
@click.option("--quiet", "-q", is_flag=True, help="Print nothing on stderr.")
def simulate(plan_path: str, as_json: bool, trace_path: str | None, plot_path: str | None, overlap_allreduce: bool,
             bucket_mb: float, half_duplex: bool, width: int | None, show_table: bool, long_explanation: bool,
             progress: bool | None, quiet: bool) -> None:
    """Simulate one training iteration of PLAN: iteration time, bubble, busy time and memory per device.

    Devices run their schedule's actions one at a time; activations and gradients cross
    links with latency and bandwidth (shared by transfers on one link), overlapping
    compute; gradients are all-reduced after each stage's last backward. Prints a text
    Gantt and a summary on stderr; --json, --trace and --plot as documented.
    """
    from planner.explain import explain
    from planner.render.progress import status
    from planner.simulate import SimOptions
    from planner.simulate import simulate as run_simulation

    out = outputs([trace_path, plot_path], inputs=[plan_path])
    plan, warnings = read_plan(plan_path, quiet)
    options = SimOptions(overlap_allreduce=overlap_allreduce, bucket_bytes=bucket_mb * 2**20,
                         duplex=not half_duplex)
    shown = False if quiet else progress
    with status(f"simulating {plan.model} config {plan.config}", shown, as_json) as update:
        result = run_simulation(plan, options)
        explanation = explain(plan, result=result)
        if trace_path:
            out.write_text(trace_path, dumps(result.to_chrome_trace()))
        if plot_path:
            update(f"drawing {plot_path}")
            _plot(result, plan, str(out.temp(plot_path)), explanation)
    tight = explanation.tight_memory("the plan")  # a GPU nearly full: may not fit
    for warning in [] if quiet else tight:
        click.echo(f"warning: {warning}", err=True)
    warnings = warnings + tight
    if not quiet:
        _report(result, plan, width, show_table, ((trace_path, "trace"), (plot_path, "picture")), explanation,
                long_explanation)
    if as_json:
        from planner.cli import emit_json

        emit_json({**_json_doc(result, plan, explanation), "warnings": warnings})
    out.commit()

"""``planner compare PROFILE --cluster C``: every baseline and the planner's plan side by side."""

from __future__ import annotations

import click

from planner import ir
from planner.commands import (
    check_emitted,
    cluster_option,
    memory_headroom_option,
    microbatches_option,
    optimizer_option,
    outputs,
    parse_microbatches,
    planning_cluster,
    plot_option,
    profile_argument,
    progress_option,
    rerank_option,
)
from planner.errors import InfeasibleError, UsageError
from planner.jsonio import read_json
from planner.schedule import SCHEDULES

STRATEGY_HELP = "comma-separated subset of: dp, accpar, gpipe-uniform, torchgpipe, deepspeed, pipedream, " \
                "megatron, planner (default: all); each baseline runs every documented setting and shows its best"


@click.command("compare")
@profile_argument
@cluster_option
@microbatches_option
@click.option("--schedule", type=click.Choice(SCHEDULES), default=None,
              help="The planner's pipeline schedule (each baseline runs its own system's schedule); "
                   "default: the faster of 1f1b and gpipe.")
@optimizer_option
@memory_headroom_option
@click.option("--strategies", default=None, help=STRATEGY_HELP)
@rerank_option("The planner row: the search's N best plans and its grid seeds re-ranked by the simulator "
               "(0: the analytic optimum alone).")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as one JSON document on stdout.")
@plot_option("Write a chart of the strategies to this PNG file: speedup over dp, iteration time and peak "
             "memory per GPU against capacity.")
@progress_option
def compare(profile_path: str, cluster_name: str, microbatches: str, schedule: str | None, optimizer: str,
            memory_headroom: float, strategies: str | None, rerank: int, as_json: bool, plot_path: str | None,
            progress: bool | None) -> None:
    """Set the planner's plan against dp, AccPar, GPipe, torchgpipe, DeepSpeed, PipeDream and Megatron-LM.

    Every strategy is judged by the same cost model and simulator on the same cluster, each
    baseline at the best of its documented settings (named in the table): a table of
    iteration time, samples/s, speedup over dp, memory per GPU, whether it fits (and why
    not), and the config in PipeDream notation.
    """
    from planner.compare import compare as run_compare
    from planner.render.compare import plot_comparison, print_comparison
    from planner.render.progress import status

    mb = parse_microbatches(microbatches)
    out = outputs([plot_path], inputs=[profile_path, cluster_name])
    names = None if strategies is None else [s.strip() for s in strategies.split(",") if s.strip()]
    if names == []:
        raise UsageError(f"--strategies {strategies!r} names no strategy", STRATEGY_HELP)
    profile = ir.ModelProfile.from_dict(read_json(profile_path, "profile"), profile_path)
    cluster = planning_cluster(cluster_name, memory_headroom)
    kwargs = {} if names is None else {"strategies": names}
    with status(f"judging strategies for {profile.model} on {cluster.name}", progress, as_json) as update:
        result = run_compare(profile, cluster, microbatches=mb, schedule=schedule, optimizer=optimizer,
                             rerank=rerank, progress=update, **kwargs)
    print_comparison(result)
    warnings = [w for s in result.strategies if s.fits and s.plan for w in check_emitted(s.plan, s.name)]
    if not any(s.fits for s in result.strategies):  # as search: no plan fits is exit 3
        planner = next((s for s in result.strategies if s.name == "planner"), result.strategies[0])
        raise InfeasibleError(f"no strategy fits on {cluster.name}: {planner.name}: {planner.reason}",
                              "more or larger devices, a smaller batch, or recomputation (see the table)")
    if plot_path:
        plot_comparison(result, out.temp(plot_path))
    if as_json:
        from planner.cli import emit_json

        emit_json({**result.to_dict(), "warnings": warnings})
    out.commit()
    if plot_path and not as_json:
        click.echo(f"wrote picture {plot_path}", err=True)

"""One module per CLI command; each defines a click command named after it.

This module owns what several commands share: option declarations (search, compare), the
``--microbatches`` parser, the outputs of a command (:func:`outputs`: checked before any work,
committed together at the end) and reading a plan file with its warnings (:func:`read_plan`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import PurePath
from typing import TYPE_CHECKING, Any, TypeVar

import click

from planner import ir
from planner.errors import PlannerError, UsageError
from planner.outputs import Outputs, check_output

if TYPE_CHECKING:
    import os

RERANK = 16
"""planner.search.RERANK, repeated so that ``--help`` loads no algorithm module (test_cmd_search checks they agree)."""


F = TypeVar("F", bound=Callable[..., Any])


class FiniteRange(click.FloatRange):
    """A float option in ``[min, max]`` that also refuses NaN and infinities (which click's range lets through: a
    NaN compares false with every bound), so that a timeout of ``nan`` cannot disable a watchdog nor a
    ``--memory-headroom nan`` get past the usage check (exit 2) to fail later as an error."""

    name = "finite float range"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


# Options search and compare share (one declaration, one meaning); each command adds its own --schedule, --rerank help.
profile_argument = click.argument("profile_path", metavar="PROFILE", type=click.Path(dir_okay=False))
cluster_option = click.option("--cluster", "cluster_name", required=True,
                              help="A preset name (see planner clusters) or a cluster JSON.")
memory_headroom_option = click.option(
    "--memory-headroom", "memory_headroom", type=FiniteRange(0.0, ir.MAX_HEADROOM), default=0.0,
    show_default=True,
    help="Share of every GPU's memory to keep free (0.1: plan within 90%): the cost model counts the tensors the "
         "engine allocates, not the CUDA context, communication buffers or the allocator's fragmentation.")
microbatches_option = click.option(
    "--microbatches", default="auto", show_default=True,
    help="Micro-batches per iteration: N (must divide the batch size) or auto (try every divisor up to 4096).")
optimizer_option = click.option("--optimizer", type=click.Choice(ir.OPTIMIZERS), default="sgd", show_default=True,
                                help="Optimizer whose state counts in memory (fp32 RMSProp: 12 bytes per parameter).")


def _png_path(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--plot``'s file: a PNG is what is drawn, so a name with another suffix (``x.svg``, ``x.txt``, a
    ``plan.json`` named by mistake) is refused before anything is written, not overwritten with PNG bytes. A
    name without a suffix is taken as given."""
    suffix = PurePath(value).suffix if value else ""
    if suffix and suffix.lower() != ".png":
        raise click.BadParameter(f"{value!r} ends in {suffix!r}: the picture is drawn as PNG; name it "
                                 f"{PurePath(value or '').with_suffix('.png')}", ctx=ctx, param=param)
    return value


def plot_option(help_text: str) -> Callable[[F], F]:
    """``--plot FILE.png`` (simulate, compare), refusing a name with another suffix (.svg, .txt, .json ...: exit
    2) rather than writing PNG bytes under it."""
    return click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
                        callback=_png_path, help=help_text)


progress_option = click.option(
    "--progress/--no-progress", "progress", default=None,
    help="Show progress on stderr (default: on a terminal, and not with --json; env PLANNER_PROGRESS=1|0).")


def grid_options(func: F) -> F:
    """The grid options of search: precision, tensor degree, ZeRO, recomputation, micro-batch size, sequence
    parallelism."""
    options = [
        click.option("--precision", type=click.Choice(ir.PRECISIONS), default=None,
                     help="fp32, or bf16/fp16 mixed precision (16-bit weights, gradients and activations, fp32 "
                          "master weights and optimizer state); default: the profile's dtype."),
        click.option("--tp", "tp", default="auto", show_default=True,
                     help="Tensor-parallel degree of every stage (a power of two inside one server), or auto."),
        click.option("--zero", "zero", type=click.Choice(["auto", "0", "1", "2", "3"]), default="auto",
                     show_default=True, help="ZeRO stage over each stage's data-parallel group, or auto."),
        click.option("--recompute", type=click.Choice(["auto", *ir.RECOMPUTE]), default="auto", show_default=True,
                     help="Activation recomputation: none, selective (attention core), full, or auto (per stage)."),
        click.option("--micro-batch-size", "micro_batch_size", type=click.IntRange(min=1), default=None,
                     help="Samples per micro-batch on each data-parallel rank (as Megatron-LM counts it), "
                          "instead of choosing it through --microbatches."),
        click.option("--sequence-parallel/--no-sequence-parallel", "sequence_parallel", default=True,
                     show_default=True,
                     help="Split tensor-parallel stages' norms, dropouts and residual adds over the sequence "
                          "(Megatron-LM's sequence parallelism) where the engine and the sequence length allow; "
                          "--no-sequence-parallel keeps them whole on every rank, as Megatron-LM before 2022."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def parse_grid(tp: str, zero: str) -> tuple[int | None, int | str]:
    """``--tp N|auto`` and ``--zero auto|0-3`` as the library takes them (UsageError for a bad --tp)."""
    zero_value: int | str = zero if zero == "auto" else int(zero)
    if tp == "auto":
        return None, zero_value
    try:
        n = int(tp)
    except ValueError:
        raise UsageError(f"--tp {tp!r} is neither a positive integer nor 'auto'", "e.g. --tp 8 or --tp auto") \
            from None
    if n < 1:
        raise UsageError(f"--tp {tp!r} must be a positive integer or 'auto'", "e.g. --tp 8")
    return n, zero_value


def rerank_option(help_text: str) -> Callable[[F], F]:
    """``--rerank N`` (default :data:`RERANK`) with the command's own help."""
    return click.option("--rerank", type=click.IntRange(min=0), default=RERANK, show_default=True, help=help_text)


def parse_microbatches(value: str) -> int | str:
    """``--microbatches``: ``N`` (a positive integer) or ``auto``; anything else is a UsageError (exit 2)."""
    if value == "auto":
        return value
    try:
        n = int(value)
    except ValueError:
        raise UsageError(f"--microbatches {value!r} is neither a positive integer nor 'auto'",
                         "e.g. --microbatches 4 or --microbatches auto") from None
    if n < 1:
        raise UsageError(f"--microbatches {value!r} must be a positive integer or 'auto'", "e.g. --microbatches 4")
    return n


def check_folder(path: str | None) -> None:
    """Fail before any work if an output file cannot be written (``None``: no output; see planner.outputs)."""
    check_output(path)


def outputs(files: list[str | None] | None = None, folders: list[str | None] | None = None,
            inputs: list[str | None] | None = None) -> Outputs:
    """The command's outputs, checked now (none may be one of its ``inputs``); staged files not committed are
    removed when the command ends."""
    return click.get_current_context().with_resource(Outputs(files or [], folders or [], inputs or []))


def read_plan(path: str | os.PathLike[str], quiet: bool = False) -> tuple[ir.Plan, list[str]]:
    """A plan file, checked (planner.consistency), with its warnings (printed on stderr unless ``quiet``)."""
    from planner.consistency import load_plan
    from planner.render.text import plain_text

    plan, warnings = load_plan(path)
    for warning in [] if quiet else warnings:
        click.echo(f"warning: {plain_text(warning)}", err=True)
    return plan, warnings


def planning_cluster(name: str, headroom: float) -> ir.Cluster:
    """The cluster ``--cluster`` names, with ``--memory-headroom``'s share of every GPU's memory kept free (a note
    on stderr says what each GPU then offers; the plan embeds the cluster so reduced)."""
    from planner.cluster import load_cluster

    cluster = load_cluster(name)
    reduced = cluster.keeping_free(headroom)
    if reduced is not cluster:
        sizes = sorted({(g.memory_bytes, r.memory_bytes) for g, r in zip(cluster.gpus, reduced.gpus, strict=True)})
        shown = ", ".join(f"{b / 2**30:.2f} GiB -> {r / 2**30:.2f} GiB" for b, r in sizes[:3])
        click.echo(f"note: --memory-headroom {headroom:g} keeps {headroom:.0%} of every GPU's memory free: "
                   f"{shown}{', ...' if len(sizes) > 3 else ''}", err=True)
    return reduced


EMITTED_MUST_RUN = True
"""Whether a plan a command emits that cannot run is an internal error (True) or a warning (False)."""


def check_emitted(plan: ir.Plan, what: str = "the search") -> list[str]:
    """The safety net on every plan a command writes or prints: it must run on its engine
    (planner.runnable). An internal error under :data:`EMITTED_MUST_RUN`, else a warning (printed, returned)."""
    from planner.errors import PlanError
    from planner.render.text import plain_text
    from planner.runnable import check_runnable

    try:
        check_runnable(plan)
    except PlanError as exc:
        cause = f"{what} produced a plan that cannot run: {exc.cause}"
        if EMITTED_MUST_RUN:
            raise PlannerError(f"internal error: {cause}",
                               "please report it; meanwhile try another --microbatches or --config") from None
        click.echo(f"warning: {plain_text(cause)}", err=True)
        return [cause]
    return []

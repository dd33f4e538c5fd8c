"""What a generated ``train.py`` checks of its launch before it builds anything, and how it reports a refusal.

A program exported for a plan runs one process per device of the plan, started by a launcher (torchrun, the
``launch_node<R>.sh`` scripts, DeepSpeed's launcher), which sets ``RANK`` and ``WORLD_SIZE`` (and
``LOCAL_WORLD_SIZE``, or DeepSpeed's ``LOCAL_SIZE``). :func:`check_launch` refuses, with the numbers and the
command to run instead: a process started without a launcher (torch and DeepSpeed would fail deep in their
rendezvous: "environment variable RANK expected", "No module named 'mpi4py'"), a launch of another number of
processes than the plan's (DeepSpeed's topology would fail with "Invalid Grid" or "rank 2 not found in
topology"), and on a CUDA machine more processes on this server than it has GPUs (each process takes the GPU
of its local rank). :func:`run` runs a script's ``main`` and prints a :class:`~planner.errors.PlannerError` as
the CLI does, ``error:`` and ``hint:`` lines on stderr and exit 1, not as a traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping

from planner import ir
from planner.errors import ExportError, PlannerError
from planner.export.nodes import node_layout
from planner.export.quoting import one_line


def _how_to_start(plan: ir.Plan) -> str:
    """The launch commands for the plan's processes: every rank on one machine, or a script per server."""
    world = plan.world_size
    one = (f"torchrun --standalone --nproc-per-node {world} train.py (or sh launch_node0.sh) for every rank on one "
           "machine")
    try:
        layout = node_layout(plan)
    except ExportError:
        return one
    if layout.nnodes == 1:
        return one
    return (f"{one}, or sh launch_node<R>.sh HOST:PORT on each of the plan's {layout.nnodes} servers "
            f"({layout.nproc_per_node} processes each)")


def check_launch(plan: ir.Plan, env: Mapping[str, str] | None = None, gpus: int | None = None) -> None:
    """ExportError unless this process was started by a launcher with the plan's number of processes and, where
    ``gpus`` (this machine's CUDA devices; None or 0: none, the CPU) are, a GPU for each process on this server."""
    env = os.environ if env is None else env
    world = plan.world_size
    if "RANK" not in env or "WORLD_SIZE" not in env:
        raise ExportError(f"train.py was started without a launcher (no RANK or WORLD_SIZE in its environment); "
                          f"the plan runs {world} processes, one per device", f"start it with {_how_to_start(plan)}")
    started = _whole(env, "WORLD_SIZE")
    if started != world:
        raise ExportError(f"the plan runs {world} processes (config {plan.config}), {started} were started",
                          f"start {world}: {_how_to_start(plan)}")
    local = _whole(env, "LOCAL_WORLD_SIZE") or _whole(env, "LOCAL_SIZE")
    if gpus and local > gpus:
        raise ExportError(f"this server starts {local} processes, one per GPU, and has {gpus} GPU(s)",
                          "run the plan on servers with as many GPUs as it uses on each, or search it again for "
                          "this cluster")


def _whole(env: Mapping[str, str], name: str) -> int:
    """The environment variable ``name`` as a whole number (0 when unset or not one)."""
    text = env.get(name, "")
    return int(text) if text.isascii() and text.isdigit() else 0


def run(main: Callable[[], None]) -> None:
    """Run a generated script's ``main``; a PlannerError ends the process with ``error:``/``hint:`` lines, exit 1."""
    try:
        main()
    except PlannerError as exc:
        rank = os.environ.get("RANK")
        who = f"[rank {rank}] " if rank is not None else ""
        print(f"{who}error: {one_line(exc.cause)}", file=sys.stderr)
        if exc.hint:
            print(f"{who}hint: {one_line(exc.hint)}", file=sys.stderr)
        sys.exit(1)

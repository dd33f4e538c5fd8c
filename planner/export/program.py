"""The exported program folder: ``plan.json``, ``train.py``, the engine's config, launch scripts, README.

:func:`export_plan` first refuses a plan the engine cannot run (the shared
:func:`planner.runnable.check_runnable`, then the engine's own layer-level checks), then
writes, atomically: the plan, a commented ``train.py`` runnable with ``torchrun`` (and, for
DeepSpeed, with the ``deepspeed`` launcher), the engine's config (``ds_config.json``), one
``launch_node<R>.sh`` per server the plan uses (torchrun for that server's ranks; on several
servers the rendezvous endpoint is ``$1`` or ``$RDZV_ENDPOINT``), for DeepSpeed a ``hostfile``
(the plan's servers, one slot per GPU used) and a ``README.md`` with the commands.

Plan-derived names are quoted for where they land (planner.export.quoting): the launch scripts and
READMEs show them as one printable line, and the hostfile's server names must be host names
(:func:`planner.export.nodes.check_host_names`, refused before anything is written).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from types import ModuleType

from planner import ir
from planner.errors import ExportError, PlannerError
from planner.export import ENGINES, deepspeed, torch
from planner.export.nodes import (
    DEFAULT_RDZV_PORT,
    DEFAULT_RDZV_TIMEOUT_S,
    NodeLayout,
    check_host_names,
    node_layout,
    torchrun_args,
)
from planner.export.quoting import one_line
from planner.jsonio import dumps, write_text_atomic
from planner.runnable import check_runnable

LAUNCH = '''\
#!/bin/sh
# Server {server} (node rank {rank} of {nnodes}): ranks {first}-{last} on {devices}.
# Start launch_node0.sh ... launch_node{lastnode}.sh, one per server, at about the same time.
# The rendezvous endpoint is node rank 0's address and a free port: the first argument or $RDZV_ENDPOINT.
#   sh launch_node{rank}.sh [HOST:PORT] [{what} options...]
ENDPOINT="${{RDZV_ENDPOINT:-127.0.0.1:{port}}}"
case "${{1:-}}" in -*|"") ;; *) ENDPOINT="$1"; shift ;; esac
{importable}{threads}cd "$(dirname "$0")" || exit 1
exec ${{TORCHRUN:-torchrun}} {torchrun} --rdzv-endpoint="$ENDPOINT" \\
    --rdzv-conf="timeout=${{RDZV_TIMEOUT:-{timeout}}}" {entry} "$@"
'''

STANDALONE = '''\
#!/bin/sh
# Every rank on this server ({processes}): sh launch_node0.sh [{what} options...]
{importable}{threads}cd "$(dirname "$0")" || exit 1
exec ${{TORCHRUN:-torchrun}} {torchrun} {entry} "$@"
'''

IMPORTABLE = ('# {model} is imported by its module path, from the folder this is started in (as planner profile '
              'did) or $PYTHONPATH\nexport PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}$(pwd)"\n')
"""The launch scripts' lines for a plan of a ``package.module:factory`` model: the folder the script is started
in stays importable after it changes to its own folder (torchrun puts the script's folder, not the working one,
on ``sys.path``), as ``planner profile`` found the module there."""


THREADS = ('# each process computes with the torch threads its device was measured with (planner calibrate '
           '--threads), as the plan predicts\nexport OMP_NUM_THREADS="${{OMP_NUM_THREADS:-{threads}}}"\n')
"""The launch scripts' line for a plan whose cluster says its devices' threads (:attr:`planner.ir.Node.threads`):
torch starts that many in each process unless the caller's ``OMP_NUM_THREADS`` says otherwise."""


def threads_line(plan: ir.Plan) -> str:
    """:data:`THREADS` for a plan whose devices' threads are known, else nothing."""
    threads = plan.process_threads
    return THREADS.format(threads=threads) if threads is not None else ""


def factory_model(plan: ir.Plan) -> bool:
    """Whether the plan's model is a ``package.module:factory`` of the user's (imported by its module path), not
    a zoo name."""
    return ":" in plan.model


def importable(plan: ir.Plan) -> str:
    """:data:`IMPORTABLE` for a plan of a factory model, else nothing."""
    return IMPORTABLE.format(model=one_line(plan.model)) if factory_model(plan) else ""


def launch_scripts(plan: ir.Plan, layout: NodeLayout | None, entry: str = "train.py",
                   what: str = "train.py") -> dict[str, str]:
    """``launch_node<R>.sh`` per server; one standalone script when the plan uses one server (or cannot span).
    ``entry``: what torchrun starts on every rank (the export's ``train.py``, or another trainer's command);
    ``what``: how the usage line names its options."""
    if layout is None or layout.nnodes == 1:
        processes = f"{plan.world_size} process" + ("es" if plan.world_size != 1 else "")
        return {"launch_node0.sh": STANDALONE.format(processes=processes, entry=entry, what=what,
                                                     torchrun=shlex.join(torchrun_args(plan.world_size)),
                                                     importable=importable(plan), threads=threads_line(plan))}
    out = {}
    for rank, server in enumerate(layout.servers):
        ranks = layout.ranks(rank)
        args = [a for a in torchrun_args(layout.nproc_per_node, layout.nnodes, rank, "x")
                if not a.startswith(("--rdzv-endpoint", "--rdzv-conf"))]
        out[f"launch_node{rank}.sh"] = LAUNCH.format(
            server=one_line(server), rank=rank, nnodes=layout.nnodes, first=ranks[0], last=ranks[-1],
            devices=" ".join(one_line(layout.devices[r]) for r in ranks), lastnode=layout.nnodes - 1,
            port=DEFAULT_RDZV_PORT, torchrun=shlex.join(args), timeout=DEFAULT_RDZV_TIMEOUT_S, entry=entry,
            what=what, importable=importable(plan), threads=threads_line(plan))
    return out


def hostfile(layout: NodeLayout | None, plan: ir.Plan) -> str:
    """DeepSpeed's hostfile: one line per server in node-rank order, ``slots`` = GPUs the plan uses there.

    ExportError when a server's name is not a host name (it would break the file into other lines)."""
    if layout is None:
        return f"localhost slots={plan.world_size}\n"
    check_host_names(layout.servers)
    return "".join(f"{server} slots={layout.nproc_per_node}\n" for server in layout.servers)


def plan_layout(plan: ir.Plan) -> tuple[NodeLayout | None, str]:
    """The plan's servers, or None and why torchrun cannot start it server by server."""
    try:
        return node_layout(plan), ""
    except ExportError as exc:
        return None, exc.cause


def _commands(plan: ir.Plan, engine: str, layout: NodeLayout | None, why: str) -> str:
    """The README's launch commands: one per server, and DeepSpeed's launcher."""
    world = plan.world_size
    lines = [f"torchrun --standalone --nproc-per-node {world} train.py   # every rank on one machine"]
    if layout is not None and layout.nnodes > 1:
        lines += [f"sh launch_node{r}.sh HOST:PORT   # on server {one_line(s)}" for r, s in enumerate(layout.servers)]
    else:
        lines.append("sh launch_node0.sh   # the same, started from any folder")
    if engine == "deepspeed":
        lines.append(f"deepspeed --num_gpus {world} train.py   # or DeepSpeed's own launcher")
        if layout is not None and layout.nnodes > 1:
            lines.append("deepspeed --hostfile hostfile --master_addr HOST --master_port PORT train.py")
    note = f"\nThe plan cannot be started server by server: {one_line(why)}.\n" if why else ""
    return "```\n" + "\n".join(lines) + "\n```\n" + note


def readme(plan: ir.Plan, engine: str, layout: NodeLayout | None, why: str) -> str:
    servers = ("" if layout is None or layout.nnodes == 1 else
               f"\nThe plan runs on {layout.nnodes} servers ({', '.join(map(one_line, layout.servers))}), "
               f"{layout.nproc_per_node} processes each: start `launch_node<R>.sh` on server R with node rank 0's "
               "address and a free port (the same on every server). Rename the servers in `hostfile` to your "
               "hosts' names.\n")
    return (f"# {one_line(plan.model)} on {engine}: config {plan.config}, {plan.schedule}, {plan.microbatches} "
            "micro-batches\n\n"
            f"Exported by `planner export --to {engine}`. Predicted iteration: {plan.predicted.iteration_s:.6g} s.\n"
            f"{servers}\n{_commands(plan, engine, layout, why)}{_factory_note(plan)}\nOptions: `--model MODEL` "
            "(default the profiled model), `--steps N`, `--loss cross_entropy|mse`, `--lr LR`, `--seed N`. "
            f"`planner run plan.json --model MODEL --engine {engine}` trains it and compares with the prediction.\n")


def _factory_note(plan: ir.Plan) -> str:
    """The README's note on a factory model's import path (nothing for a zoo model)."""
    if not factory_model(plan):
        return ""
    module = one_line(plan.model.partition(":")[0])
    return (f"\n`train.py` imports your model's module `{module}` on every server, as `planner profile` did: start "
            "the launch scripts from the folder that holds it (they keep the folder they are started in on "
            "`PYTHONPATH`), or set `PYTHONPATH` to that folder (`PYTHONPATH=/path/to/code torchrun ...`).\n")


def engine_module(engine: str) -> ModuleType:
    """The engine's module (``check_plan``, ``make_trainer``, ``script_text``): the one place engines are named."""
    modules: dict[str, ModuleType] = {"deepspeed": deepspeed, "torch": torch}
    if engine not in modules:
        raise ExportError(f"unknown engine {engine!r}", f"use --to {' or --to '.join(ENGINES)}")
    return modules[engine]


def program_files(plan: ir.Plan, engine: str) -> dict[str, str]:
    """The folder's files by name (nothing written)."""
    if engine == "torchtitan":  # a job config for torchtitan's own trainer (planner.export.torchtitan)
        from planner.export import torchtitan

        return torchtitan.files(plan)
    mod = engine_module(engine)
    check_runnable(plan, engine)
    files: dict[str, str] = {"plan.json": dumps(plan.to_dict()), "train.py": mod.script_text(plan)}
    layout, why = plan_layout(plan)
    if engine == "deepspeed":
        files["ds_config.json"] = json.dumps(deepspeed.ds_config(plan), indent=2) + "\n"
        files["hostfile"] = hostfile(layout, plan)
    files.update(launch_scripts(plan, layout))
    files["README.md"] = readme(plan, engine, layout, why)
    return files


def export_plan(plan: ir.Plan, engine: str, out_dir: str | Path) -> list[Path]:
    """Write the program for ``engine`` into ``out_dir``; returns the files written."""
    files = program_files(plan, engine)
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PlannerError(f"cannot create {out}: {exc.strerror}", "choose a writable -o folder") from None
    written = []
    for name, text in files.items():
        write_text_atomic(out / name, text)
        written.append(out / name)
        if name.endswith((".py", ".sh")):
            (out / name).chmod(0o755)
    return written


def server_commands(plan: ir.Plan, out_dir: str) -> list[str]:
    """What to run on each server after export (the CLI prints them)."""
    layout, _ = plan_layout(plan)
    folder = shlex.quote(out_dir)
    if layout is None or layout.nnodes == 1:
        return [f"cd {folder} && sh launch_node0.sh"]
    return [f"server {one_line(s)}: cd {folder} && sh launch_node{r}.sh HOST:PORT"
            for r, s in enumerate(layout.servers)]

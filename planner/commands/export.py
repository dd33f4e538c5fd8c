"""``planner export PLAN --to deepspeed|torch|torchtitan -o DIR``: a runnable program (or job config) for the plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from planner.cli import emit_json
from planner.commands import outputs, read_plan
from planner.errors import ExportError

KIND = "export"
VERSION = 1
"""The ``--json`` document's ``kind`` and ``version`` (docs/contracts.md, export JSON)."""


def document(engine: str, world_size: int, files: list[Path], commands: list[str],
             warnings: list[str]) -> dict[str, Any]:
    """The ``--json`` document: what was written and what to run."""
    return {"kind": KIND, "version": VERSION, "engine": engine, "world_size": world_size,
            "files": [str(f) for f in files], "commands": commands, "warnings": warnings}


EXPORT_FILES = ("train.py", "plan.json", "README.md", "ds_config.json", "hostfile", "job_config.toml",
                "launch_node*.sh")
"""What an export of any engine may write into its folder (names and patterns)."""


def check_stale(folder: Path, files: list[Path]) -> None:
    """ExportError when ``folder`` holds an earlier export's file that this one does not write (another engine's
    config, a server's launch script): left beside the new program it would launch the old plan's layout."""
    if not folder.is_dir():
        return
    written = {f.name for f in files}
    stale = sorted({p.name for pattern in EXPORT_FILES for p in folder.glob(pattern)} - written)
    if stale:
        raise ExportError(f"{folder} holds {', '.join(stale)} from an earlier export, which this export of the "
                          "plan does not write: left there, it would launch another plan's layout",
                          "export into an empty or new folder, or remove those files first")


@click.command("export")
@click.argument("plan_path", metavar="PLAN", type=click.Path(dir_okay=False))
@click.option("--to", "engine", type=click.Choice(["deepspeed", "torch", "torchtitan"]), required=True,
              help="Engine to export for.")
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Folder to write train.py, its config, launch scripts and the plan into.")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as one JSON document.")
def export(plan_path: str, engine: str, out_dir: str, as_json: bool) -> None:
    """Write a training script, its config, a launch script per server and the plan."""
    from planner.export.program import export_plan, server_commands
    from planner.export.torchtitan import launch_commands as titan_commands

    out = outputs(folders=[out_dir], inputs=[plan_path])
    plan, warnings = read_plan(plan_path)
    files = [Path(out_dir) / f.name for f in export_plan(plan, engine, out.folder(out_dir))]
    check_stale(Path(out_dir), files)
    commands = server_commands(plan, out_dir) if engine != "torchtitan" else titan_commands(plan, out_dir)
    out.ready()  # nothing printed as written before it can be
    if as_json:
        emit_json(document(engine, plan.world_size, files, commands, warnings))
    else:
        click.echo(f"wrote {', '.join(str(f) for f in files)}", err=True)
        for line in commands:
            click.echo(f"run: {line}", err=True)
    out.commit()

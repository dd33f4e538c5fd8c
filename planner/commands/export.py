"""``planner export PLAN --to deepspeed|torch|torchtitan -o DIR``: a runnable program (or job config) for the plan."""

from __future__ import annotations

import click

from planner import ir
from planner.cli import emit_json
from planner.jsonio import read_json


@click.command("export")
@click.argument("plan_path", metavar="PLAN", type=click.Path(dir_okay=False))
@click.option("--to", "engine", type=click.Choice(["deepspeed", "torch", "torchtitan"]), required=True,
              help="Engine to export for.")
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Folder to write train.py, its config and the plan into.")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as one JSON document.")
def export(plan_path: str, engine: str, out_dir: str, as_json: bool) -> None:
    """Write a training script, its config and the plan for DeepSpeed or torch pipelining."""
    from planner.export import export_plan

    plan = ir.Plan.from_dict(read_json(plan_path, "plan"), plan_path)
    files = export_plan(plan, engine, out_dir)
    if as_json:
        emit_json({"engine": engine, "world_size": plan.world_size, "files": [str(f) for f in files]})
    else:
        click.echo(f"wrote {', '.join(str(f) for f in files)}", err=True)
        target = "-m torchtitan.train --job.config_file job_config.toml" if engine == "torchtitan" else "train.py"
        click.echo(f"run: cd {out_dir} && torchrun --standalone --nproc_per_node {plan.world_size} {target}",
                   err=True)

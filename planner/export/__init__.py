"""Plan -> runnable program: DeepSpeed (``deepspeed.py``) or torch-native pipelining (``torch.py``).

:func:`export_plan` writes, into a folder, ``plan.json``, a commented ``train.py`` runnable
with ``torchrun`` (and, for DeepSpeed, with the ``deepspeed`` launcher), the engine's config
(``ds_config.json``) and a ``README.md`` with the command. Plans an engine cannot run are
refused with :class:`~planner.errors.ExportError` naming the stage and the ``--engine``
search that yields a runnable plan. torch is imported only when an engine module is.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

from planner import ir
from planner.errors import ExportError, PlannerError
from planner.jsonio import dumps, write_text_atomic

ENGINES = ("deepspeed", "torch", "torchtitan")


def export_plan(plan: ir.Plan, engine: str, out_dir: str | Path) -> list[Path]:
    """Write the program for ``engine`` into ``out_dir``; returns the files written."""
    if engine not in ENGINES:
        raise ExportError(f"unknown engine {engine!r}", f"use --to {' or --to '.join(ENGINES)}")
    mod = importlib.import_module(f"planner.export.{engine}")
    world = plan.world_size
    if engine == "torchtitan":  # a job config for torchtitan's own trainer, no script
        return _write(out_dir, {"plan.json": dumps(plan.to_dict()), "job_config.toml": mod.config_text(plan),
                                "README.md": _titan_readme(plan, world)})
    files: dict[str, str] = {"plan.json": dumps(plan.to_dict()), "train.py": mod.script_text(plan)}
    if engine == "deepspeed":
        files["ds_config.json"] = json.dumps(mod.ds_config(plan), indent=2) + "\n"
        launch = (f"torchrun --standalone --nproc_per_node {world} train.py\n"
                  f"deepspeed --num_gpus {world} train.py   # or DeepSpeed's own launcher")
    else:
        launch = f"torchrun --standalone --nproc_per_node {world} train.py"
    files["README.md"] = (
        f"# {plan.model} on {engine}: config {plan.config}, {plan.schedule}, {plan.microbatches} micro-batches\n\n"
        f"Exported by `planner export --to {engine}`. Predicted iteration: {plan.predicted.iteration_s:.6g} s.\n\n"
        f"```\n{launch}\n```\n\nOptions: `--model MODEL` (default the profiled model), `--steps N`, "
        "`--loss cross_entropy|mse`. `planner run plan.json --model MODEL --engine "
        f"{engine}` trains it and compares with the prediction.\n")
    written = _write(out_dir, files)
    (Path(out_dir) / "train.py").chmod(0o755)
    return written


def _titan_readme(plan: ir.Plan, world: int) -> str:
    return (f"# {plan.model} on torchtitan: config {plan.config}, {plan.schedule}, {plan.microbatches} micro-batches"
            f"\n\nExported by `planner export --to torchtitan` for torchtitan 0.2.0 (TOML job configs). "
            f"Predicted iteration: {plan.predicted.iteration_s:.6g} s.\n\n```\ntorchrun --nproc_per_node {world} "
            "-m torchtitan.train --job.config_file job_config.toml\n```\n\nSet `[model] hf_assets_path` (the "
            "tokenizer) and `[training] dataset` to your data first.\n")


def _write(out_dir: str | Path, files: dict[str, str]) -> list[Path]:
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PlannerError(f"cannot create {out}: {exc.strerror}", "choose a writable -o folder") from None
    written = []
    for name, text in files.items():
        write_text_atomic(out / name, text)
        written.append(out / name)
    return written

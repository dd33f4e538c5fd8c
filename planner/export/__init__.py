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

ENGINES = ("deepspeed", "torch")


def export_plan(plan: ir.Plan, engine: str, out_dir: str | Path) -> list[Path]:
    """Write the program for ``engine`` into ``out_dir``; returns the files written."""
    if engine not in ENGINES:
        raise ExportError(f"unknown engine {engine!r}", f"use --to {' or --to '.join(ENGINES)}")
    mod = importlib.import_module(f"planner.export.{engine}")
    files: dict[str, str] = {"plan.json": dumps(plan.to_dict()), "train.py": mod.script_text(plan)}
    world = plan.world_size
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
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PlannerError(f"cannot create {out}: {exc.strerror}", "choose a writable -o folder") from None
    written = []
    for name, text in files.items():
        write_text_atomic(out / name, text)
        written.append(out / name)
    (out / "train.py").chmod(0o755)
    return written

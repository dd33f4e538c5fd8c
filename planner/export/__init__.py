"""Plan -> runnable program: DeepSpeed (``deepspeed.py``) or torch-native pipelining (``torch.py``).

:func:`planner.export.program.export_plan` writes the program folder. The modules, by concept:

- ``program``: the folder (plan, ``train.py``, the engine's config, launch scripts, README);
- ``nodes``: which server runs which ranks and each server's torchrun command (pure);
- ``deepspeed``, ``torch``: the engines (check a plan, build the pipeline, the script text);
- ``layers``: the model as the profiled layers (build, split, ties, check against the profile);
- ``partition``: the plan's stages as both engines lay them out (ranges, boundaries, width);
- ``data``, ``losses``, ``optim``, ``args``: synthetic data, losses, optimizers, a script's
  command line.
- ``quoting``: plan-derived names in the generated files (docstrings, comments, TOML strings).

Nothing here imports ``planner.runner`` (which imports this package). Importing the package
imports no torch; its modules (but ``nodes`` and ``quoting``) do.
"""

from __future__ import annotations

ENGINES = ("deepspeed", "torch", "torchtitan")
SEED_MAX = 2**32 - 1
"""The largest seed a run or a generated script takes: torch's generators take 64 bits, and the synthetic data
seeds each step with ``seed * 100_003 + step`` (``data.DataSpec.batch``), which a seed of 2**47 or more overflows."""

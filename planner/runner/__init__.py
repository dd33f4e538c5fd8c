"""`planner run`: train a plan for real under torchrun, measure it, compare with the prediction.

Modules, one way: ``planner.runner`` imports ``planner.export`` (the engines, the model's
layers, data and losses), never the reverse; generated scripts import only ``planner.export``.

- :mod:`planner.runner.launch`: the parent. Checks everything it can before starting
  processes, then runs torchrun for this server's ranks (``--standalone`` on one server,
  torchrun's static rendezvous at ``--rdzv-endpoint`` on several) and builds the run JSON.
- :mod:`planner.runner.processes`: the launcher's process group (killed however it ends)
  and the workers' cause of failure read from their output.
- :mod:`planner.runner.worker`: the torchrun worker (``python -m planner.runner.worker``);
  :mod:`planner.runner.memory` its peak memory, :mod:`planner.runner.terms` its step's terms.
- :mod:`planner.runner.reference`: the unsplit model trained in one process (``--check``).
"""

from __future__ import annotations

from planner.runner.launch import DEFAULT_RDZV_TIMEOUT_S, DEFAULT_TIMEOUT_S, Launch, local_processes, run_plan
from planner.runner.reference import max_rel_diff, reference_losses

__all__ = ["DEFAULT_RDZV_TIMEOUT_S", "DEFAULT_TIMEOUT_S", "Launch", "local_processes", "max_rel_diff",
           "reference_losses", "run_plan"]

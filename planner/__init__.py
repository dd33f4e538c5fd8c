"""planner: plan pipeline, data and tensor parallel training of a PyTorch model on a GPU cluster.

The steps, as functions (:mod:`planner.api`; the CLI commands are thin shells over them)::

    profile_model("vgg16", batch_size=64, mode="analytic")      # -> ModelProfile   (needs torch)
    search_plan(profile, "pipepar-4x2-2080ti", schedule="1f1b")  # -> Plan
    judge_plan(plan)                                             # -> Judged (fits, why not, prediction)
    simulate_plan(plan)                                          # -> SimResult
    compare_strategies(profile, cluster)                         # -> Comparison
    export_plan(plan, "torch", "out/")                           # -> files written (needs torch)
    run_plan(plan, "vgg16", engine="torch")                      # -> the run JSON  (needs torch)

Profiles, clusters and plans may be given as values or as their JSON files (a cluster also
by preset name). ``import planner`` never imports torch: a light install (no ``[torch]``
extra) searches, simulates and compares. Only ``planner.profiler``, ``planner.export``'s
engines and ``planner.runner`` import torch; only ``planner.render`` imports rich and
matplotlib. ``docs/architecture.md`` maps the modules.
"""

from __future__ import annotations

__version__ = "0.1.0"

from planner.api import (
    compare_strategies,
    export_plan,
    judge_plan,
    load_plan,
    load_profile,
    profile_model,
    run_plan,
    search_plan,
    simulate_plan,
)
from planner.errors import (
    ClusterError,
    ExportError,
    FormatError,
    InfeasibleError,
    PlanError,
    PlannerError,
    ProfileError,
    RunError,
    ScheduleError,
    UsageError,
)
from planner.ir import GPU, Cluster, LayerProfile, Link, ModelProfile, Node, Plan, Prediction, Stage, Tie

__all__ = [
    "GPU",
    "Cluster",
    "ClusterError",
    "ExportError",
    "FormatError",
    "InfeasibleError",
    "LayerProfile",
    "Link",
    "ModelProfile",
    "Node",
    "Plan",
    "PlanError",
    "PlannerError",
    "Prediction",
    "ProfileError",
    "RunError",
    "ScheduleError",
    "Stage",
    "Tie",
    "UsageError",
    "__version__",
    "compare_strategies",
    "export_plan",
    "judge_plan",
    "load_plan",
    "load_profile",
    "profile_model",
    "run_plan",
    "search_plan",
    "simulate_plan",
]

"""planner: plan pipeline, data and tensor parallel training of a PyTorch model on a GPU cluster.

The library is usable without the CLI: load a profile and a cluster, search a plan,
simulate it, export it. Only ``planner.profiler``, ``planner.export`` and
``planner.runner`` import torch; only ``planner.render`` imports rich and matplotlib.
"""

from __future__ import annotations

__version__ = "0.1.0"

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
]

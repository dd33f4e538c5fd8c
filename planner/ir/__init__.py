"""The values that move between planner's steps, and their versioned JSON forms.

profile.json -> ModelProfile, cluster.json -> Cluster, plan.json -> Plan. Every value is a
frozen dataclass; ``to_dict`` writes the contract form (docs/ and ``../shared/DESIGN.md`` sections 4 and 6)
(with ``kind`` and ``version``), ``from_dict`` reads it back and names the field and value
of anything malformed. Contract fields are required; the others are optional and default,
so a hand-written profile with only the contract fields loads.
"""
from planner.ir.cluster import GPU, LINK_LEVELS, MAX_HEADROOM, NUMBER_FORMATS, Cluster, Link, Node
from planner.ir.costs import StageCost
from planner.ir.layer import LayerProfile
from planner.ir.overheads import EngineOverhead
from planner.ir.parts import UNSHARDABLE, BatchTimes, BlockShape, Tie
from planner.ir.plan import (
    ALL_FORMS,
    FORMS,
    OPTIMIZERS,
    PLAN_VERSION,
    PRECISIONS,
    RECOMPUTE,
    TENSOR_FORMS,
    ZERO_STAGES,
    Plan,
    Prediction,
    Stage,
    config_string,
)
from planner.ir.profile import DTYPE_BYTES, PROFILE_MODES, ModelProfile, dtype_key

__all__ = ["ALL_FORMS", "DTYPE_BYTES", "FORMS", "GPU", "LINK_LEVELS", "MAX_HEADROOM", "NUMBER_FORMATS", "OPTIMIZERS",
           "PLAN_VERSION", "PRECISIONS", "PROFILE_MODES", "RECOMPUTE", "TENSOR_FORMS", "UNSHARDABLE", "ZERO_STAGES",
           "BatchTimes", "BlockShape",
           "Cluster", "EngineOverhead", "LayerProfile", "Link", "ModelProfile", "Node", "Plan", "Prediction",
           "Stage", "StageCost", "Tie", "config_string", "dtype_key"]

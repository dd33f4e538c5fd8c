"""The cost model: compute, communication and memory of layers, stages and plans.

Pure (numpy only). Every quantity is per device; times are seconds, sizes bytes. One home
per concept, each citing its sources:

- :mod:`~planner.costmodel.collectives`: alpha-beta point-to-point, ring and hierarchical
  all-reduce and all-gather;
- :mod:`~planner.costmodel.precision`: bytes per parameter and activation, and the peak
  FLOP/s, by precision (fp32, or bf16/fp16 mixed precision) and optimizer;
- :mod:`~planner.costmodel.layers`: per-layer, per-form costs on a stage's ``tp x dp``
  grid (dp, split_in, split_out, Megatron's tp block), the table HPP and the stage DP read;
- :mod:`~planner.costmodel.variant`: recomputation (none, selective, full) and ZeRO 0-3 of
  a stage, one formula for the DP's tables and the scalar cost;
- :mod:`~planner.costmodel.stage`: one stage's :class:`~planner.ir.StageCost` (loss,
  gradient accumulation, optimizer step, transfers, tied weights);
- :mod:`~planner.costmodel.engine`: what a named engine adds (per action, per micro-batch
  sent, per step; measured by ``planner calibrate``), charged on a plan's stage costs;
- :mod:`~planner.costmodel.iteration`: memory in flight, the analytic iteration time and
  prediction, pure data parallel as the yardstick.
"""

from __future__ import annotations

from planner.cluster import memory_bandwidth_Bps
from planner.costmodel.collectives import (
    allreduce_coefficients,
    allreduce_s,
    p2p_s,
    ring_allgather_s,
    ring_allreduce_s,
)
from planner.costmodel.engine import (
    EngineOverhead,
    charge,
    charge_plan,
    engine_overhead,
    plan_overhead,
    stage_overhead_s,
    step_overhead_s,
    zero_comms,
)
from planner.costmodel.iteration import (
    analytic_iteration,
    dp_iteration,
    dp_plan,
    dp_stage,
    in_flight,
    plan_memory,
    predict,
    schedule_weights,
    stage_peak_memory,
    stage_period,
    stage_terms,
)
from planner.costmodel.layers import (
    DP,
    FORM_INDEX,
    KEYS,
    LOSS_BYTES_PER_LOGIT,
    MAX_KEYS,
    NF,
    SHARDED,
    SPLIT_IN,
    SPLIT_OUT,
    TP,
    ZERO_BUBBLE_W_SHARE,
    Grid,
    LayerTable,
    layer_table,
)
from planner.costmodel.precision import (
    OPTIMIZER_BYTES_PER_PARAM,
    OPTIMIZER_TRAFFIC,
    Bytes,
    default_precision,
    dtype_bytes,
)
from planner.costmodel.stage import (
    cached_layer_table,
    grad_accumulation_s,
    loss_s,
    optimizer_step_s,
    stage_cost_values,
    stage_costs,
    stage_costs_for,
    stage_grid,
    summarise,
    with_ties,
)
from planner.costmodel.variant import PAPER, Variant, VariantCost, ZeroComms, variant_cost, variants

__all__ = [
    "DP",
    "FORM_INDEX",
    "KEYS",
    "LOSS_BYTES_PER_LOGIT",
    "MAX_KEYS",
    "NF",
    "OPTIMIZER_BYTES_PER_PARAM",
    "OPTIMIZER_TRAFFIC",
    "PAPER",
    "SHARDED",
    "SPLIT_IN",
    "SPLIT_OUT",
    "TP",
    "ZERO_BUBBLE_W_SHARE",
    "Bytes",
    "EngineOverhead",
    "Grid",
    "LayerTable",
    "Variant",
    "VariantCost",
    "ZeroComms",
    "allreduce_coefficients",
    "allreduce_s",
    "analytic_iteration",
    "cached_layer_table",
    "charge",
    "charge_plan",
    "default_precision",
    "dp_iteration",
    "dp_plan",
    "dp_stage",
    "dtype_bytes",
    "engine_overhead",
    "grad_accumulation_s",
    "in_flight",
    "layer_table",
    "loss_s",
    "memory_bandwidth_Bps",
    "optimizer_step_s",
    "p2p_s",
    "plan_memory",
    "plan_overhead",
    "predict",
    "ring_allgather_s",
    "ring_allreduce_s",
    "schedule_weights",
    "stage_cost_values",
    "stage_costs",
    "stage_costs_for",
    "stage_grid",
    "stage_overhead_s",
    "stage_peak_memory",
    "stage_period",
    "stage_terms",
    "step_overhead_s",
    "summarise",
    "variant_cost",
    "variants",
    "with_ties",
    "zero_comms",
]

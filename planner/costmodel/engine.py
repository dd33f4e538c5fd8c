"""What a training engine adds to the cost model's times: its overheads, charged per action, micro-batch and step.

Pure. The cost model's stage times are the layers' own compute and the links' transfers; a
real engine adds its own work around them: DeepSpeed's and torch pipelining's Python
scheduling of every forward and backward action, their point-to-point set-up for every
micro-batch sent over a stage boundary, and their optimizer wrapper and loss bookkeeping
once a step. ``planner calibrate`` measures them on the machine, per engine, by least
squares over tiny pipelines (:mod:`planner.calibrate`), and the cluster file carries them
(:class:`planner.ir.EngineOverhead`, ``engine_overheads``). When a plan names its engine
and its cluster knows that engine's overheads, every stage cost of the plan is charged
(:func:`charge`, called by :func:`planner.costmodel.stage_costs`), so the analytic
iteration, the simulator, the judge and the explanation all see them:

* each F, B (and W, when the schedule splits the weight gradient) action of every stage
  (chunk) takes ``per_action_s`` longer;
* each micro-batch a stage sends over a pipeline boundary takes ``per_microbatch_s`` on the
  sending stage: its F when a later stage follows (activations), its B when an earlier one
  precedes (gradients);
* each step takes ``per_step_s`` on every device group, after its optimizer step (added to
  the optimizer step of the group's first chunk);
* each all-gather or reduce-scatter of one ZeRO-2/3 unit takes ``per_shard_s`` beyond its bytes:
  charged with ZeRO's collectives, by the stage's variant (:func:`zero_comms`,
  :mod:`planner.costmodel.variant`), in its all-reduce and, for ZeRO-3's gathers, its actions;
* each collective of a tensor group takes ``per_collective_s`` beyond its bytes (the stage's grid,
  :mod:`planner.costmodel.layers`).

A plan without an engine (``any``) or whose cluster has no overheads for its engine is
charged nothing for the engine: its costs are the same values as before. On a cluster of CPU processes that
``planner calibrate`` measured without that engine, :func:`unmeasured_note` says so (on this 2-core VM the
engines' overheads made up 20-60% of a small model's step, and a tensor group ran 2.3x its prediction without
them).

Whatever the engine, processes that share a node's cores pay for handing a micro-batch on
(:attr:`planner.ir.Node.handoff_s`, measured by ``planner calibrate``: a process blocked for its
input and woken on busy, time-sliced cores costs CPU seconds that the engine's overheads, fitted
on a tiny model whose cores stay mostly idle, do not hold). It is charged with each micro-batch
sent, like ``per_microbatch_s`` (:func:`engine_overhead`), at the largest of the cluster's nodes
(exact for the one node ``planner calibrate`` writes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from planner import ir
from planner.cluster import index, memory_bandwidth_Bps
from planner.costmodel.variant import PAPER, ZeroComms
from planner.engines import CALIBRATED
from planner.grad_buffers import GRAD_COPY_PASSES, GradCopy, deepspeed_bucket_params
from planner.ir import EngineOverhead
from planner.runnable import ENGINES
from planner.schedule import schedule_kind

__all__ = ["EngineOverhead", "charge", "charge_plan", "engine_overhead", "plan_overhead", "stage_overhead_s",
           "step_overhead_s", "unmeasured_note", "zero_comms"]

NONE = EngineOverhead()
"""No overhead: what a plan without an engine, or a cluster without measured overheads, pays."""


def engine_overhead(cluster: ir.Cluster, engine: str) -> EngineOverhead:
    """What ``engine`` adds on ``cluster`` (:data:`NONE` for ``any`` or an engine the cluster has no
    figures for), with the nodes' hand-off cost added to each micro-batch sent (module doc)."""
    own = cluster.engine_overhead(engine) or NONE
    handoff_s = max((node.handoff_work_s for node in cluster.nodes), default=0.0)
    return replace(own, per_microbatch_s=own.per_microbatch_s + handoff_s) if handoff_s else own


def zero_comms(cluster: ir.Cluster, engine: str, precision: str = "fp32", pipelined: bool = True,
               param_count: int = 0) -> ZeroComms:
    """How ``engine`` runs ZeRO's collectives on ``cluster`` (:class:`planner.costmodel.variant.ZeroComms`):
    its ZeRO-1 traffic, ZeRO-2/3 reduction (for a plan of two or more stages where ``pipelined``) and
    gradient copies from :data:`planner.engines.ENGINES` (the copies' bytes at ``precision``), each
    FSDP unit's collective cost from the cluster's measured ``per_shard_s``, ZeRO-1's buffers for a model
    of ``param_count`` parameters; the paper's for ``any``; whether they run beside the compute
    (:func:`overlaps_collectives`); an all-gather's cost over half an all-reduce's from
    the intra-node links' bus bandwidths (ZeRO's groups inside a server, as a calibrated CPU cluster's are)."""
    intra = cluster.link("intra_node")
    scale = intra.allreduce_Bps / intra.allgather_Bps
    prefetch = overlaps_collectives(cluster)
    limits = ENGINES.get(engine)
    if limits is None:
        return replace(PAPER, shard_scale=scale, prefetch=prefetch)
    own = cluster.engine_overhead(engine)
    copy = limits.grad_copy
    grad_elem = 2 if precision == "fp16" else 4  # fp32 gradients reduced, but under fp16 (GradCopy)
    weight_elem = 4 if precision == "fp32" else 2
    cap = copy.cap_bytes or copy.cap_params * grad_elem
    buffers = limits.zero1_buffers * 4.0 * deepspeed_bucket_params(param_count) if limits.zero1_buffers else 0.0
    copies = limits.zero1_partition_copies  # an fp32 master partition (beyond the paper's only for fp32 weights)
    master = 1.0 if copies and precision == "fp32" else 0.0  # and an fp32 gradient partition in the step
    return ZeroComms(limits.zero1_gather_share, limits.syncs_last_backward(pipelined), own.per_shard_s if own else 0.0,
                     copy.zero, cap, grad_elem / weight_elem, limits.zero1_per_unit, buffers, copy.held,
                     master, 4.0 / weight_elem if copies else 0.0, prefetch, scale,
                     limits.compute_copy_zero if precision != "fp32" else (), limits.wide_reduce_zero,
                     copy_alone=copy.alone, accumulates=True,  # every engine here trains with PyTorch's autograd
                     gathered_loss=limits.gathers_logits, copy_s_per_byte=_copy_s_per_byte(cluster, copy))


def _copy_s_per_byte(cluster: ir.Cluster, copy: GradCopy) -> float:
    """Seconds per gradient byte of ``copy``'s passes (planner.grad_buffers.GRAD_COPY_PASSES, each a read and a
    write) at the slowest memory bandwidth among the cluster's devices; 0 where the engine copies nothing, where its
    buckets live with the model (DDP's, ``held``: filled by its backward hooks beside the backward, not charged) or
    where a device gives no bandwidth."""
    rate = memory_bandwidth_Bps(cluster, index(cluster).names)
    return 0.0 if not copy.zero or copy.held or rate is None else 2.0 * GRAD_COPY_PASSES / rate


def unmeasured_note(cluster: ir.Cluster, engine: str) -> str | None:
    """Why a plan for ``engine`` on ``cluster`` is predicted without what the engine adds, where that matters and
    can be measured: a cluster of CPU processes (``planner calibrate``'s) that carries no overheads for it; None
    elsewhere (no engine named, overheads measured, or GPUs, where they are small beside the layers)."""
    if engine not in CALIBRATED or cluster.engine_overhead(engine) is not None:
        return None
    if not any(node.shares_cores for node in cluster.nodes):
        return None
    return (f"cluster {cluster.name!r} carries no measured overheads for {engine}, so the prediction leaves out what "
            f"{engine} adds per action, micro-batch sent, step and collective (on a 2-core machine a tensor group "
            f"of 2 ran 2.3x its prediction without them): measure them with planner calibrate --engines {engine}")


def overlaps_collectives(cluster: ir.Cluster) -> bool:
    """Whether ZeRO's collectives run beside the compute on ``cluster`` (planner.costmodel.variant): on devices
    with processors of their own (GPUs: NCCL runs on its own stream), not on CPU processes that share a
    node's cores (``ir.Node.shares_cores``, set by ``planner calibrate``), where a collective takes a core from
    the compute (gloo's threads) and every FSDP unit's gather or reduction costs its Python time in turn."""
    return not any(node.shares_cores for node in cluster.nodes)


def plan_overhead(plan: ir.Plan) -> EngineOverhead:
    """What the plan's own engine adds on its cluster."""
    return engine_overhead(plan.cluster, plan.engine)


def stage_overhead_s(overhead: EngineOverhead, stage: int, stages: int, split_backward: bool = False) -> float:
    """Seconds the engine adds to one micro-batch (F + B, and W) of chunk ``stage`` of ``stages``
    (the stage DP adds this to its per-micro-batch stage time)."""
    actions = 3 if split_backward else 2
    sends = (stage < stages - 1) + (stage > 0)
    return actions * overhead.per_action_s + sends * overhead.per_microbatch_s


def step_overhead_s(overhead: EngineOverhead) -> float:
    """Seconds the engine adds to each step of every device group (after its optimizer step)."""
    return overhead.per_step_s


def charge(costs: Sequence[ir.StageCost], overhead: EngineOverhead, split_backward: bool = False,
           virtual_stages: int = 1) -> tuple[ir.StageCost, ...]:
    """``costs`` (K * ``virtual_stages`` chunks in model order) with the engine's overhead added
    (module doc); the same values when ``overhead`` is zero."""
    if overhead.is_zero:
        return tuple(costs)
    n = len(costs)
    lanes = n // max(virtual_stages, 1)
    a, m = overhead.per_action_s, overhead.per_microbatch_s
    out = []
    for c, cost in enumerate(costs):
        fwd = a + (m if c < n - 1 else 0.0)
        bwd = a + (m if c > 0 else 0.0)
        weight = a if split_backward else 0.0
        out.append(replace(cost, forward_s=cost.forward_s + fwd, backward_s=cost.backward_s + bwd + weight,
                           backward_weight_s=cost.backward_weight_s + weight,
                           optimizer_step_s=cost.optimizer_step_s + (overhead.per_step_s if c < lanes else 0.0)))
    return tuple(out)


def charge_plan(plan: ir.Plan, costs: Sequence[ir.StageCost]) -> tuple[ir.StageCost, ...]:
    """The plan's stage ``costs`` charged with its engine's overhead on its cluster (module doc)."""
    split = schedule_kind(plan.schedule).splits_weight_grad
    return charge(costs, plan_overhead(plan), split, plan.virtual_stages)

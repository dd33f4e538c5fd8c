"""What one stage of a plan costs per micro-batch: the cost model's answer to the simulator.

Pure (numpy). A stage's layers are summed under their forms (planner.costmodel.layers), its
recomputation and ZeRO stage applied by the same formula the stage DP uses
(planner.costmodel.variant), and the terms a real step pays beyond the layers added:

- Loss: the profile's ``loss_s`` (cross-entropy forward+backward on the last layer's output)
  is charged to the last stage's backward per micro-batch, fixed part whole; its memory, 12 bytes
  per logit of a micro-batch, is the last stage's workspace where larger than recomputation's
  (planner.costmodel.layers.loss_workspace).
- Gradient accumulation (:func:`grad_accumulation_s`): with M > 1 micro-batches, every
  micro-batch after the first adds its weight gradient into the stored one in place
  (PyTorch's AccumulateGrad), 3 x the gradient's bytes of memory traffic / the device's
  ``memory_bandwidth_Bps`` (0 when unknown), added to backward (its weight part).
- Optimizer step (:func:`optimizer_step_s`): once per iteration after the gradient
  synchronisation, a memory-bound element-wise update (ZeRO-Offload, Ren et al. ATC'21,
  section 4.1, sizes the CPU Adam step by memory traffic): the bytes it reads and writes /
  the slowest device's ``memory_bandwidth_Bps``; 0 when a device's bandwidth is unknown.
  With ZeRO, each rank updates its shard only.
- The engine's ZeRO-1 (``engine``): torch's all-reduces the gradients and then broadcasts every
  parameter from the rank that stepped it, half an all-reduce more than the paper's ZeRO-1
  (:mod:`planner.costmodel.variant`, :data:`planner.engines.ENGINES`).
- Point-to-point between stages: the activation of the stage's last layer per micro-batch
  crosses ``link_between`` forward and its gradient (same size) backward, ``alpha + S/B``.
  Each data-parallel replica of the next stage receives its own share of the micro-batch on
  its own devices' links, in parallel with the others (``S`` = the micro-batch's bytes / the
  next stage's dp; one replica's share when both stages have the same dp): the link's
  bandwidth is per GPU, as in the all-reduce (planner.costmodel.collectives).
- Tied weights (GPT-2 ``wte``/``lm_head``; Megatron-LM's embedding all-reduce, Shoeybi et al.
  2019, section 3; DeepSpeed's ``TiedLayerSpec``): every stage holding a tied layer keeps
  its own copy with its gradient and optimizer state, laid out as that stage runs its tied layer
  (a split form shards it over the tensor group, as Megatron-LM's vocab-parallel embedding and
  output layer; its ZeRO stage shards it over the data-parallel group) and charged as the layer
  the tie is counted in would be there (:func:`tie_copy_on`); the copies' gradients are summed
  once per iteration between the stages that hold them, each device's shard in a ring of its own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from planner import ir
from planner.cluster import Group, group_of, link_between, memory_bandwidth_Bps
from planner.costmodel.collectives import ring_allreduce_s
from planner.costmodel.engine import charge_plan, zero_comms
from planner.costmodel.layers import DP, FORM_INDEX, KEYS, MAX_KEYS, Grid, LayerTable, layer_table
from planner.costmodel.precision import Bytes, fixed_scale, flop_scale, slowest_peak
from planner.costmodel.variant import Variant, variant_cost
from planner.costmodel.whole_tensors import heaviest_ratio
from planner.engines import ENGINES
from planner.errors import PlanError


def summarise(table: LayerTable, first: int, end: int, forms: Sequence[int]) -> dict[str, float]:
    """Sum a stage's per-layer aggregates (planner.costmodel.layers.KEYS; ``MAX_KEYS`` their maximum) for
    ``forms`` (indices), re-layouts included, plus ``in_bytes`` (the stage input per micro-batch and device).

    The stage's input and output are batch-sharded (``dp`` layout): entering a sharded form
    from it costs an all-gather in forward, leaving one to it costs one in backward.
    """
    total = np.zeros(len(KEYS))
    prev = FORM_INDEX["dp"]
    for k, layer in enumerate(range(first, end)):
        f = forms[k]
        if not table.allowed[layer, f]:
            raise PlanError(f"form {ir.ALL_FORMS[f]!r} is not open to layer {layer} on a tensor group of {table.n}",
                            "layers without weight shapes (and all layers on one device) run 'dp' only; 'tp' is "
                            "for transformer blocks whose heads the tensor degree divides")
        if table.layout_change(prev, f):
            total[0] += table.enter[layer]
            if f != FORM_INDEX["dp"]:
                total[1] += table.enter[layer]
        row = table.rows(layer)[:, f]
        most = np.maximum(total[MAX_KEYS], row[MAX_KEYS])
        total += row
        total[MAX_KEYS] = most
        prev = f
    if prev != FORM_INDEX["dp"]:
        total[0] += table.leave[end - 1]
    out = {key: float(v) for key, v in zip(KEYS, total, strict=True)}
    out["in_bytes"] = float(table.in_bytes[first]) / table.n
    return out


def optimizer_step_s(weight_bytes: float, state_bytes: float, nbytes: Bytes, bandwidth_Bps: float | None) -> float:
    """One optimizer step over a device's ``weight_bytes`` of parameters with ``state_bytes`` of fp32 state."""
    if bandwidth_Bps is None or weight_bytes <= 0:
        return 0.0
    return (nbytes.traffic_own * weight_bytes + nbytes.traffic_state * state_bytes) / bandwidth_Bps


def loss_s(profile: ir.ModelProfile, group: Group, microbatches: int, dp: int = 1) -> float:
    """The training loss's forward+backward per micro-batch on each device of the last stage.

    ``fixed + (b/B)(t - fixed)/n`` of the profile's ``loss_s`` (fixed part as for layers),
    scaled like compute; charged at the start of the last stage's backward. 0 when unknown.
    """
    if profile.loss_s is None:
        return 0.0
    fixed = profile.loss_fixed_s or 0.0
    scaled = (profile.loss_s - fixed) / (microbatches * dp) / max(group.n // dp, 1)
    peak = slowest_peak(profile, group.peaks)
    return fixed * fixed_scale(profile, peak) + scaled * flop_scale(profile, peak)


def grad_accumulation_s(weight_bytes: float, microbatches: int, bandwidth_Bps: float | None) -> float:
    """Adding each micro-batch's weight gradient into ``.grad``, per micro-batch on average:
    ``(M-1)/M * 3 * weight_bytes / bandwidth`` (read both, write one); 0 when unknown."""
    if bandwidth_Bps is None or weight_bytes <= 0 or microbatches <= 1:
        return 0.0
    return (microbatches - 1) / microbatches * 3 * weight_bytes / bandwidth_Bps


_TABLES: dict[tuple[int, Grid, int, str], tuple[ir.ModelProfile, LayerTable]] = {}
_TABLES_MAX = 256


def cached_layer_table(profile: ir.ModelProfile, grid: Grid, microbatches: int, optimizer: str) -> LayerTable:
    """:func:`layer_table` with all forms open, memoised per (profile object, grid, M, optimizer).

    Judging many candidate plans asks for the same few grids again and again; the profile
    object is kept with its table, so an id is never confused with a later object's.
    """
    key = (id(profile), grid, microbatches, optimizer)
    hit = _TABLES.get(key)
    if hit is not None and hit[0] is profile:
        return hit[1]
    table = layer_table(profile, grid, microbatches, optimizer)
    if len(_TABLES) >= _TABLES_MAX:
        _TABLES.pop(next(iter(_TABLES)))
    _TABLES[key] = (profile, table)
    return table


def stage_grid(cluster: ir.Cluster, stage: ir.Stage, precision: str, engine: str = "any") -> Grid:
    """The cost model's view of a stage's devices: its group in the plan's number format, tp, sp, and what
    ``engine`` adds to each of its tensor group's collectives on ``cluster``."""
    overhead = cluster.engine_overhead(engine)
    return Grid(group_of(cluster, stage.devices, precision), stage.tp, precision, stage.sequence_parallel,
                overhead.per_collective_s if overhead else 0.0)


def stage_cost_values(profile: ir.ModelProfile, cluster: ir.Cluster, stage: ir.Stage, microbatches: int,
                      optimizer: str, next_devices: Sequence[str] | None, precision: str = "fp32",
                      next_dp: int | None = None, engine: str = "any", pipelined: bool = True) -> ir.StageCost:
    """The :class:`ir.StageCost` of one stage given the next stage's devices (None: last) and its
    data-parallel degree (None: this stage's), run by ``engine`` (how it runs ZeRO's collectives,
    in a plan of two or more stages where ``pipelined``: :func:`planner.costmodel.engine.zero_comms`)."""
    grid = stage_grid(cluster, stage, precision, engine)
    table = cached_layer_table(profile, grid, microbatches, optimizer)
    first, end = stage.layers
    if end > len(profile.layers) or len(stage.forms) != end - first:
        raise PlanError(f"stage layers {list(stage.layers)} do not fit the profile's {len(profile.layers)} layers",
                        "check the plan's stages")
    agg = summarise(table, first, end, [FORM_INDEX[f] for f in stage.forms])
    v = variant_cost(agg, agg["in_bytes"], Variant(stage.recompute, stage.zero), microbatches, table.sync_const,
                     zero_comms(cluster, engine, precision, pipelined, profile.param_count), table.blockwise)
    return _stage_cost(profile, cluster, stage, grid, agg, v, microbatches, optimizer, next_devices, table,
                       next_dp or grid.dp)


def _stage_cost(profile: ir.ModelProfile, cluster: ir.Cluster, stage: ir.Stage, grid: Grid, agg: dict[str, float],
                v: Any, microbatches: int, optimizer: str, next_devices: Sequence[str] | None,
                table: LayerTable, next_dp: int) -> ir.StageCost:
    nbytes = Bytes.of(profile, precision=grid.precision, optimizer=optimizer)
    fwd, time = float(v.fwd), float(v.time)
    backward = time - fwd
    if stage.layers[1] == len(profile.layers):
        backward += loss_s(profile, grid.group, microbatches, grid.dp)
    bandwidth = memory_bandwidth_Bps(cluster, stage.devices)
    accumulate = grad_accumulation_s(agg["grad"], microbatches, bandwidth)
    backward += accumulate
    grad_part, state = step_shares(agg, stage.zero)
    if next_devices is None:
        send_bytes, send_link, link_id = 0.0, None, None
    else:
        # the micro-batch's bytes, over the next stage's replicas (each receives its share on its own links)
        send_bytes = float(table.out_bytes[stage.layers[1] - 1]) * grid.dp / next_dp
        send_link, link_id = link_between(cluster, stage.devices, next_devices)
    return ir.StageCost(
        devices=tuple(stage.devices), forward_s=fwd, backward_s=backward,
        backward_weight_s=min(_weight_part(table, stage) + accumulate, backward),
        send_bytes=send_bytes, send_link=send_link, send_link_id=link_id, allreduce_s=float(v.sync),
        allreduce_bytes=agg["grad"] if agg["sync"] > 0 else 0.0, static_bytes=math.ceil(float(v.static)),
        weight_bytes=math.ceil(agg["weight"]), activation_bytes=math.ceil(float(v.act)),
        workspace_bytes=math.ceil(float(v.workspace)), capacity_bytes=grid.group.memory_bytes,
        optimizer_step_s=optimizer_step_s(grad_part, state, nbytes, bandwidth),
        grad_copy_bytes=math.ceil(float(v.transient)), zero_gather_s=float(v.gather))


def step_shares(agg: Mapping[str, float], zero: int) -> tuple[float, float]:
    """Per device, the gradients' and the optimizer state's bytes one optimizer step updates: the stage's
    whole, or under ZeRO each rank's partition, sharded over the group each layer's gradients are
    synchronised over as its static memory is (``static1``, ``static2``: all ``tp x dp`` devices for a layer in
    the ``dp`` form, the ``dp`` replicas for a sharded one; planner.costmodel.layers)."""
    if not zero:
        return agg["grad"], max(agg["static0"] - agg["weight"] - agg["grad"], 0.0)
    grad = agg["grad"] - (agg["static1"] - agg["static2"])
    return max(grad, 0.0), max(agg["static1"] - agg["weight"] - agg["grad"], 0.0)


def _weight_part(table: LayerTable, stage: ir.Stage) -> float:
    first = stage.layers[0]
    return float(sum(table.bww[first + k, FORM_INDEX[f]] for k, f in enumerate(stage.forms)))


def stage_costs_for(profile: ir.ModelProfile, cluster: ir.Cluster, stages: Sequence[ir.Stage], microbatches: int,
                    optimizer: str, precision: str = "fp32", engine: str = "any") -> tuple[ir.StageCost, ...]:
    """One StageCost per entry of ``stages``, in order (for interleaved, the K*v chunks in model
    order; chunk c sends to chunk c+1), tied weights' copies and all-reduce included; ZeRO's
    collectives as ``engine`` runs them (not its other measured overheads: :func:`stage_costs`)."""
    out = []
    pipelined = len({tuple(st.devices) for st in stages}) > 1
    for s, stage in enumerate(stages):
        nxt = stages[s + 1] if s + 1 < len(stages) else None
        out.append(stage_cost_values(profile, cluster, stage, microbatches, optimizer,
                                     None if nxt is None else nxt.devices, precision, None if nxt is None else nxt.dp,
                                     engine, pipelined))
    tables = [cached_layer_table(profile, stage_grid(cluster, st, precision, engine), microbatches, optimizer)
              for st in stages]
    tied = with_ties(profile, cluster, stages, out, tables)
    accumulated = with_tie_accumulation(profile, stages, tied, tables, microbatches,
                                        zero_comms(cluster, engine).accumulates)
    return with_whole_tensor_shares(profile, stages, accumulated, tables, engine)


def with_whole_tensor_shares(profile: ir.ModelProfile, stages: Sequence[ir.Stage], costs: Sequence[ir.StageCost],
                             tables: Sequence[LayerTable], engine: str) -> tuple[ir.StageCost, ...]:
    """Where ``engine``'s ZeRO-1 gives ranks whole tensors (``EngineLimits.zero1_whole_tensors``), each ZeRO-1
    stage holds and steps the optimizer state of the rank that gets the most (planner.costmodel.whole_tensors)."""
    limits = ENGINES.get(engine)
    if limits is None or not limits.zero1_whole_tensors:
        return tuple(costs)
    out = list(costs)
    for s, stage in enumerate(stages):
        ratio = heaviest_ratio(profile, stage)
        if ratio > 1.0:
            agg = summarise(tables[s], stage.layers[0], stage.layers[1], [FORM_INDEX[f] for f in stage.forms])
            _, state = step_shares(agg, 1)
            out[s] = replace(out[s], static_bytes=out[s].static_bytes + math.ceil((ratio - 1.0) * state),
                             optimizer_step_s=out[s].optimizer_step_s * ratio)
    return tuple(out)


def with_tie_accumulation(profile: ir.ModelProfile, stages: Sequence[ir.Stage], costs: Sequence[ir.StageCost],
                          tables: Sequence[LayerTable], microbatches: int, accumulates: bool
                          ) -> tuple[ir.StageCost, ...]:
    """A stage that runs two layers of a tie gets the tied weight's gradient twice a micro-batch, and autograd
    adds the second into the first while both are held: measured on CPU, the backward of a 4096 x 256 embedding
    tied to its head (4 MiB) peaked 7.9 MiB above the same model untied, twice the tie's gradient, and a
    data-parallel plan of it held 1.32x its prediction. Where the engine ``accumulates`` and the plan has one
    micro-batch, twice the tie's gradient is workspace here (from two micro-batches on, accumulating counts the
    largest layer's new gradient: ``ZeroComms.accumulates``, planner.costmodel.variant; docs/fidelity.md)."""
    if microbatches > 1 or not accumulates:
        return tuple(costs)
    out = list(costs)
    for tie in profile.ties:
        for s, stage in enumerate(stages):
            if sum(stage.layers[0] <= layer < stage.layers[1] for layer in tie.layers) < 2:
                continue
            grad = 2 * math.ceil(tie_grad_bytes(profile, tie, tables[s], tie_form(stage, tie)))
            out[s] = replace(out[s], workspace_bytes=out[s].workspace_bytes + grad)
    return tuple(out)


def tie_shares(profile: ir.ModelProfile, tie: ir.Tie) -> tuple[float, float]:
    """The tie's share of the layer it is counted in (its first): (of its bytes, of its parameters), each at most
    1 (the profile refuses a larger tie: planner.ir.profile._check_ties)."""
    owner = profile.layers[tie.layers[0]]
    return (tie.param_bytes / owner.param_bytes if owner.param_bytes else 0.0,
            tie.param_count / owner.param_count if owner.param_count else 0.0)


def tie_copy_on(profile: ir.ModelProfile, tie: ir.Tie, table: LayerTable, form: int, zero: int) -> float:
    """A tie's copy on each device of a stage with ``table`` that runs its tied layer in ``form`` at ZeRO ``zero``.

    Charged as the stage would charge the layer the tie is counted in (``LayerTable.static``: the form's tensor
    sharding, ZeRO's over the group its gradients are synchronised over), the tie's share of it: of the
    weights and gradients by bytes, of the optimizer state (the part ZeRO-1 shards) by parameters.
    """
    owner = tie.layers[0]
    by_bytes, by_count = tie_shares(profile, tie)
    state = max(float(table.static[min(zero, 1), owner, form] - table.weight[owner, form] - table.grad[owner, form]),
                0.0)
    return by_bytes * max(float(table.static[zero, owner, form]) - state, 0.0) + by_count * state


def tie_grad_bytes(profile: ir.ModelProfile, tie: ir.Tie, table: LayerTable, form: int) -> float:
    """The tie's gradient on each device of a stage with ``table`` that runs its tied layer in ``form``: the share
    of the owner layer's (``LayerTable.grad``), whole under ``dp``, a 1/tp shard under the tensor forms."""
    return tie_shares(profile, tie)[0] * float(table.grad[tie.layers[0], form])


def tie_form(stage: ir.Stage, tie: ir.Tie) -> int:
    """The form (index) of the stage's copy of ``tie``: that of the tied layers it holds, ``dp`` (whole on each
    device) if any of them runs ``dp``."""
    first, end = stage.layers
    forms = [FORM_INDEX[stage.forms[layer - first]] for layer in tie.layers if first <= layer < end]
    return DP if DP in forms else forms[0]


def with_ties(profile: ir.ModelProfile, cluster: ir.Cluster, stages: Sequence[ir.Stage],
              costs: Sequence[ir.StageCost], tables: Sequence[LayerTable]) -> tuple[ir.StageCost, ...]:
    """Each tie's extra copies and gradient all-reduce between the stages that hold its layers
    (``tables``: each stage's :func:`cached_layer_table`).

    The tie's parameters are counted in its first layer; a stage holding another of its
    layers (and not the first) keeps a copy laid out as it runs that layer (:func:`tie_copy_on`).
    The trainable copies' gradients are summed by a ring all-reduce over the k stages holding it
    (slowest link between the first and the last), added to each one's ``allreduce_s``: each device
    its own shard (:func:`tie_grad_bytes`, the largest of the stages'; ZeRO does not divide it: Megatron-LM
    all-reduces the embedding's whole gradient buffer), the tensor ranks' rings side by side on their own
    links (Megatron-LM's embedding group per tensor rank). Where every holder runs on the same devices
    (interleaved chunks of one pipeline) they share one copy and nothing is all-reduced.
    """
    out = list(costs)
    for tie in profile.ties:
        holders = sorted({s for s, st in enumerate(stages) for layer in tie.layers
                          if st.layers[0] <= layer < st.layers[1]})
        if len({tuple(stages[s].devices) for s in holders}) < 2:
            continue
        forms = {s: tie_form(stages[s], tie) for s in holders}
        grad = max(tie_grad_bytes(profile, tie, tables[s], forms[s]) for s in holders)
        link, _ = link_between(cluster, stages[holders[0]].devices, stages[holders[-1]].devices)
        extra = ring_allreduce_s(grad, len(holders), link) if grad > 0 else 0.0
        for s in holders:
            first, end = stages[s].layers
            owns = first <= tie.layers[0] < end
            add = 0 if owns else math.ceil(tie_copy_on(profile, tie, tables[s], forms[s], stages[s].zero))
            out[s] = replace(out[s], allreduce_s=out[s].allreduce_s + extra, static_bytes=out[s].static_bytes + add)
    return tuple(out)


def stage_costs(plan: ir.Plan) -> tuple[ir.StageCost, ...]:
    """What each stage of ``plan`` costs per micro-batch (one per ``plan.stages``, in order), with
    the overheads of the plan's engine on its cluster (:mod:`planner.costmodel.engine`)."""
    return charge_plan(plan, stage_costs_for(plan.profile, plan.cluster, plan.stages, plan.microbatches,
                                             plan.optimizer, plan.precision, plan.engine))

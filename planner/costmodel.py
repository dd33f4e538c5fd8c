"""The cost model: compute, communication and memory of layers, stages and plans.

Pure (numpy only). Every quantity is per device of a group; times are seconds, sizes bytes.
Sources of each formula are cited where it is defined:

- Compute (PipePar section III.A, eq. 3): a layer's profiled time is scaled by
  ``profile.device_flops / gpu.flops`` (the group's slowest GPU: data parallel waits for
  it) and by the micro-batch's share ``1/M`` of the batch; ``n`` devices each do ``1/n``
  of the work in every form (dp splits the batch, split forms split the weight). Where
  the profile measured a layer's fixed part (``forward_fixed_s``/``backward_fixed_s``:
  per-call costs and weight reads that do not shrink with the batch), only the rest
  scales: ``fixed + (b/B)(t - fixed)`` per micro-batch of ``b`` of ``B`` samples, on
  each of the ``n`` devices ``fixed + (b/B)(t - fixed)/n`` -- the time at the
  micro-batch size, which PipeDream (Narayanan et al. SOSP'19, section 3.1) and Alpa
  (Zheng et al. OSDI'22, section 5.2) get by profiling at that size.
- Gradient accumulation (:func:`grad_accumulation_s`): with M > 1 micro-batches, every
  micro-batch after the first adds its weight gradient into the stored one in place
  (PyTorch's AccumulateGrad), 3 x the gradient's bytes of memory traffic / the device's
  ``memory_bandwidth_Bps`` (0 when unknown), added to backward (its weight part).
- Loss: the profile's ``loss_s`` (cross-entropy forward+backward on the last layer's
  output) is charged to the last stage's backward per micro-batch, fixed part whole.
- Optimizer step (``StageCost.optimizer_step_s``): once per iteration after the stage's
  gradient all-reduce, a memory-bound element-wise update (as in ZeRO-Offload, Ren et al.
  ATC'21, section 4.1, which sizes the CPU Adam step by memory traffic): the bytes it
  reads and writes (``OPTIMIZER_TRAFFIC`` per parameter) / the slowest device's
  ``memory_bandwidth_Bps``; 0 when a device's bandwidth is unknown. Split forms update
  1/n of the parameters per device.
- Alpha-beta communication (Hockney 1994; PipePar eq. 4): ``alpha + S/B`` on the slowest
  link a group spans.
- Ring all-reduce (Patarasuk & Yuan 2009; Thakur, Rabenseifner & Gropp 2005):
  ``2(n-1)/n * S/B + 2(n-1) * alpha``; ring all-gather ``(n-1)/n * S/B + (n-1) * alpha``.
- Hierarchical all-reduce for a group spanning servers (Jia et al. 2018, "Highly
  scalable deep learning training system with mixed-precision", 2D/hierarchical ring;
  Horovod/NCCL tree-of-rings): reduce-scatter inside each server, ring all-reduce of
  the ``S/g`` shards across the ``m`` servers, all-gather inside each server.
- Forms (AccPar, Song et al. HPCA 2020; Megatron-LM, Shoeybi et al. 2019; PipePar
  Figure 1), on ``n`` devices, activation share ``S_in``/``S_out`` per micro-batch:
  ``dp`` replicates the weight, its gradient is all-reduced once per iteration;
  ``split_out`` (column parallel) replicates the input and all-gathers the output in
  forward, and all-reduces the partial input gradients in backward; ``split_in`` (row
  parallel) slices the replicated input and all-reduces (element-wise adds) the partial
  outputs in forward, and all-gathers the sliced input gradient in backward. The
  activation between layers is batch-sharded after ``dp`` and replicated after a split
  form; a change between the two (including at a stage's ends, whose boundary layout
  is batch-sharded) costs one all-gather of the boundary activation (forward when
  entering a split form, backward when leaving it). Layers without weights run on
  either layout: batch-sharded (``dp``, 1/n of the work) or replicated (a split form,
  the whole work, no collective), i.e. they follow their neighbours. A layer whose
  weight shape is unknown (``in_features`` None) runs ``dp`` only; on one device every
  layer is ``dp``.
- Memory (ZeRO, Rajbhandari et al. SC'20, section 3; GPipe, Huang et al. 2019, section
  2.3): weights and gradients (``param_bytes`` each) plus optimizer state in fp32
  (``OPTIMIZER_BYTES_PER_PARAM``: sgd 0, momentum 4, adam 8, rmsprop 4 extra bytes per
  parameter; fp32 RMSProp is 4+4+4 = 12 bytes per parameter as in GPipe), divided by n
  for the split forms; activations kept for backward (``saved_bytes``) per micro-batch,
  divided by n (dp: batch share; split forms: output shards; replicated weightless
  layers keep the whole), times the micro-batches in flight
  (:func:`planner.schedule.in_flight_microbatches`); pipedream also stashes one weight
  version per extra micro-batch in flight (Narayanan et al. SOSP'19, section 3.3).
  Recomputation (GPipe re-materialisation, Chen et al. 2016) keeps only the stage's
  input per micro-batch, needs one micro-batch's activations as workspace during its
  backward, and adds one forward to each backward.
- Point-to-point between stages: the activation of the stage's last layer per
  micro-batch crosses ``link_between`` forward and its gradient (same size) backward,
  ``alpha + S/B`` each.
- Iteration time (:func:`analytic_iteration`): with ``l_s`` a stage's per-micro-batch
  forward+backward plus the transfers it receives (fill and drain), ``c_s`` its compute,
  ``x_s`` its incoming transfer and ``ar_s`` its gradient all-reduce followed by its
  optimizer step, flush schedules take
  ``T = sum_s l_s + max_s((M-1) max(c_s, x_s) + ar_s)`` (transfers overlap compute in
  steady state) -- exactly
  ``(M+K-1)(t_f+t_b)`` for uniform stages with free communication (GPipe section 2.2;
  the bottleneck stage runs all M micro-batches while the others fill and drain
  once); asynchronous pipedream has no flush: ``T = max_s(M max(c_s, x_s) + ar_s)`` (PipeDream's
  steady state, one mini-batch of M micro-batches per bottleneck-stage period).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from planner import ir
from planner.cluster import Group, group_of, link_between
from planner.errors import PlanError, UsageError
from planner.schedule import in_flight_microbatches

OPTIMIZER_BYTES_PER_PARAM = {"sgd": 0, "momentum": 4, "adam": 8, "rmsprop": 4}
"""Optimizer state in fp32 bytes per parameter beyond weight and gradient."""

OPTIMIZER_TRAFFIC = {"sgd": (3, 0), "momentum": (3, 2), "adam": (3, 2), "rmsprop": (3, 2)}
"""Memory traffic of one optimizer step per parameter: (passes over the parameter's own
bytes, passes over its fp32 state bytes of ``OPTIMIZER_BYTES_PER_PARAM``). Every update reads
the weight and the gradient and writes the weight (3); momentum/adam/rmsprop also read and
write their state (2). E.g. fp32 adam: 3 * 4 + 2 * 8 = 28 bytes per parameter (torch.optim's
element-wise update, ZeRO-Offload section 4.1)."""

DP, SPLIT_IN, SPLIT_OUT = 0, 1, 2
FORM_INDEX = {f: i for i, f in enumerate(ir.FORMS)}

ZERO_BUBBLE_W_SHARE = 0.5
"""Weight-gradient share of backward when a profile does not give ``backward_weight_s``
(Qi et al. 2023 assume B and W cost the same)."""


# ----------------------------------------------------------------------------- collectives


def p2p_s(nbytes: float, link: ir.Link) -> float:
    """Point-to-point transfer, alpha-beta (Hockney): ``alpha + S/B``; 0 bytes are free."""
    return 0.0 if nbytes <= 0 else link.latency_s + nbytes / link.bandwidth_Bps


def ring_allreduce_s(nbytes: float, n: int, link: ir.Link) -> float:
    """Ring all-reduce (Patarasuk & Yuan 2009): ``2(n-1)/n * S/B + 2(n-1) alpha``."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (n - 1) / n * nbytes / link.bandwidth_Bps + 2 * (n - 1) * link.latency_s


def ring_allgather_s(nbytes: float, n: int, link: ir.Link) -> float:
    """Ring all-gather of a tensor of ``nbytes`` in total: ``(n-1)/n * S/B + (n-1) alpha``."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (n - 1) / n * nbytes / link.bandwidth_Bps + (n - 1) * link.latency_s


def allreduce_coefficients(group: Group) -> tuple[float, float]:
    """Gradient all-reduce time of a group as ``coef * S + const`` (for S > 0).

    Inside one server: a ring on ``intra_node``. Spanning ``m`` servers with ``g`` GPUs
    each: hierarchical (Jia et al. 2018): reduce-scatter in the server
    ``(g-1)/g S/B_in + (g-1) a_in``, ring all-reduce of ``S/g`` over the servers
    ``2(m-1)/m (S/g)/B_out + 2(m-1) a_out``, all-gather in the server (as reduce-scatter).
    """
    n = group.n
    if n <= 1:
        return 0.0, 0.0
    if not group.spans_servers:
        link = group.intra
        return 2 * (n - 1) / n / link.bandwidth_Bps, 2 * (n - 1) * link.latency_s
    g, m = group.per_node, group.nodes
    coef = 2 * (g - 1) / g / group.intra.bandwidth_Bps + 2 * (m - 1) / m / g / group.inter.bandwidth_Bps
    const = 2 * (g - 1) * group.intra.latency_s + 2 * (m - 1) * group.inter.latency_s
    return coef, const


def allreduce_s(nbytes: float, group: Group) -> float:
    """Gradient all-reduce of ``nbytes`` over ``group`` (ring, or hierarchical across servers)."""
    if nbytes <= 0 or group.n <= 1:
        return 0.0
    coef, const = allreduce_coefficients(group)
    return coef * nbytes + const


# ----------------------------------------------------------------------------- per-layer tables


@dataclass(frozen=True)
class LayerTable:
    """Per-layer, per-form costs of a profile on one group shape with M micro-batches.

    Arrays have one row per layer and one column per form (dp, split_in, split_out);
    times are per micro-batch on each device, collectives of the form included.
    ``allowed[l, f]`` says whether form f is open to layer l. ``enter[l]`` is the
    re-layout cost (one all-gather of layer l's input) paid when the layout before
    layer l (batch-sharded or replicated) differs from the one layer l needs.
    ``leave[l]`` is the backward re-layout when a stage ends on layer l in a split form
    (one all-gather of layer l's output gradient). ``in_bytes[l]`` is layer l's input per
    micro-batch (whole, not per device).
    """

    n: int
    fwd: np.ndarray
    bwd: np.ndarray
    bww: np.ndarray
    allowed: np.ndarray
    enter: np.ndarray
    leave: np.ndarray
    static: np.ndarray
    weight: np.ndarray
    act: np.ndarray
    ar_bytes: np.ndarray
    in_bytes: np.ndarray
    out_bytes: np.ndarray
    ar_coef: float
    ar_const: float

    def layout_change(self, a: int, b: int) -> bool:
        """Whether going from form a to form b changes the activation layout."""
        return (a == DP) != (b == DP)


def layer_table(profile: ir.ModelProfile, group: Group, microbatches: int, optimizer: str,
                forms: Sequence[str] = ir.FORMS) -> LayerTable:
    """Build the per-layer, per-form costs of ``profile`` on ``group`` (see module doc)."""
    if optimizer not in OPTIMIZER_BYTES_PER_PARAM:
        raise UsageError(f"unknown optimizer {optimizer!r}", f"use one of {', '.join(OPTIMIZER_BYTES_PER_PARAM)}")
    layers = profile.layers
    nl, n, share = len(layers), group.n, 1.0 / microbatches
    flop_scale = profile.device_flops / group.flops
    scale = flop_scale * share
    link = group.link
    fwd_fixed = np.array([x.forward_fixed_s or 0.0 for x in layers]) * flop_scale
    bwd_fixed = np.array([x.backward_fixed_s or 0.0 for x in layers]) * flop_scale
    fwd_full = np.array([x.forward_s for x in layers]) * scale - fwd_fixed * share
    bwd_full = np.array([x.backward_s for x in layers]) * scale - bwd_fixed * share
    bww_full = np.array([ZERO_BUBBLE_W_SHARE * x.backward_s if x.backward_weight_s is None else x.backward_weight_s
                         for x in layers]) * scale
    out_b = np.array([float(x.output_bytes) for x in layers]) * share
    in_b = np.concatenate([[float(profile.input_bytes) * share], out_b[:-1]])
    pbytes = np.array([float(x.param_bytes) for x in layers])
    pcount = np.array([float(x.param_count) for x in layers])
    saved = np.array([float(x.saved_bytes) for x in layers]) * share
    weightless = pcount == 0
    splittable = np.array([x.splittable for x in layers])

    fwd = np.empty((nl, 3))
    bwd = np.empty((nl, 3))
    bww = np.empty((nl, 3))
    # fwd_full/bwd_full: the part that scales with the work; the fixed part is paid whole
    fwd[:, DP], bwd[:, DP], bww[:, DP] = fwd_full / n + fwd_fixed, bwd_full / n + bwd_fixed, bww_full / n
    ag = np.vectorize(lambda s: ring_allgather_s(s, n, link), otypes=[float])
    ar = np.vectorize(lambda s: ring_allreduce_s(s, n, link), otypes=[float])
    ag_out, ar_out, ag_in, ar_in = ag(out_b), ar(out_b), ag(in_b), ar(in_b)
    # split_out: column parallel; split_in: row parallel (Megatron-LM section 3)
    fwd[:, SPLIT_OUT] = fwd_fixed + np.where(weightless, fwd_full, fwd_full / n + ag_out)
    bwd[:, SPLIT_OUT] = bwd_fixed + np.where(weightless, bwd_full, bwd_full / n + ar_in)
    fwd[:, SPLIT_IN] = fwd_fixed + np.where(weightless, fwd_full, fwd_full / n + ar_out)
    bwd[:, SPLIT_IN] = bwd_fixed + np.where(weightless, bwd_full, bwd_full / n + ag_in)
    for f in (SPLIT_IN, SPLIT_OUT):
        bww[:, f] = np.where(weightless, bww_full, bww_full / n)

    allowed = np.zeros((nl, 3), dtype=bool)
    allowed[:, DP] = True
    if n > 1:
        open_split = weightless | splittable
        for f in (SPLIT_IN, SPLIT_OUT):
            if ir.FORMS[f] in forms:
                allowed[:, f] = open_split

    extra = OPTIMIZER_BYTES_PER_PARAM[optimizer]
    static_full = 2 * pbytes + extra * pcount
    static = np.empty((nl, 3))
    weight = np.empty((nl, 3))
    act = np.empty((nl, 3))
    static[:, DP], weight[:, DP], act[:, DP] = static_full, pbytes, saved / n
    for f in (SPLIT_IN, SPLIT_OUT):
        static[:, f], weight[:, f] = static_full / n, pbytes / n
        act[:, f] = np.where(weightless, saved, saved / n)
    ar_bytes = np.zeros((nl, 3))
    ar_bytes[:, DP] = pbytes if n > 1 else 0.0
    coef, const = allreduce_coefficients(group)
    return LayerTable(n=n, fwd=fwd, bwd=bwd, bww=bww, allowed=allowed, enter=ag_in, leave=ag_out, static=static,
                      weight=weight,
                      act=act, ar_bytes=ar_bytes, in_bytes=in_b, out_bytes=out_b, ar_coef=coef, ar_const=const)


# ----------------------------------------------------------------------------- stage costs


@dataclass(frozen=True)
class StageSummary:
    """Aggregates of one stage's layers under given forms (per micro-batch, per device)."""

    forward_s: float
    backward_s: float
    backward_weight_s: float
    allreduce_bytes: float
    allreduce_s: float
    static_bytes: float
    weight_bytes: float
    activation_bytes: float
    input_bytes: float


def summarise(table: LayerTable, first: int, end: int, forms: Sequence[int]) -> StageSummary:
    """Sum a stage's per-layer costs for ``forms`` (indices), re-layouts included.

    The stage's input and output are batch-sharded (``dp`` layout): entering a split form
    from it costs an all-gather in forward, leaving a split form to it costs one in
    backward (its gradient arrives batch-sharded).
    """
    fw = bw = bww = arb = st = wt = ac = 0.0
    prev = DP
    for k, layer in enumerate(range(first, end)):
        f = forms[k]
        if not table.allowed[layer, f]:
            raise PlanError(f"form {ir.FORMS[f]!r} is not open to layer {layer} on {table.n} devices",
                            "layers without weight shapes (and all layers on one device) run 'dp' only")
        if table.layout_change(prev, f):
            if f != DP:
                fw += table.enter[layer]
            else:
                bw += table.enter[layer]
        fw += table.fwd[layer, f]
        bw += table.bwd[layer, f]
        bww += table.bww[layer, f]
        arb += table.ar_bytes[layer, f]
        st += table.static[layer, f]
        wt += table.weight[layer, f]
        ac += table.act[layer, f]
        prev = f
    if prev != DP:
        bw += table.leave[end - 1]
    ar = arb * table.ar_coef + table.ar_const if arb > 0 else 0.0
    return StageSummary(float(fw), float(bw), float(bww), float(arb), float(ar), float(st), float(wt), float(ac),
                        float(table.in_bytes[first]) / table.n)


def memory_bandwidth_Bps(cluster: ir.Cluster, devices: Sequence[str]) -> float | None:
    """The slowest memory bandwidth among ``devices``; None when any of them does not give one."""
    wanted = set(devices)
    values = [g.memory_bandwidth_Bps for g in cluster.gpus if g.name in wanted]
    if not values or any(v is None for v in values):
        return None
    return min(v for v in values if v is not None)


def optimizer_step_s(weight_bytes: float, static_bytes: float, optimizer: str, bandwidth_Bps: float | None) -> float:
    """One optimizer step over a device's share of a stage's parameters (module doc).

    ``weight_bytes`` is one copy of the parameters, ``static_bytes`` weights + gradients +
    state (so the state is ``static - 2 * weight``); the traffic of ``OPTIMIZER_TRAFFIC``
    over ``bandwidth_Bps``, 0 when the bandwidth is unknown.
    """
    if bandwidth_Bps is None or weight_bytes <= 0:
        return 0.0
    own, state = OPTIMIZER_TRAFFIC[optimizer]
    return (own * weight_bytes + state * max(static_bytes - 2 * weight_bytes, 0.0)) / bandwidth_Bps


def loss_s(profile: ir.ModelProfile, group: Group, microbatches: int) -> float:
    """The training loss's forward+backward per micro-batch on each device of the last stage.

    ``fixed + (b/B)(t - fixed)/n`` of the profile's ``loss_s`` (fixed part as for layers),
    scaled like compute; charged at the start of the last stage's backward. 0 when unknown.
    """
    if profile.loss_s is None:
        return 0.0
    fixed = profile.loss_fixed_s or 0.0
    scaled = (profile.loss_s - fixed) / microbatches / group.n
    return (fixed + scaled) * profile.device_flops / group.flops


def grad_accumulation_s(weight_bytes: float, microbatches: int, bandwidth_Bps: float | None) -> float:
    """Adding each micro-batch's weight gradient into ``.grad``, per micro-batch on average.

    The first micro-batch's gradient is stored as it is; each of the other ``M-1`` is added
    in place (PyTorch autograd's AccumulateGrad, ``grad += new``: read both, write one,
    3 x the gradient's bytes of memory traffic), so ``(M-1)/M * 3 * weight_bytes / bandwidth``
    per micro-batch. A profile's backward holds none of it (each of its passes starts from
    no gradient). 0 when the bandwidth is unknown.
    """
    if bandwidth_Bps is None or weight_bytes <= 0 or microbatches <= 1:
        return 0.0
    return (microbatches - 1) / microbatches * 3 * weight_bytes / bandwidth_Bps


_TABLES: dict[tuple[int, Group, int, str], tuple[ir.ModelProfile, LayerTable]] = {}
_TABLES_MAX = 256


def cached_layer_table(profile: ir.ModelProfile, group: Group, microbatches: int, optimizer: str) -> LayerTable:
    """:func:`layer_table` with all forms open, memoised per (profile object, group shape, M, optimizer).

    Judging many candidate plans (the search's re-ranking) asks for the same few group
    shapes again and again; the profile object is kept with its table, so an id is never
    confused with a later object's.
    """
    key = (id(profile), group, microbatches, optimizer)
    hit = _TABLES.get(key)
    if hit is not None and hit[0] is profile:
        return hit[1]
    table = layer_table(profile, group, microbatches, optimizer)
    if len(_TABLES) >= _TABLES_MAX:
        _TABLES.pop(next(iter(_TABLES)))
    _TABLES[key] = (profile, table)
    return table


def stage_cost_values(profile: ir.ModelProfile, cluster: ir.Cluster, stage: ir.Stage, microbatches: int,
                      optimizer: str, next_devices: Sequence[str] | None) -> ir.StageCost:
    """The :class:`ir.StageCost` of one stage given the next stage's devices (None: last)."""
    group = group_of(cluster, stage.devices)
    table = cached_layer_table(profile, group, microbatches, optimizer)
    first, end = stage.layers
    if end > len(profile.layers) or len(stage.forms) != end - first:
        raise PlanError(f"stage layers {list(stage.layers)} do not fit the profile's {len(profile.layers)} layers",
                        "check the plan's stages")
    forms = [FORM_INDEX[f] for f in stage.forms]
    s = summarise(table, first, end, forms)
    backward = s.backward_s + (s.forward_s if stage.recompute == "full" else 0.0)
    if end == len(profile.layers):
        backward += loss_s(profile, group, microbatches)
    bandwidth = memory_bandwidth_Bps(cluster, stage.devices)
    accumulate = grad_accumulation_s(s.weight_bytes, microbatches, bandwidth)
    backward += accumulate
    if stage.recompute == "full":
        activation, workspace = s.input_bytes, s.activation_bytes
    else:
        activation, workspace = s.activation_bytes, 0.0
    if next_devices is None:
        send_bytes, send_link, link_id = 0.0, None, None
    else:
        send_bytes = float(table.out_bytes[end - 1])
        send_link, link_id = link_between(cluster, stage.devices, next_devices)
    return ir.StageCost(
        devices=tuple(stage.devices), forward_s=s.forward_s, backward_s=backward,
        backward_weight_s=min(s.backward_weight_s + accumulate, backward), send_bytes=send_bytes, send_link=send_link,
        send_link_id=link_id, allreduce_s=s.allreduce_s, allreduce_bytes=s.allreduce_bytes,
        static_bytes=math.ceil(s.static_bytes), weight_bytes=math.ceil(s.weight_bytes),
        activation_bytes=math.ceil(activation), workspace_bytes=math.ceil(workspace),
        capacity_bytes=group.memory_bytes,
        optimizer_step_s=optimizer_step_s(s.weight_bytes, s.static_bytes, optimizer, bandwidth))


def stage_costs_for(profile: ir.ModelProfile, cluster: ir.Cluster, stages: Sequence[ir.Stage], microbatches: int,
                    optimizer: str, schedule: str = "1f1b", virtual_stages: int = 1) -> tuple[ir.StageCost, ...]:
    """:func:`stage_costs` without a Plan: one StageCost per entry of ``stages``, in order.

    For ``interleaved`` with v > 1, ``stages`` are the K*v chunks in model order; chunk
    c sends to chunk c+1 (on the devices of chunk (c+1) mod K).
    """
    out = []
    for s, stage in enumerate(stages):
        nxt = stages[s + 1].devices if s + 1 < len(stages) else None
        out.append(stage_cost_values(profile, cluster, stage, microbatches, optimizer, nxt))
    return with_tied_allreduce(profile, cluster, stages, out)


def with_tied_allreduce(profile: ir.ModelProfile, cluster: ir.Cluster, stages: Sequence[ir.Stage],
                        costs: Sequence[ir.StageCost]) -> tuple[ir.StageCost, ...]:
    """Add each tie's gradient all-reduce between the stages that hold its layers.

    A weight shared by layers in different stages (GPT-2's ``wte``/``lm_head``) has a copy
    on each; their gradients are summed once per iteration before the optimizer step
    (Megatron-LM, Shoeybi et al. 2019, section 3, the embedding all-reduce; DeepSpeed's
    ``TiedLayerSpec``): a ring all-reduce of the tie's ``param_bytes`` over the k stages
    (slowest link between the first and the last of them), added to each one's
    ``allreduce_s``. Stages on the same devices (interleaved chunks) share one copy.
    """
    out = list(costs)
    for tie in profile.ties:
        holders = sorted({s for s, st in enumerate(stages) for layer in tie.layers
                          if st.layers[0] <= layer < st.layers[1]})
        if len({tuple(stages[s].devices) for s in holders}) < 2:
            continue
        link, _ = link_between(cluster, stages[holders[0]].devices, stages[holders[-1]].devices)
        extra = ring_allreduce_s(float(tie.param_bytes), len(holders), link)
        for s in holders:
            out[s] = replace(out[s], allreduce_s=out[s].allreduce_s + extra)
    return tuple(out)


def stage_costs(plan: ir.Plan) -> tuple[ir.StageCost, ...]:
    """What each stage of ``plan`` costs per micro-batch (one per ``plan.stages``, in order)."""
    return stage_costs_for(plan.profile, plan.cluster, plan.stages, plan.microbatches, plan.optimizer,
                           plan.schedule, plan.virtual_stages)


# ----------------------------------------------------------------------------- memory and time


def in_flight(schedule: str, stages: int, microbatches: int, stage: int, virtual_stages: int = 1) -> int:
    """Micro-batches whose activations ``stage`` holds at its peak (planner.schedule)."""
    return in_flight_microbatches(schedule, stages, microbatches, stage, virtual_stages)


def stage_peak_memory(cost: ir.StageCost, schedule: str, stages: int, microbatches: int, stage: int,
                      virtual_stages: int = 1) -> int:
    """Peak memory per device of a stage: static + activations in flight + workspace (+ stashes).

    pipedream keeps one extra weight version per extra micro-batch in flight (weight
    stashing, PipeDream section 3.3).
    """
    k = in_flight(schedule, stages, microbatches, stage, virtual_stages)
    stash = (k - 1) * cost.weight_bytes if schedule == "pipedream" else 0
    return int(cost.static_bytes + k * cost.activation_bytes + cost.workspace_bytes + stash)


def schedule_weights(schedule: str, microbatches: int) -> tuple[float, float]:
    """(a, b) of ``T = a * sum_s l_s + max_s(b * l_s + ar_s)`` for a schedule (see module doc)."""
    if schedule == "pipedream":
        return 0.0, float(microbatches)
    return 1.0, float(microbatches - 1)


def stage_period(costs: Sequence[ir.StageCost]) -> list[float]:
    """``l_s``: forward + backward per micro-batch plus the transfers the stage receives.

    The first micro-batch's activation crosses each stage boundary once on the way in and
    the last one's gradient once on the way out, so fill and drain see ``2 * (alpha + S/B)``.
    """
    periods = []
    for s, c in enumerate(costs):
        recv = 2.0 * costs[s - 1].send_s if s > 0 else 0.0
        periods.append(c.forward_s + c.backward_s + recv)
    return periods


def stage_terms(costs: Sequence[ir.StageCost], schedule: str, microbatches: int) -> list[float]:
    """The steady-state term of each stage: ``b * max(compute, transfer in) + ar_s``.

    Transfers overlap compute (the link works while the device computes, and activations
    and gradients travel in opposite directions of a full-duplex link), so in steady state
    a stage delivers one micro-batch per ``max(t_f + t_b, alpha + S/B)``. Under gpipe
    (F-then-B: all forwards, then all backwards) the two phases stream separately, so a
    stage takes ``max(t_f, x) + max(t_b, x)`` per micro-batch (GPipe section 2.2).
    """
    _, b = schedule_weights(schedule, microbatches)
    out = []
    for s, c in enumerate(costs):
        recv = costs[s - 1].send_s if s > 0 else 0.0
        if schedule == "gpipe":
            busy = max(c.forward_s, recv) + max(c.backward_s, recv)
        else:
            busy = max(c.forward_s + c.backward_s, recv)
        out.append(b * busy + c.allreduce_s + c.optimizer_step_s)
    return out


def analytic_iteration(costs: Sequence[ir.StageCost], schedule: str, microbatches: int) -> tuple[float, float]:
    """Predicted iteration time and bubble fraction of stages under a schedule.

    ``T = a sum_s l_s + max_s(b max(c_s, x_s) + ar_s)`` with ``(a, b)`` from
    :func:`schedule_weights`, ``l_s`` from :func:`stage_period`, ``c_s`` the stage's
    compute and ``x_s`` its incoming transfer per micro-batch; bubble = 1 - (mean stage
    compute M*c_s) / T.
    """
    a, _ = schedule_weights(schedule, microbatches)
    periods = stage_period(costs)
    total = 0.0
    for p in reversed(periods):
        total = p + total
    t = a * total + max(stage_terms(costs, schedule, microbatches))
    busy = sum(microbatches * (c.forward_s + c.backward_s) for c in costs) / len(costs)
    bubble = 0.0 if t <= 0 else min(max(1.0 - busy / t, 0.0), 1.0)
    return t, bubble


def plan_memory(plan: ir.Plan, costs: Sequence[ir.StageCost] | None = None) -> list[int]:
    """Peak memory per device of each stage of ``plan``."""
    costs = stage_costs(plan) if costs is None else costs
    k = len(costs) // max(plan.virtual_stages, 1) if plan.schedule == "interleaved" else len(costs)
    return [stage_peak_memory(c, plan.schedule, max(k, 1), plan.microbatches, s, plan.virtual_stages)
            for s, c in enumerate(costs)]


def predict(plan: ir.Plan) -> ir.Prediction:
    """The analytic prediction for a plan (iteration, samples/s, bubble, peak memory)."""
    costs = stage_costs(plan)
    t, bubble = analytic_iteration(costs, plan.schedule, plan.microbatches)
    peak = max(plan_memory(plan, costs))
    return ir.Prediction(iteration_s=t, samples_per_s=plan.batch_size / t if t > 0 else 0.0,
                         bubble_fraction=bubble, peak_memory_bytes=peak)


# ----------------------------------------------------------------------------- data parallel


def dp_stage(profile: ir.ModelProfile, cluster: ir.Cluster, devices: Sequence[str] | None = None,
             optimizer: str = "sgd") -> ir.Stage:
    """Pure data parallel as one stage: every layer ``dp`` on ``devices`` (default: every GPU).

    ``memory_bytes`` is filled for one micro-batch (M = 1: the whole batch in one go).
    """
    devs = tuple(devices) if devices is not None else tuple(g.name for g in cluster.gpus)
    n = len(profile.layers)
    stage = ir.Stage((0, n), devs, ("dp",) * n, 0)
    cost = stage_cost_values(profile, cluster, stage, 1, optimizer, None)
    mem = stage_peak_memory(cost, "gpipe", 1, 1, 0)
    return ir.Stage((0, n), devs, ("dp",) * n, mem)


def dp_iteration(profile: ir.ModelProfile, cluster: ir.Cluster, optimizer: str = "sgd") -> tuple[float, int, bool]:
    """Pure data parallel over every GPU: (iteration seconds, peak bytes per device, fits)."""
    stage = dp_stage(profile, cluster, optimizer=optimizer)
    cost = stage_cost_values(profile, cluster, stage, 1, optimizer, None)
    t, _ = analytic_iteration([cost], "gpipe", 1)
    return t, stage.memory_bytes, stage.memory_bytes <= cost.capacity_bytes

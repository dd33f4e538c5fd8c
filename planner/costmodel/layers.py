"""Per-layer, per-form costs of a profile on one stage grid: the table HPP and the stage DP read.

Pure (numpy). A stage runs on ``tp x dp`` devices: ``dp`` replicas of a tensor group of
``tp`` devices; each replica takes ``1/(M dp)`` of the batch per micro-batch. A layer's
form is relative to the tensor group (``n = tp`` devices):

- ``dp`` (PipePar form 0): the replica's samples are split over the tensor group's
  devices, weights replicated on all ``tp x dp`` devices and gradients all-reduced over
  all of them (hierarchical across servers); open only when the tensor group's size divides
  the replica's samples per micro-batch (whole samples per device, as the export runs it);
- ``split_out``/``split_in`` (column/row parallel; AccPar, Song et al. HPCA'20; Megatron-LM,
  Shoeybi et al. 2019; PipePar Figure 1): the weight sharded over the tensor group;
  split_out replicates the input and all-gathers the output in forward and all-reduces the
  partial input gradients in backward; split_in all-reduces the partial outputs in forward
  and all-gathers the sliced input gradient in backward;
- ``tp``: Megatron-LM's transformer block (Shoeybi et al. 2019, section 3; Korthikanti et
  al. 2022): attention heads (and KV heads) and the MLP sharded column- then row-parallel,
  two all-reduces of the block's ``s b h`` output in forward and two in backward over the
  tensor group (with sequence parallelism two all-gathers and two reduce-scatters each
  way instead: the same bytes); open to blocks whose heads and KV heads ``tp`` divides. A
  block is no single matrix, so the split forms are closed to it. Without sequence parallelism
  the block's norms, dropouts and residual adds run whole on every rank (the part of its time
  an analytic profile records as ``forward_replicated_s``/``backward_replicated_s``;
  :func:`planner.costmodel.blocks.tp_shares`), with it on ``1/tp`` of the sequence.

Each collective of the tensor group (a split or ``tp`` layer's, a change of layout) costs its ring formula's
time over the link plus what the plan's engine adds to one (``Grid.collective_s``: the cluster's measured
``EngineOverhead.per_collective_s``, the engine's redistribution and the ranks meeting; 0 where not measured).

Sharded layers' gradients are all-reduced over the data-parallel group (``dp`` devices, one
per replica). The activation between layers is batch-sharded after ``dp`` and replicated
after the other forms; a change costs one all-gather of the boundary activation (forward
entering a sharded form, backward leaving it); a stage's ends are batch-sharded. Layers
without weights follow their neighbours' layout. A layer whose weight shape is unknown runs
``dp`` only; on a tensor group of one device every layer is ``dp``.

Compute: a profiled time scales by ``device_flops / peak`` (the group's slowest GPU in the plan's number format;
times the GPUs' sustained shares where both are catalogued: ``precision.flop_scale``; a GPU profile's fixed part,
host time, not: ``precision.fixed_scale``); at the micro-batch ``b`` it is a fixed part, paid whole per call, and a
variable part divided over the devices that share the work: ``fixed(b) + var(b)/n``, read off the layer's times
at several batches where measured, else ``fixed + (b/B)(t - fixed)`` (:mod:`planner.costmodel.batch`, the one
home of that law). Activation memory of a block (Korthikanti et al. 2022, Table 2, per layer
``s b h (34 + 5 a s / h)`` bytes at 16 bits) scales by the table's variants: tensor parallel
``10 + 24/t + 5as/(ht)``, with sequence parallelism ``34/t + 5as/(ht)``, selective
recomputation drops the ``5as/h`` attention-core term; its time is the core's share of the
block's forward, ``4 s^2 h / (24 s h^2 + 4 s^2 h) = s / (6h + s)`` (Narayanan et al. SC'21,
section 5.1), recomputed in backward.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from planner import ir
from planner.cluster import Group
from planner.costmodel.batch import times_at
from planner.costmodel.blocks import block_activation_ratios, core_share, tp_open, tp_shares
from planner.costmodel.collectives import allreduce_coefficients, ring_allgather_s, ring_allreduce_s
from planner.costmodel.precision import Bytes, dtype_bytes, fixed_scale, flop_scale, slowest_peak
from planner.runnable import ANY_FORMS, FormRules, tied_layers

DP, SPLIT_IN, SPLIT_OUT, TP = 0, 1, 2, 3
NF = len(ir.ALL_FORMS)
FORM_INDEX = {f: i for i, f in enumerate(ir.ALL_FORMS)}
SHARDED = np.array([False, True, True, True])
"""Forms whose activation layout is replicated in the tensor group and whose weights are sharded."""

ZERO_BUBBLE_W_SHARE = 0.5
"""Weight-gradient share of backward without ``backward_weight_s`` (Qi et al. 2023: B and W cost the same)."""


@dataclass(frozen=True)
class Grid:
    """A stage's grid as the cost model sees it: the whole group, its tensor degree, the precision."""

    group: Group
    tp: int
    precision: str = "fp32"
    sequence_parallel: bool = False
    collective_s: float = 0.0
    """What the plan's engine adds to each collective of the tensor group beyond its bytes
    (:attr:`planner.ir.EngineOverhead.per_collective_s`)."""

    @property
    def dp(self) -> int:
        return max(self.group.n // self.tp, 1)


@dataclass(frozen=True)
class LayerTable:
    """Per-layer (rows), per-form (columns: dp, split_in, split_out, tp) costs per micro-batch.

    ``fwd``/``bwd``/``bww`` seconds on each device, collectives of the form included;
    ``allowed`` which forms are open; ``enter[l]``/``leave[l]`` the re-layout all-gathers;
    ``sync`` each layer's gradient synchronisation per iteration (seconds, without the
    collective's latency ``sync_const``); ``weight`` one copy of its weights per device
    (bytes), ``grad`` of its gradients (its trainable weights': frozen ones have none, nor
    optimizer state, nor synchronisation), ``wsync`` what ``sync`` would be for all its weights
    (ZeRO-3 gathers the frozen ones too); ``static`` (4, layers, forms) weights + gradients +
    optimizer state per device at ZeRO stage 0..3 (sharded over the group its gradients are
    synchronised over);
    ``act``/``act_sel`` activations kept per micro-batch without / with selective
    recomputation; ``core`` the selective recomputation's extra backward time;
    ``in_bytes``/``out_bytes`` a layer's input/output per micro-batch and replica.
    """

    n: int
    dp: int
    fwd: np.ndarray
    bwd: np.ndarray
    bww: np.ndarray
    allowed: np.ndarray
    enter: np.ndarray
    leave: np.ndarray
    sync: np.ndarray
    sync_const: float
    weight: np.ndarray
    static: np.ndarray
    act: np.ndarray
    act_sel: np.ndarray
    core: np.ndarray
    in_bytes: np.ndarray
    out_bytes: np.ndarray
    head: np.ndarray
    """Per layer, whether it follows the model's last transformer block (``ModelProfile.head_start``:
    full recomputation does not redo it)."""
    grad: np.ndarray
    """Per layer and form, the bytes of its gradients on each device (those of its trainable weights)."""
    wsync: np.ndarray
    """Per layer and form, what ``sync`` would be for every weight, frozen ones too (ZeRO-3's gathers)."""
    kept_in: np.ndarray
    """Per layer and form, the layer's input as held on each device (batch-sharded under ``dp``, replicated
    under the other forms, but for ``tp`` with sequence parallelism): what checkpointing the layer keeps."""
    loss_ws: np.ndarray
    """Per layer and form, the training loss's workspace on each device: the last layer's, where the profile
    takes a loss (:func:`loss_workspace`); none elsewhere."""
    loss_gathered: np.ndarray
    """``loss_ws`` where a split head's logits are gathered whole on every device of its tensor group before the
    loss (the torch export's ``ColwiseParallel(output_layouts=Replicate())``; :func:`loss_workspace`)."""
    blockwise: bool = False
    """Whether full recomputation checkpoints each layer on its own (a model with transformer blocks, as
    Megatron-LM and torchtitan do) rather than the stage as one region (GPipe): :data:`KEYS`' ``ckpt`` and
    ``work_max``, planner.costmodel.variant."""
    agg_rows: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """What each layer adds to each aggregate of :data:`KEYS`, per form: (len(KEYS), layers, forms)."""

    def __post_init__(self) -> None:
        head = self.head[:, None]
        units = np.broadcast_to(self.weight[:, :1] > 0, self.weight.shape).astype(float)
        rows = np.stack([self.fwd + self.bwd, self.fwd, self.sync, *self.static, self.weight, self.act,
                         self.act_sel, self.core, np.where(head, self.fwd, 0.0), np.where(head, self.act, 0.0),
                         units, self.grad, self.wsync, np.where(head, 0.0, self.kept_in),
                         np.where(head, 0.0, self.act), self.loss_ws, self.weight, self.loss_gathered])
        object.__setattr__(self, "agg_rows", rows)

    def layout_change(self, a: int, b: int) -> bool:
        """Whether going from form a to form b changes the activation layout."""
        return bool(SHARDED[a] != SHARDED[b])

    def rows(self, layer: int) -> np.ndarray:
        """What ``layer`` adds to each aggregate of :data:`KEYS`, per form: shape (len(KEYS), NF)."""
        return self.agg_rows[:, layer]


KEYS = ("time", "fwd", "sync", "static0", "static1", "static2", "static3", "weight", "act", "act_sel", "core",
        "fwd_head", "act_head", "units", "grad", "wsync", "ckpt", "work_max", "loss_ws", "unit_max", "loss_gathered")
"""The aggregates of a stage under its forms, per micro-batch and device (``time`` = forward + backward
with collectives and re-layouts, ``fwd`` its forward part, ``sync`` the gradient synchronisation per
iteration without latency, ``static<z>`` memory at ZeRO stage z, ``weight`` one copy of the weights,
``act``/``act_sel`` activations per micro-batch, ``core`` selective recomputation's time,
``fwd_head``/``act_head`` the forward time and activations of the layers after the model's last
transformer block, which full recomputation leaves out; ``units`` the layers with weights, each an
FSDP unit under ZeRO-2/3, planner.costmodel.variant; ``grad`` the gradients' bytes, ``wsync`` the
synchronisation ``sync`` would be for every weight, frozen ones included; ``ckpt`` the inputs of the layers
before the head, which checkpointing each layer keeps, and ``work_max`` the largest of their activations, its
workspace during a backward; ``loss_ws`` the loss's workspace, the last layer's alone; ``unit_max`` the largest
layer's weights, ZeRO-3's gathered unit, planner.costmodel.variant; ``loss_gathered`` ``loss_ws`` with a split
head's logits gathered whole); ``work_max`` and ``unit_max`` are taken as a
maximum, not a sum (:data:`MAX_KEYS`); the re-layouts add to ``time`` and ``fwd`` (rows 0 and 1)."""
MAX_KEYS = [KEYS.index("work_max"), KEYS.index("unit_max")]
"""The aggregates over a stage's layers that are their maximum (planner.costmodel.stage.summarise,
planner.search.hpp)."""


@dataclass(frozen=True)
class _Columns:
    """Per-layer inputs of a table, for one replica's micro-batch (whole layer, not per device)."""

    fwd_fixed: np.ndarray
    bwd_fixed: np.ndarray
    fwd_full: np.ndarray
    bwd_full: np.ndarray
    bww_full: np.ndarray
    out_b: np.ndarray
    in_b: np.ndarray
    saved: np.ndarray
    pcount: np.ndarray
    weight: np.ndarray
    weightless: np.ndarray
    splittable: np.ndarray
    trains: np.ndarray
    """The share of each layer's parameters that train (``LayerProfile.trainable_share``)."""


def _columns(profile: ir.ModelProfile, grid: Grid, microbatches: int, nbytes: Bytes) -> _Columns:
    layers = profile.layers
    share = 1.0 / (microbatches * grid.dp)
    peak = slowest_peak(profile, grid.group.peaks)
    scale, fixed = flop_scale(profile, peak), fixed_scale(profile, peak)
    at = times_at(profile, profile.batch_size * share)
    fwd_fixed, bwd_fixed = at.fwd_fixed * fixed, at.bwd_fixed * fixed
    fwd_full, bwd_full = at.fwd_var * scale, at.bwd_var * scale
    bww_full = np.array([ZERO_BUBBLE_W_SHARE * x.backward_s if x.backward_weight_s is None else x.backward_weight_s
                         for x in layers]) * scale * share
    out_b = np.array([float(x.output_bytes) for x in layers]) * share * nbytes.activation_scale
    in_b = np.concatenate([[float(profile.input_bytes) * share * nbytes.activation_scale], out_b[:-1]])
    pcount = np.array([float(x.param_count) for x in layers])
    return _Columns(fwd_fixed, bwd_fixed, fwd_full, bwd_full, bww_full, out_b, in_b,
                    np.array([float(x.saved_bytes) for x in layers]) * share * nbytes.activation_scale, pcount,
                    np.array([float(x.param_bytes) for x in layers]) * nbytes.weight_scale, pcount == 0,
                    np.array([x.splittable for x in layers]), np.array([x.trainable_share for x in layers]))


def layer_table(profile: ir.ModelProfile, grid: Grid | Group, microbatches: int, optimizer: str,
                forms: Sequence[str] = ir.ALL_FORMS, rules: FormRules = ANY_FORMS) -> LayerTable:
    """Build the per-layer, per-form costs of ``profile`` on ``grid`` (see the module doc); ``rules``: an engine's
    own limits on which layers take which forms (planner.engines.FormRules).

    A bare ``Group`` is a grid of one tensor group of all its devices (``tp = n``, version 1).
    """
    if isinstance(grid, Group):
        grid = Grid(grid, grid.n)
    nbytes = Bytes.of(profile, grid.precision, optimizer)
    c = _columns(profile, grid, microbatches, nbytes)
    tensor = grid.group.tensor_group(grid.tp)
    n, link = tensor.n, tensor.link
    extra = grid.collective_s if n > 1 else 0.0
    ag_in, ag_out = (_collectives(ring_allgather_s, b, n, link, extra) for b in (c.in_b, c.out_b))
    fwd, bwd, bww = _times(c, n, link, extra, ag_in, ag_out, tp_shares(profile, n, grid.sequence_parallel))
    allowed = _allowed(profile, c, n, forms, profile.batch_size / (microbatches * grid.dp), rules)
    act, act_sel, core = _activations(profile, grid, c, n)
    sync, const, shard = _sync(grid, c.weight * c.trains, n)
    wsync, _, _ = _sync(grid, c.weight, n)
    weight = _per_device(c.weight, n)
    grad = _per_device(c.weight * c.trains, n)
    state = nbytes.state_per_param * (c.pcount * c.trains)[:, None] * np.where(SHARDED, 1.0 / n, 1.0)[None, :]
    static = np.stack([weight + grad + state, weight + grad + state / shard,
                       weight + (grad + state) / shard, (weight + grad + state) / shard])
    logits = c.out_b[-1] / (dtype_bytes(profile.dtype) * nbytes.activation_scale)  # elements, from their bytes
    return LayerTable(n=n, dp=grid.dp, fwd=fwd, bwd=bwd, bww=bww, allowed=allowed, enter=ag_in, leave=ag_out,
                      sync=sync, sync_const=const, weight=weight, static=static, act=act, act_sel=act_sel, core=core,
                      in_bytes=c.in_b, out_bytes=c.out_b,
                      head=np.arange(len(profile.layers)) >= profile.head_start, grad=grad, wsync=wsync,
                      kept_in=_kept_inputs(c.in_b, n, grid.sequence_parallel), blockwise=profile.blockwise_recompute,
                      loss_ws=loss_workspace(profile, logits, n),
                      loss_gathered=loss_workspace(profile, logits, n, gathered=True))


LOSS_BYTES_PER_LOGIT = 12
"""Bytes per logit the cross-entropy loss holds at its peak, in its backward: the fp32 log-softmax it saved, the
gradient of that (dense fp32: ``nll_loss``'s backward) and the gradient of the fp32 logits, 4 bytes each; the fp32
copy of 16-bit logits that it takes first (``logits.float()``, as torchtitan's loss and the profiler's take it) is
freed once the log-softmax is made. On an H200 the torch engine's peak memory over the prediction without it was
4.9 GB too low for GPT-2 at 8 x 1024 tokens (411.7M logits; docs/fidelity.md)."""


def loss_workspace(profile: ir.ModelProfile, logits: float, n: int, gathered: bool = False) -> np.ndarray:
    """Per layer and form, the loss's workspace per device (:data:`LOSS_BYTES_PER_LOGIT`): the ``logits`` of one
    micro-batch (the last layer's output elements), split over the ``n`` devices of its tensor group (by the batch
    under ``dp``, the vocabulary under the split forms, as a vocabulary-parallel loss keeps them: Megatron-LM's,
    torchtitan's ``loss_parallel``; the loss of each tensor rank's share of the samples), but under ``split_in``,
    whose output every device holds whole, and under both split forms where ``gathered``: an engine that gathers
    the logits whole before the loss; none where the profile takes no loss."""
    out = np.zeros((len(profile.layers), NF))
    if profile.loss_s is None:
        return out
    whole = float(logits) * LOSS_BYTES_PER_LOGIT
    out[-1, :] = whole if gathered else whole / n
    out[-1, DP] = whole / n
    out[-1, SPLIT_IN] = whole
    return out


def _kept_inputs(in_b: np.ndarray, n: int, sequence_parallel: bool) -> np.ndarray:
    """Each layer's input per device and form, as a checkpoint keeps it: batch-sharded under ``dp``,
    replicated (all-gathered) under the split forms and ``tp``, whose input sequence parallelism shards
    (Korthikanti et al. 2022, Table 2: full recomputation keeps ``2 s b h``, ``2 s b h / t`` with sequence
    parallelism)."""
    out = np.empty((len(in_b), NF))
    out[:, DP] = in_b / n
    out[:, SPLIT_IN] = out[:, SPLIT_OUT] = in_b
    out[:, TP] = in_b / n if sequence_parallel else in_b
    return out


def _per_device(whole: np.ndarray, n: int) -> np.ndarray:
    """A layer's bytes per device per form: whole under ``dp``, a 1/n shard under the tensor forms."""
    out = np.empty((len(whole), NF))
    out[:, DP] = whole
    out[:, 1:] = (whole / n)[:, None]
    return out


def _collectives(ring_s: Callable[[float, int, ir.Link], float], nbytes: np.ndarray, n: int, link: ir.Link,
                 extra: float) -> np.ndarray:
    """Each layer's collective of ``nbytes`` over the tensor group: the ring formula's time, plus what the engine
    adds to one (``extra``) where it moves bytes."""
    return np.array([ring_s(x, n, link) for x in nbytes]) + extra * (np.asarray(nbytes) > 0)


def _times(c: _Columns, n: int, link: ir.Link, extra: float, ag_in: np.ndarray, ag_out: np.ndarray,
           tp_share: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-micro-batch times per form; ``ag_in``/``ag_out`` the all-gathers of each layer's input/output;
    ``extra`` what the engine adds to each collective; ``tp_share`` :func:`tp_shares`."""
    nl = len(c.pcount)
    fwd, bwd, bww = np.empty((nl, NF)), np.empty((nl, NF)), np.empty((nl, NF))
    fwd[:, DP], bwd[:, DP], bww[:, DP] = c.fwd_full / n + c.fwd_fixed, c.bwd_full / n + c.bwd_fixed, c.bww_full / n
    ar_out, ar_in = (_collectives(ring_allreduce_s, b, n, link, extra) for b in (c.out_b, c.in_b))
    wl = c.weightless
    fwd[:, SPLIT_OUT] = c.fwd_fixed + np.where(wl, c.fwd_full, c.fwd_full / n + ag_out)
    bwd[:, SPLIT_OUT] = c.bwd_fixed + np.where(wl, c.bwd_full, c.bwd_full / n + ar_in)
    fwd[:, SPLIT_IN] = c.fwd_fixed + np.where(wl, c.fwd_full, c.fwd_full / n + ar_out)
    bwd[:, SPLIT_IN] = c.bwd_fixed + np.where(wl, c.bwd_full, c.bwd_full / n + ag_in)
    fwd[:, TP] = c.fwd_fixed + c.fwd_full * tp_share[0] + 2 * ar_out
    bwd[:, TP] = c.bwd_fixed + c.bwd_full * tp_share[1] + 2 * ar_out
    for f in (SPLIT_IN, SPLIT_OUT):
        bww[:, f] = np.where(wl, c.bww_full, c.bww_full / n)
    bww[:, TP] = c.bww_full / n
    return fwd, bwd, bww


def _allowed(profile: ir.ModelProfile, c: _Columns, n: int, forms: Sequence[str], samples: float,
             rules: FormRules = ANY_FORMS) -> np.ndarray:
    """Which forms each layer may take on a tensor group of ``n`` (``dp`` only where ``n`` divides the ``samples``
    per micro-batch and replica) under the engine's ``rules`` (:class:`planner.runnable.FormRules`)."""
    allowed = np.zeros((len(c.pcount), NF), dtype=bool)
    allowed[:, DP] = n == 1 or math.isclose(samples / n, round(samples / n))
    if n > 1:
        blocks = np.array([x.block is not None for x in profile.layers])
        if rules.blocks_tp:
            allowed[:, DP] &= ~blocks
        allowed[:, DP] &= np.array([rules.splits_samples(x) for x in profile.layers], dtype=bool)
        tied = tied_layers(profile)
        shards = np.array([rules.splits(x, i in tied) for i, x in enumerate(profile.layers)])
        for f in (SPLIT_IN, SPLIT_OUT):  # a transformer block is no single matrix: it shards as Megatron's tp form
            if ir.ALL_FORMS[f] in forms:
                even = np.array([rules.splits_evenly(x, ir.ALL_FORMS[f], n) for x in profile.layers], dtype=bool)
                allowed[:, f] = (c.weightless | (c.splittable & shards & even)) & ~blocks
        if "tp" in forms:
            allowed[:, TP] = tp_open(profile, n)
        for i, form in rules.pinned(profile).items():  # the engine has one form for the layer
            allowed[i] &= np.arange(NF) == FORM_INDEX[form]
    return allowed


def _activations(profile: ir.ModelProfile, grid: Grid, c: _Columns, n: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    tp_act, tp_sel, dp_sel = block_activation_ratios(profile, n, grid.sequence_parallel)
    core_full = c.fwd_full * core_share(profile)
    act, act_sel, core = (np.empty((len(c.pcount), NF)) for _ in range(3))
    act[:, DP], act_sel[:, DP], core[:, DP] = c.saved / n, c.saved * dp_sel / n, core_full / n
    for f in (SPLIT_IN, SPLIT_OUT):
        act[:, f] = np.where(c.weightless, c.saved, c.saved / n)
        act_sel[:, f] = np.where(c.weightless, c.saved * dp_sel, c.saved * dp_sel / n)
        core[:, f] = np.where(c.weightless, core_full, core_full / n)
    act[:, TP], act_sel[:, TP], core[:, TP] = c.saved * tp_act, c.saved * tp_sel, core_full / n
    return act, act_sel, core


def _sync(grid: Grid, nbytes: np.ndarray, n: int) -> tuple[np.ndarray, float, np.ndarray]:
    """Synchronisation of ``nbytes`` per layer (its gradients) per form (seconds without latency), the
    latency, and the size of the group each form's state is sharded over by ZeRO."""
    coef_all, const_all = allreduce_coefficients(grid.group) if grid.group.n > 1 else (0.0, 0.0)
    data = grid.group.data_group(grid.tp) if n < grid.group.n else None
    coef_dp, _ = allreduce_coefficients(data) if data is not None and data.n > 1 else (0.0, 0.0)
    sync = np.empty((len(nbytes), NF))
    sync[:, DP] = coef_all * nbytes
    sync[:, 1:] = (coef_dp * nbytes / n)[:, None]
    shard = np.array([float(grid.group.n)] + [float(grid.dp)] * (NF - 1))
    return sync, const_all, shard

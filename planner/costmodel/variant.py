"""A stage's memory-for-time choices: recomputation and ZeRO, as one formula for the DP and the scalar model.

Pure (numpy; every function takes floats or arrays alike, so the stage DP's vectorised tables
and the scalar cost of one stage come from the same definition).

- Recomputation (per stage): ``none`` keeps every activation; ``selective`` recomputes the
  attention core (Korthikanti et al. 2022, section 4.2): activations ``act_sel``, backward
  plus ``core``; ``full`` redoes the forward in backward. In a model with transformer blocks it
  checkpoints each layer (Megatron-LM's full recomputation with one layer per checkpoint,
  torchtitan's full activation checkpointing): it keeps every layer's input per micro-batch
  (``ckpt``; ``2 s b h`` a block, Korthikanti et al. 2022, Table 2) and needs the largest layer's
  activations as workspace while that layer's backward runs (``work_max``). In a model without
  blocks (many small layers, whose inputs are most of what they save) it checkpoints the stage
  as one region: it keeps only the stage input per micro-batch and needs one micro-batch's
  activations of the whole stage as workspace (GPipe, Huang et al. 2019, section 2.3; Chen et al.
  2016). ``ModelProfile.blockwise_recompute`` says which. Layers after the model's last
  transformer block (final norm, logits head: ``fwd_head``, ``act_head``) are not redone and
  keep their activations, as in Megatron-LM's and torchtitan's full activation checkpointing,
  which wrap the transformer layers only (``ModelProfile.recomputed_layers``; the exported
  engines checkpoint the same layers).
- The loss's workspace (``loss_ws``: the last stage's, planner.costmodel.layers.loss_workspace) is held
  before the stage's backward begins, so it is the workspace where it exceeds recomputation's.
- ZeRO over the data-parallel group (Rajbhandari et al. SC'20, sections 5 and 7), with
  ``A`` the gradient all-reduce of the stage (reduce-scatter + all-gather, ``2 Psi``) and
  ``H = A / 2`` one reduce-scatter or all-gather (``Psi``; at the links' all-gather bus bandwidth
  where it differs from the all-reduce's, ``shard_scale``): stage 0 pays ``A`` per iteration,
  1 a reduce-scatter and an all-gather, ``2H`` (it shards the optimizer state: the same volume,
  ZeRO section 7.2.1); stage 2
  also shards the gradients, so with ``M`` micro-batches each of the other ``M - 1``
  backwards reduce-scatters its gradient (``A + (M-1) H``); stage 3 shards the weights
  too: every micro-batch all-gathers them in forward and again in backward and
  reduce-scatters the gradient (``3 Psi`` per micro-batch and iteration, section 7.2.2):
  ``H`` added to each forward and backward and ``M H`` per iteration; a forward redone by full
  recomputation runs inside its backward on that backward's gather and adds none. Memory of each stage
  is in the table's ``static<z>``. Frozen weights (fine-tuning: ``LayerProfile.trainable_count``)
  have no gradients and no optimizer state, so ``A``, ``H`` and the partitions ``W / d`` below are the
  trainable weights'; only ZeRO-3's gathers move every weight (``wsync``: FSDP shards frozen ones too).
- ZeRO-3's working copies (:func:`_gathered`): sharding the weights leaves every device holding, while a
  unit's backward runs, that unit's gathered weights, the next unit's prefetched ones and the unit's whole
  gradient until its reduce-scatter: ``2 U + U`` beyond the shards, ``U`` the stage's largest unit
  (``unit_max``; FSDP's backward prefetching, Zhao et al. VLDB 2023; DeepSpeed's ``stage3_max_live_parameters``
  bounds the same live set), counted as workspace on top of the loss's or recomputation's. Where an engine
  keeps the weights gathered and the gradients unreduced through the step (``sync_last_backward``), they are
  in its static bytes already.
- Gradients as reduced: an engine that reduces fp32 gradients of 16-bit weights (``wide_reduce_zero``: the
  torch export's fp32 parameters, FSDP's ``reduce_dtype=float32``, DeepSpeed's bf16 optimizer at ZeRO-0)
  moves ``copy_scale`` (2) times the weights' bytes in every all-reduce and reduce-scatter of gradients;
  ZeRO's gathers of the weights move the weights' bytes, but for torch's ZeRO-1, which broadcasts its fp32
  parameters.
- Where the collectives run beside the compute (``prefetch``: GPUs, whose NCCL collectives have their
  own stream; not CPU processes sharing their cores), ZeRO-3's all-gathers of a forward or backward and
  its reduce-scatters, and ZeRO-2's reduce-scatters, add to it only what its compute cannot hide, and
  at least one unit's share (:func:`_exposed`; FSDP's forward and backward prefetching); elsewhere they
  add in full, as above.
- How an engine runs them (:class:`ZeroComms`, :func:`planner.costmodel.engine.zero_comms`). An
  engine whose ZeRO-1 moves more than the paper's ``A`` pays its extra share of ``A`` too
  (``gather_share``: torch's, whose gradients are all-reduced and whose ZeroRedundancyOptimizer
  then broadcasts every parameter from the rank that stepped it, an all-gather's volume more:
  ``A + H``). An engine whose schedule defers ZeRO-2/3's reduction to the step's last backward
  (``sync_last_backward``: torch pipelining runs every backward of an FSDP module without
  reducing its gradients or resharding its weights, and reduces and reshards once after the last,
  torch/distributed/pipelining/stage.py, ``backward_maybe_with_nosync`` and
  ``perform_reduce_grad``) reduce-scatters once a step: ZeRO-2 moves
  ``A`` (one all-gather at the first forward, one reduce-scatter), ZeRO-3 all-gathers in every
  backward and once at the first forward (``H`` per backward, ``2H`` per step), and both hold the
  gathered weights and the unreduced gradients until the step's end: ZeRO-1's memory, and the
  weights' sharded copy besides (FSDP2's ``set_reshard_after_backward(False)`` and
  ``set_requires_gradient_sync(False)``: "uses more gradient memory (storing the unsharded
  gradients)", pytorch/pytorch#126166). Each all-gather or
  reduce-scatter of one FSDP unit (``units``: a layer with weights) costs ``unit_op_s`` beyond its
  bytes (the engine's ``per_shard_s``, measured by ``planner calibrate``). An engine whose ZeRO-0/1
  all-reduce copies the gradients into flat buffers (``copy_zero``; torch's export and DeepSpeed's
  pipeline engine, :class:`planner.grad_buffers.GradCopy`) holds ``min(G, cap)`` more bytes while it
  reduces (DeepSpeed's even over a data-parallel group of one, ``copy_alone``), ``G`` the gradients as
  reduced (``copy_scale`` times the weights' bytes: fp32 gradients of 16-bit weights are twice their bytes):
  after the last backward, when the activations are
  gone, so a stage's peak is ``static + max(activations in flight + workspace, copy)``
  (``transient``); copying all ``G`` bytes a bucket at a time takes ``copy_s_per_byte`` a byte, added to
  the step's synchronisation (flatten, scale and copy back read and write them: ``GRAD_COPY_PASSES``).
  An engine whose buckets cover every gradient and live with the model
  (``copy_held``: DDP's, with its default ``gradient_as_bucket_view=False``; torchtitan's ZeRO-0)
  holds ``G`` more static bytes instead. DeepSpeed's ZeRO-1 holds two fp32 reduction buffers of ``reduce_bucket_size``
  elements through the step's backward (``zero1_buffer_bytes``, counted with its static bytes; the
  export bounds that size, planner.grad_buffers.deepspeed_bucket_params); ZeRO 0 then stays a choice beside 1.
  Its ZeRO-1 reduces into partitions and all-gathers the parameters parameter by parameter in Python:
  ``unit_op_s`` twice a step per layer with weights (``zero1_unit_ops``), measured as torch's FSDP is.
  An engine that keeps fp32 parameters (the optimizer's master weights) and computes with a 16-bit
  copy of them made once a step (``compute_copy_zero``: torch's export under ZeRO-0/1 in bf16) holds
  that copy, ``W`` at the weights' precision, beside the paper's bytes, whose 16-bit weights and
  gradients and fp32 master and state it otherwise matches (4 + 4 + 8 bytes a parameter with Adam).
  It also keeps an fp32 master copy of its partition ``W / d`` when the weights are fp32 (the paper's
  mixed-precision state holds one already; ``zero1_master_share``), and flattens the partition's
  gradients into a new fp32 tensor for the optimizer step, after the last backward
  (``zero1_grad_share``, in the transient; stage_1_and_2.py: ``single_partition_of_fp32_groups``,
  ``single_grad_partition``).
- Gradient accumulation (``accumulates``): over two or more micro-batches, autograd computes each
  layer's weight gradient into a new tensor and then adds it to the one kept (``AccumulateGrad``), so
  a backward holds the largest layer's gradient twice for a moment: ``U`` more workspace (on this
  machine a 2-stage MLP's stage peaked 4.4 MiB above its steady state, its 4 MiB layer's gradient;
  Megatron-LM's gradient-accumulation fusion adds into ``main_grad`` inside the GEMM, no engine here).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.grad_buffers import ALONE_COPY_PASSES, GRAD_COPY_PASSES


@dataclass(frozen=True)
class Variant:
    """One stage's choice of recomputation and ZeRO stage."""

    recompute: str = "none"
    zero: int = 0


@dataclass(frozen=True)
class ZeroComms:
    """How an engine runs ZeRO's collectives, where it departs from the paper's volumes (module doc):
    ZeRO-1's traffic beyond ``A`` as a share of it, whether ZeRO-2/3 reduce once a step after the
    last backward, and the seconds of each FSDP unit's all-gather or reduce-scatter beyond its bytes."""

    gather_share: float = 0.0
    sync_last_backward: bool = False
    unit_op_s: float = 0.0
    copy_zero: tuple[int, ...] = ()
    """The ZeRO stages whose gradient all-reduce copies the gradients into flat buffers (module doc)."""
    copy_cap_bytes: float = 0.0
    """The most bytes one such copy holds."""
    copy_scale: float = 1.0
    """The gradients' bytes as reduced over the weights' bytes at the plan's precision."""
    zero1_unit_ops: bool = False
    """Whether ZeRO-1 pays ``unit_op_s`` per layer with weights twice a step (module doc)."""
    zero1_buffer_bytes: float = 0.0
    """What the engine's ZeRO-1 holds besides the paper's bytes, through the step (DeepSpeed's reduction
    buffers; module doc)."""
    copy_held: bool = False
    """Whether the flat copy lives with the model (DDP's buckets: static bytes) rather than while the
    gradients are reduced (a transient; module doc)."""
    zero1_master_share: float = 0.0
    """ZeRO-1's static bytes beyond the paper's, in shares of the weights' partition ``W / d``: an fp32
    master copy of fp32 weights (DeepSpeed's; module doc)."""
    zero1_grad_share: float = 0.0
    """ZeRO-1's transient through the optimizer step, in shares of ``W / d``: its partition's gradients
    flattened into fp32 (DeepSpeed's; module doc)."""
    prefetch: bool = False
    """Whether ZeRO-2/3's collectives run beside the compute (module doc: GPUs, whose collectives have their own
    stream; not CPU processes that share their cores)."""
    shard_scale: float = 1.0
    """One all-gather or reduce-scatter over half an all-reduce of the same bytes: the links' all-reduce bus
    bandwidth over their all-gather's (``planner.ir.Link``; 1 where the cluster gives neither, as NCCL's
    rings reach about the same bus bandwidth in both; gloo's on CPU 1.1-2.3)."""
    compute_copy_zero: tuple[int, ...] = ()
    """The ZeRO stages under which the engine holds a 16-bit copy of the weights for the step beside its fp32
    parameters (module doc; ``EngineLimits.compute_copy_zero``, in a 16-bit precision)."""
    wide_reduce_zero: tuple[int, ...] = ()
    """The ZeRO stages under which the gradients move at ``copy_scale`` times the weights' bytes, and torch's
    ZeRO-1 broadcasts parameters as wide (``EngineLimits.wide_reduce_zero``); elsewhere at the weights'."""
    copy_alone: bool = False
    """Whether the flat copy is made even where the data-parallel group is one process (DeepSpeed's;
    :class:`planner.grad_buffers.GradCopy`)."""
    copy_s_per_byte: float = 0.0
    """Seconds per byte of gradients the flat copy moves, once a step with the synchronisation: its passes
    (:data:`planner.grad_buffers.GRAD_COPY_PASSES`, each reading and writing them) over the devices' memory
    bandwidth; 0 where that is unknown (module doc)."""
    accumulates: bool = False
    """Whether autograd adds each micro-batch's weight gradients into the ones kept (module doc): every engine
    the planner runs; not the paper's count."""
    gathered_loss: bool = False
    """Whether a split head's logits are gathered whole on every device of its tensor group before the loss
    (``loss_gathered``, planner.costmodel.layers.loss_workspace): the torch export's; not the paper's
    vocabulary-parallel loss (Megatron-LM's, torchtitan's ``loss_parallel``)."""

    def gradient_scale(self, zero: int) -> float:
        """The gradients' bytes as reduced under ZeRO stage ``zero`` over the weights' (``copy_scale`` where the
        engine reduces them in fp32, ``wide_reduce_zero``; else 1)."""
        return self.copy_scale if zero in self.wide_reduce_zero else 1.0

    @property
    def zero1_holds_more(self) -> bool:
        """Whether the engine's ZeRO-1 holds memory beyond the paper's (buffers or partition copies)."""
        return bool(self.zero1_buffer_bytes or self.zero1_master_share or self.zero1_grad_share)

    @property
    def zero1_beats_zero0(self) -> bool:
        """Whether ZeRO-1 is never slower nor fuller than ZeRO-0: it moves the paper's bytes and pays and
        holds nothing more (ZeRO section 7.2.1), and its reduce-scatter and all-gather cost no more than an
        all-reduce (``shard_scale``)."""
        return (self.gather_share == 0 and not self.zero1_unit_ops and not self.zero1_holds_more
                and self.shard_scale <= 1.0)

    @property
    def zero2_beats_zero3(self) -> bool:
        """Whether ZeRO-2 is never slower nor fuller than ZeRO-3: where the engine reduces once a step,
        3 holds 2's memory and gathers the weights again in every backward (:func:`variant_cost`)."""
        return self.sync_last_backward


PAPER = ZeroComms()
"""The ZeRO paper's volumes, nothing more (an engine-less plan, DeepSpeed)."""


def variants(recompute: Iterable[str], zero: Iterable[int], dp: int, comms: ZeroComms = PAPER) -> list[Variant]:
    """Every (recompute, zero) pair allowed; ZeRO > 0 only with a data-parallel group of 2 or more.

    A stage the engine's next one beats (:attr:`ZeroComms.zero1_beats_zero0`,
    :attr:`ZeroComms.zero2_beats_zero3`) is left out when both are allowed; where ZeRO-1 moves, pays
    or holds more (torch's, DeepSpeed's), ZeRO 0 stays a choice.
    """
    zs = sorted({z for z in zero if z == 0 or dp > 1}) or [0]
    if 1 in zs and 0 in zs and comms.zero1_beats_zero0:
        zs.remove(0)
    if 2 in zs and 3 in zs and comms.zero2_beats_zero3:
        zs.remove(3)
    return [Variant(r, z) for r, z in itertools.product(recompute, zs)]


@dataclass(frozen=True)
class VariantCost:
    """A stage under a variant, per micro-batch and device (arrays or floats): forward+backward,
    its forward part, gradient synchronisation per iteration, static memory, activations kept
    per micro-batch in flight, workspace during a backward, the gradient all-reduce's flat copy
    after the last backward (module doc), and ``gather``: the part of ``time`` that is ZeRO-3's
    collectives in each micro-batch's forward and backward (recomputation's forward gathers nothing more)."""

    time: Any
    fwd: Any
    sync: Any
    static: Any
    act: Any
    workspace: Any
    transient: Any = 0.0
    gather: Any = 0.0


def variant_cost(agg: Mapping[str, Any], in_bytes: Any, variant: Variant, microbatches: int,
                 sync_const: float, comms: ZeroComms = PAPER, blockwise: bool = False) -> VariantCost:
    """The stage's costs under ``variant`` from its aggregates (planner.costmodel.layers.KEYS), with the
    ZeRO collectives run as ``comms`` says, and full recomputation per layer where ``blockwise`` (module
    doc)."""
    time, fwd, whole, gather = _zero_times(agg, variant.zero, microbatches, sync_const, comms)
    whole = whole + _copied(agg, variant.zero, comms) * comms.copy_s_per_byte  # the flat copy's passes
    if variant.recompute == "full":  # the forward redone in each backward, on weights that backward gathered:
        # FSDP unshards a unit in its pre-backward hook, before its recomputation (two gathers a unit a micro-batch
        # with torch 2.13's FSDP2, a region per layer or one for the stage: tests/test_export_sharding.py)
        time, (act, work) = time + agg["fwd"] - agg["fwd_head"], _checkpointed(agg, in_bytes, blockwise)
    elif variant.recompute == "selective":
        time, act, work = time + agg["core"], agg["act_sel"], 0.0 * in_bytes
    else:
        act, work = agg["act"], 0.0 * in_bytes
    loss = agg["loss_gathered"] if comms.gathered_loss else agg["loss_ws"]
    work = (np.maximum(work, loss) + _gathered(agg, variant.zero, comms)  # the loss runs before any
            + _accumulating(agg, variant.zero, microbatches, comms))
    return VariantCost(time, fwd, whole, _static(agg, variant.zero, comms), act, work,
                       _copy(agg, variant.zero, comms), gather)


def _zero_times(agg: Mapping[str, Any], zero: int, microbatches: int, sync_const: float, comms: ZeroComms
                ) -> tuple[Any, Any, Any, Any]:
    """Under ZeRO stage ``zero`` (module doc): forward + backward per micro-batch, its forward, the
    synchronisation per iteration, and the part of the first that is ZeRO-3's (or 2's) collectives. The
    gradients move as the engine reduces them (``copy_scale`` times the weights' bytes under the stages of
    ``wide_reduce_zero``: fp32 gradients of 16-bit weights, twice the bytes); the weights' gathers at the
    weights' precision (torch's ZeRO-1 broadcast of its fp32 parameters as wide as its gradients)."""
    sync = agg["sync"]
    wide = comms.gradient_scale(zero)
    latency = np.where(sync > 0, sync_const, 0.0)
    whole = sync * wide + latency  # the gradients' all-reduce
    half = (sync * comms.shard_scale + latency) / 2.0  # one all-gather of the (trainable) weights
    ghalf = (sync * wide * comms.shard_scale + latency) / 2.0  # one reduce-scatter of the gradients
    # ZeRO-3 gathers every weight, frozen ones too (equal to ``half`` where all train)
    whalf = (agg["wsync"] * comms.shard_scale + np.where(agg["wsync"] > 0, sync_const, 0.0)) / 2.0
    op, units, pre = agg["units"] * comms.unit_op_s, agg["units"], comms.prefetch  # op: every unit's collective once
    time, fwd = agg["time"], agg["fwd"]
    bwd = time - fwd
    if zero == 3 and comms.sync_last_backward:  # gathered in each backward; the first forward's and the reduce per step
        g = _exposed(whalf, bwd, units, pre) + op
        return time + g, fwd, (whalf + op) + (ghalf + op), g
    if zero == 3:  # gathered in each forward and backward, reduced in each backward (beside it where prefetched)
        gf = _exposed(whalf, fwd, units, pre) + op
        gb = _exposed(whalf + ghalf, bwd, units, pre) + 2.0 * op if pre else whalf + op
        return time + gf + gb, fwd + gf, 0.0 * sync if pre else microbatches * (ghalf + op), gf + gb
    if zero == 2 and pre and not comms.sync_last_backward:  # reduce-scattered beside each backward
        g = _exposed(ghalf, bwd, units, pre) + op
        return time + g, fwd, half + op, g
    if zero == 2:  # the weights gathered once, the gradients reduce-scattered once or in every backward
        reduces = 1 if comms.sync_last_backward else microbatches
        return time, fwd, (half + op) + reduces * (ghalf + op), 0.0 * sync
    if zero == 1:  # all-reduced and then gathered beyond the paper (torch's), else reduce-scattered and gathered
        reduced = whole if comms.gather_share else ghalf + half
        whole = reduced + comms.gather_share * 2.0 * ghalf + (2.0 * op if comms.zero1_unit_ops else 0.0)
    return time, fwd, whole, 0.0 * sync


def _gathered(agg: Mapping[str, Any], zero: int, comms: ZeroComms) -> Any:
    """ZeRO-3's working copies during a backward (module doc), where each micro-batch gathers and reduces: the
    unit computing and the one prefetched, gathered (``2 U``, ``U`` the largest unit's weights), and the
    computing unit's whole gradient until its reduce-scatter (``U``, or ``copy_scale U`` where the engine
    reduces fp32 gradients of 16-bit weights); none where the engine keeps every weight gathered and every
    gradient unreduced through the step (already in its static bytes) or below ZeRO-3."""
    if zero != 3 or comms.sync_last_backward:
        return 0.0 * agg["unit_max"]
    wide = comms.gradient_scale(zero)
    return agg["unit_max"] * (2.0 + wide * (agg["grad"] > 0))


def _accumulating(agg: Mapping[str, Any], zero: int, microbatches: int, comms: ZeroComms) -> Any:
    """A layer's new weight gradient beside the one kept while autograd adds it in (module doc): the largest
    layer's weights' bytes, where the engine accumulates, the stage has gradients and there is more than one
    micro-batch; none under a ZeRO-3 that reduces every micro-batch (:func:`_gathered` holds that gradient)."""
    if not comms.accumulates or microbatches < 2 or (zero == 3 and not comms.sync_last_backward):
        return 0.0 * agg["unit_max"]
    return agg["unit_max"] * (agg["grad"] > 0)


def _exposed(comm: Any, compute: Any, units: Any, prefetch: bool) -> Any:
    """What ``comm`` seconds of ZeRO collectives over a stage's ``units`` add to ``compute`` seconds of its
    forward or backward: all of them, or where they are prefetched beside the compute (FSDP's all-gather of
    the next unit during this unit's compute, its reduce-scatter during the next one's: Zhao et al., "PyTorch
    FSDP", VLDB 2023, backward and forward prefetching) what the compute cannot hide, and at least one unit's
    share, which waits with nothing beside it: ``max(comm - compute, comm / units)``."""
    if not prefetch:
        return comm
    return np.maximum(comm - compute, comm / np.maximum(units, 1.0))


def _checkpointed(agg: Mapping[str, Any], in_bytes: Any, blockwise: bool) -> tuple[Any, Any]:
    """Full recomputation's activations kept per micro-batch and its workspace during a backward (module
    doc): per layer, every redone layer's input and the largest redone layer's activations; as one region,
    the stage's input and all the redone layers' activations. The layers after the last block keep theirs."""
    if blockwise:
        return agg["ckpt"] + agg["act_head"], agg["work_max"]
    return in_bytes + agg["act_head"], agg["act"] - agg["act_head"]


def _partition(agg: Mapping[str, Any]) -> Any:
    """``W / d``, the trainable weights' partition per device (all the weights where none is frozen): ZeRO-1
    and 2 differ by the gradients, ``G - G / d`` at the weights' precision (planner.costmodel.layers)."""
    return agg["grad"] - (agg["static1"] - agg["static2"])


def _copied(agg: Mapping[str, Any], zero: int, comms: ZeroComms) -> Any:
    """The gradients' bytes a step's flat-buffer all-reduce copies (all of them, a bucket at a time), where the
    engine copies under ``zero`` (:func:`_copy`'s bucket), counted in :data:`GRAD_COPY_PASSES` passes (fewer
    where a group of one copies alone: :data:`planner.grad_buffers.ALONE_COPY_PASSES`)."""
    if zero not in comms.copy_zero or comms.copy_held or not comms.copy_s_per_byte:
        return 0.0
    alone = ALONE_COPY_PASSES / GRAD_COPY_PASSES if comms.copy_alone else 0.0  # nothing scaled by a group of one
    return agg["grad"] * comms.copy_scale * np.where(agg["sync"] > 0, 1.0, alone)


def _copy(agg: Mapping[str, Any], zero: int, comms: ZeroComms) -> Any:
    """What the stage holds for a while after its last backward, where it synchronises (or where the engine
    copies alone, ``copy_alone``): the larger of the
    gradient all-reduce's flat copy, ``min(G, cap)`` (unless held for good: :func:`_held`), and ZeRO-1's
    fp32 gradient partition for the optimizer step (module doc)."""
    bucket = zero in comms.copy_zero and not comms.copy_held
    partition = zero == 1 and comms.zero1_grad_share > 0
    if not (bucket or partition):
        return 0.0
    copy = np.minimum(agg["grad"] * comms.copy_scale, comms.copy_cap_bytes) if bucket else 0.0
    part = comms.zero1_grad_share * _partition(agg) if partition else 0.0
    return np.where((agg["sync"] > 0) | (bucket and comms.copy_alone), np.maximum(copy, part), 0.0)


def _held(agg: Mapping[str, Any], zero: int, comms: ZeroComms) -> Any:
    """What the engine holds with the model beyond the paper's bytes under ZeRO stage ``zero`` (module
    doc): a 16-bit copy of the weights it computes with; DDP's buckets, a copy of every gradient where the
    stage synchronises; ZeRO-1's reduction buffers and fp32 master partition."""
    held: Any = agg["weight"] if zero in comms.compute_copy_zero else 0.0
    if zero in comms.copy_zero and comms.copy_held:
        held = held + np.where(agg["sync"] > 0, agg["grad"] * comms.copy_scale, 0.0)
    if zero == 1 and comms.zero1_holds_more:
        held = held + np.where(agg["grad"] > 0, comms.zero1_buffer_bytes, 0.0) \
            + comms.zero1_master_share * _partition(agg)
    return held


def _static(agg: Mapping[str, Any], zero: int, comms: ZeroComms) -> Any:
    """Weights, gradients and optimizer state per device under ZeRO stage ``zero``: the table's
    ``static<z>``, but for an engine that keeps FSDP's weights gathered and its gradients unreduced
    through the step (``sync_last_backward``), whose ZeRO-2 and 3 hold ZeRO-1's memory and the
    sharded copy of the weights besides (``2 W + (W + S) / d`` = ``W + static2``; module doc); plus what
    the engine holds besides (:func:`_held`)."""
    if zero >= 2 and comms.sync_last_backward:
        return agg["weight"] + agg["static2"] + _held(agg, zero, comms)
    return agg[f"static{zero}"] + _held(agg, zero, comms)

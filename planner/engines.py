"""What each engine runs, as values (pure): :class:`EngineLimits` per engine (:data:`ENGINES`) and the form rules
(:class:`FormRules`) that say which layers take which tensor-parallel forms under it.

The checks that read these (a plan's batch shapes, grids and an engine's limits) live in
:mod:`planner.runnable`; the cost model reads the engines' memory and collective habits
(:mod:`planner.costmodel.engine`); the search its forms (:mod:`planner.search.options`).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner import ir
from planner.grad_buffers import DEEPSPEED_ALLREDUCE_PARAMS, GRAD_BUCKET_BYTES, NO_COPY, GradCopy


@dataclass(frozen=True)
class FormRules:
    """Which layers may take which forms under an engine, beyond the cost model's own rules (a tensor group
    splits a layer's weight or runs Megatron's block): ``blocks_tp``, in a tensor group every transformer block
    in the ``tp`` form (an engine that shards every block, torchtitan); ``split_types``, the layer types a split
    form may shard (None: any whose weight shape is known; the torch export shards one ``nn.Linear`` or
    ``nn.Embedding``);
    ``split_tied``, whether a split form may shard a layer that shares a parameter with another (a tie): the
    torch export's tensor parallelism replaces the sharded layer's weight with a new distributed one, which no
    longer is the parameter its other layers train, so it shards none."""

    blocks_tp: bool = False
    split_types: tuple[str, ...] | None = None
    split_tied: bool = True
    split_batch_stats: bool = True
    """Whether the dp form in a tensor group may split the samples of a layer that takes statistics over them
    (``LayerProfile.batch_stats``): an engine's DTensor split runs such a batch norm on each rank's share."""
    even_splits: bool = False
    """Whether a split form needs the features it shards to be a multiple of the tensor group
    (:meth:`planner.ir.LayerProfile.splits_evenly`): the torch export's DTensor styles fail on uneven shards (a
    column-parallel layer's uneven output, read by a row-parallel one, is taken for an even shard: the matmul's
    shapes disagree), where Megatron-LM pads such a vocabulary to a multiple of ``128 x tp`` rows."""
    vocab_parallel: bool = False
    """Whether, in a tensor group, the model's embedding shards its vocabulary (``split_in``) and its head its
    outputs (``split_out``) whatever they cost: torchtitan's Llama plan (``RowwiseParallel`` on ``tok_embeddings``,
    ``ColwiseParallel`` on ``output`` with ``loss_parallel``) has no other form for them."""

    def shards_sequence(self, forms: tuple[str, ...], tp: int) -> bool:
        """Whether a stage of ``forms`` on ``tp`` GPUs has a block for sequence parallelism to shard: one in the
        ``tp`` form, or every block where the engine shards them all (:attr:`blocks_tp`)."""
        return "tp" in forms or (self.blocks_tp and tp > 1)

    def pinned(self, profile: ir.ModelProfile) -> dict[int, str]:
        """Layer -> the one form it takes in a tensor group (:attr:`vocab_parallel`): a first layer that is an
        ``Embedding`` ``split_in``, a last layer after the last block ``split_out``, each where its weight's shape is
        known (a split form needs it; a layer without runs dp as before); empty otherwise."""
        layers = profile.layers
        if not self.vocab_parallel or len(layers) < 2:
            return {}
        first, last = layers[0], layers[-1]
        out = {0: "split_in"} if first.type == "Embedding" and first.splittable else {}
        if last.block is None and last.param_count > 0 and last.splittable:
            out[len(layers) - 1] = "split_out"
        return out

    def splits_samples(self, layer: ir.LayerProfile) -> bool:
        """Whether the dp form in a tensor group may split ``layer``'s samples over the group."""
        return self.split_batch_stats or not layer.batch_stats

    def splits(self, layer: ir.LayerProfile, tied: bool = False) -> bool:
        """Whether a split form may shard ``layer`` (a layer without weights runs on split activations);
        ``tied``: the layer uses a parameter another layer uses too (``ModelProfile.ties``)."""
        if tied and not self.split_tied:
            return False
        return self.split_types is None or layer.param_count == 0 or layer.type in self.split_types

    def splits_evenly(self, layer: ir.LayerProfile, form: str, tp: int) -> bool:
        """Whether a tensor group of ``tp`` may run ``form`` on ``layer`` as far as its width goes
        (:attr:`even_splits`); a layer whose profile has no weight shape is the export's to check, on the model."""
        return not self.even_splits or not layer.splittable or layer.splits_evenly(form, tp)

    def uneven_split(self, layer: ir.LayerProfile, form: str, tp: int, engine: str) -> str | None:
        """Why ``engine`` cannot run ``form`` on ``layer`` over ``tp`` as far as its width goes, or None."""
        if self.splits_evenly(layer, form, tp):
            return None
        side, n = ("output", layer.out_features) if form == "split_out" else ("input", layer.in_features)
        return (f"runs the {form} form, which shards its {n} {side} features over tp {tp}; {engine} shards only a "
                f"multiple of tp (equal shards): run it dp, or use a tp that divides {n}")

    def shards(self, layer: ir.LayerProfile, tied: bool = False) -> bool:
        """Whether ``layer`` has a form in a tensor group besides dp: a block's tp form, or a split form (no weights,
        or a known weight shape this engine shards), as planner.costmodel.layers opens them."""
        return layer.block is not None or layer.param_count == 0 or (layer.splittable and self.splits(layer, tied))


def tied_layers(profile: ir.ModelProfile) -> frozenset[int]:
    """The layers that use a parameter some other layer uses too (a tie's every layer)."""
    return frozenset(layer for tie in profile.ties for layer in tie.layers)


ANY_FORMS = FormRules()
"""No engine's limits: every form the cost model allows."""


@dataclass(frozen=True)
class EngineLimits:
    """What one engine runs besides its schedules (each schedule kind says which engines run it,
    planner.schedule): whether stages may differ in width or tensor degree, tensor-parallel and
    split forms, ZeRO stages and recomputation modes."""

    name: str
    uniform_stages: bool
    tensor_parallel: bool
    zero: tuple[int, ...]
    recompute: tuple[str, ...]
    virtual_stages: bool
    uniform_zero: bool = True
    precisions: tuple[str, ...] = ("fp32", "bf16", "fp16")
    zero1_gather_share: float = 0.0
    """What its ZeRO-1 communicates beyond the gradient all-reduce, as a share of it (0: the
    paper's reduce-scatter + all-gather; planner.costmodel.variant)."""
    wide_reduce_zero: tuple[int, ...] = ()
    """The ZeRO stages under which a 16-bit plan's gradients are reduced in fp32, twice the weights' bytes
    (planner.costmodel.variant), as are the parameters torch's ZeRO-1 broadcasts: DeepSpeed's ZeRO-0 (its
    bf16 optimizer accumulates and all-reduces fp32 gradients; its ZeRO-1 reduces the bf16 ones), every
    stage of the torch export (fp32 parameters computed in bf16 casts; FSDP's ``reduce_dtype=float32``)
    and of torchtitan's (``mixed_precision_reduce = "float32"``)."""
    sync_last_backward_stages: int | None = None
    """From how many pipeline stages its schedule reduce-scatters ZeRO-2/3 gradients once a step after the last
    backward, the weights kept gathered: torch's always (1), torchtitan's with a pipeline (2), never (None)."""
    grad_copy: GradCopy = NO_COPY
    """The flat copies its ZeRO-0/1 gradient all-reduce makes (:class:`GradCopy`)."""
    zero1_per_unit: bool = False
    """Whether its ZeRO-1 pays each layer's unit cost (``per_shard_s``) twice a step, reducing and gathering
    parameter by parameter (DeepSpeed, stage_1_and_2.py)."""
    zero1_buffers: int = 0
    """How many fp32 buffers of :func:`deepspeed_bucket_params` elements its ZeRO-1 holds through the
    step's backward (DeepSpeed: 2; planner.costmodel.variant)."""
    zero1_partition_copies: bool = False
    """Whether its ZeRO-1 keeps an fp32 copy of its partition of the weights even when they are fp32, and flattens
    its partition's gradients into a new fp32 tensor for the step (DeepSpeed, stage_1_and_2.py:
    ``single_partition_of_fp32_groups``, ``single_grad_partition``; planner.costmodel.variant)."""
    llama_only: bool = False
    """Whether it trains only its own Llama-family definition (one embedding, gated-MLP blocks, one norm + head:
    :func:`llama_problem`), sharding every block of a tensor group in the ``tp`` form (torchtitan)."""
    uniform_recompute: bool = False
    """Whether one recomputation mode runs for the whole job (torchtitan's ``activation_checkpoint.mode``)."""
    split_types: tuple[str, ...] | None = None
    """The layer types its split forms shard; ``split_tied``: whether they shard a tied layer (:class:`FormRules`)."""
    split_tied: bool = True
    even_splits: bool = False
    """Whether its split forms need the sharded features a multiple of the tensor group (:class:`FormRules`)."""
    compute_copy_zero: tuple[int, ...] = ()
    """The ZeRO stages under which, in 16 bits, it holds a 16-bit copy of the weights beside its fp32 ones (the torch
    export's ``Bf16Compute`` under ZeRO-0/1, planner.export.sharding; FSDP gathers a unit at a time under 2/3)."""
    gathers_logits: bool = False
    """Whether its split head gathers the logits whole on every tensor rank before the loss (the torch export's
    ``ColwiseParallel(output_layouts=Replicate())``; torchtitan's ``loss_parallel`` keeps them sharded)."""
    split_backward_recompute: tuple[str, ...] = ("none", "selective", "full")
    """The recomputation modes it runs under a schedule that splits the backward into B and W (zb-h1): torch's
    ``ScheduleInterleavedZeroBubble`` backwards twice through a stage, which a selective-checkpoint region refuses
    ("only allowed to backward once on any region computed under selective activation checkpoint")."""
    split_backward_zero: tuple[int, ...] = (0, 1, 2, 3)
    """The ZeRO stages it runs under such a schedule: torch's zb-h1 under FSDP with ``reshard_after_forward``
    (ZeRO-3) trained other weights than one process (losses 1e-4 apart after a step: GPT-2, an MLP), so is refused;
    torchtitan runs the same schedule over the same FSDP, refused there too."""
    zero1_whole_tensors: bool = False
    """Whether its ZeRO-1 gives each rank whole parameter tensors, largest first to the rank holding fewest elements
    (torch's ``ZeroRedundancyOptimizer._partition_parameters``), so that shares are uneven; else each rank an even
    slice of the flattened parameters (DeepSpeed's stage_1_and_2.py)."""
    frozen_stage_fp32_only: bool = False
    """Whether a stage with no trainable weight runs only in fp32 without ZeRO (DeepSpeed's ZeRO and bf16/fp16
    optimizers read their first parameter: stage_1_and_2.py, bf16_optimizer.py)."""
    sequence_divisor: int = 1
    """What, times a job's tensor degree, must divide every block's sequence (beyond sequence parallelism's own need,
    :meth:`planner.ir.ModelProfile.splits_sequence`): torchtitan 0.2.0's ``parallelize_llama`` asserts
    ``seq_len % (tp * 2 * cp) == 0`` (``ParallelDims.seq_len_divisor``) at every tensor degree, 1 included, so 2."""
    optimizers: tuple[str, ...] = ir.OPTIMIZERS
    """The plan optimizers it builds (torchtitan: Adam and AdamW only, torchtitan/components/optimizer.py; an sgd
    plan would train with AdamW's two fp32 states per weight, which its memory did not count)."""

    def sequence_problem(self, profile: ir.ModelProfile, tp: int) -> str | None:
        """Why a tensor degree of ``tp`` cannot run ``profile``'s sequence under :attr:`sequence_divisor`, or None."""
        step = tp * self.sequence_divisor
        seq = profile.uneven_sequence(step) if self.sequence_divisor > 1 else None
        if seq is None:
            return None
        smaller = ", or a smaller tensor degree" if tp > 1 else ""
        return (f"{self.name} asserts a sequence that is a multiple of {self.sequence_divisor} x tp, and {seq} tokens "
                f"are not a multiple of {step} (tp {tp}): use a sequence length of a multiple of {step}{smaller}")

    def largest_tp(self, profile: ir.ModelProfile) -> int | None:
        """The largest power-of-two tensor degree :meth:`sequence_problem` admits (0: none, not even 1), None: any."""
        if self.sequence_divisor == 1:
            return None
        tp = 1
        while self.sequence_problem(profile, tp) is None and tp <= 1 << 20:
            tp *= 2
        return tp // 2

    def zero_stages(self, split_backward: bool = False) -> tuple[int, ...]:
        """The ZeRO stages it runs; under a schedule that splits the backward (zb-h1), those it runs there."""
        return tuple(z for z in self.zero if not split_backward or z in self.split_backward_zero)

    def recompute_modes(self, split_backward: bool = False) -> tuple[str, ...]:
        """The recomputation modes it runs; under a schedule that splits the backward, those it runs there."""
        return tuple(r for r in self.recompute if not split_backward or r in self.split_backward_recompute)

    @property
    def form_rules(self) -> FormRules:
        return FormRules(blocks_tp=self.llama_only, vocab_parallel=self.llama_only, split_types=self.split_types,
                         split_tied=self.split_tied, split_batch_stats=False, even_splits=self.even_splits)

    def syncs_last_backward(self, pipelined: bool) -> bool:
        """Whether a plan of two or more stages (``pipelined``), or of one, reduces once a step."""
        first = self.sync_last_backward_stages
        return first is not None and (pipelined or first <= 1)

    @property
    def sync_depends_on_stages(self) -> bool:
        """Whether a plan of one stage runs its ZeRO otherwise than a pipeline's (torchtitan)."""
        return self.syncs_last_backward(True) != self.syncs_last_backward(False)


CALIBRATED = ("deepspeed", "torch")
"""The engines whose overheads ``planner calibrate --engines`` measures (it trains with them here)."""

ENGINES: dict[str, EngineLimits] = {
    # DeepSpeed's PipelineEngine: 1F1B on a pipe x data grid of equal widths; ZeRO-1 at most with
    # pipeline parallelism (deepspeed/runtime/pipe/engine.py asserts zero stage < 2); layer-interval
    # activation checkpointing only.
    # Its ZeRO-0 all-reduce flattens up to 5e8 gradient elements at a time; its ZeRO-1 holds two fp32
    # buffers of reduce_bucket_size elements (stage_1_and_2.py; DEEPSPEED_ZERO1_BUCKET_PARAMS).
    "deepspeed": EngineLimits("deepspeed", True, False, (0, 1), ("none", "full"), False,
                              grad_copy=GradCopy((0,), cap_params=DEEPSPEED_ALLREDUCE_PARAMS, alone=True),
                              zero1_buffers=2, zero1_per_unit=True, zero1_partition_copies=True,
                              frozen_stage_fp32_only=True,
                              wide_reduce_zero=(0,)),
    # torch.distributed.pipelining on a (pp, dp, tp) DeviceMesh: one mesh, so equal grids per stage; FSDP2
    # covers ZeRO 2-3 (reshard after forward or not), DTensor the tensor forms; ZeRO-1 is the gradients'
    # all-reduce and ZeroRedundancyOptimizer, which broadcasts every parameter from the rank that stepped it
    # (torch/distributed/optim/zero_redundancy_optimizer.py, _sync_params): an all-gather's volume, half an
    # all-reduce's, beyond the paper's ZeRO-1. Its schedules defer an FSDP module's reduce-scatter and
    # resharding to after the step's last backward (torch/distributed/pipelining/stage.py).
    "torch": EngineLimits("torch", True, True, (0, 1, 2, 3), ("none", "selective", "full"), True,
                          uniform_zero=False, precisions=("fp32", "bf16"),  # no loss scale in the schedule's loss
                          zero1_gather_share=0.5, sync_last_backward_stages=1,
                          grad_copy=GradCopy((0, 1), cap_bytes=GRAD_BUCKET_BYTES), split_types=("Linear", "Embedding"),
                          gathers_logits=True, split_tied=False, even_splits=True, zero1_whole_tensors=True,
                          compute_copy_zero=(0, 1), wide_reduce_zero=(0, 1, 2, 3),
                          split_backward_recompute=("none", "full"), split_backward_zero=(0, 1, 2)),
    # torchtitan: FSDP2 (shard = ZeRO-3, or never reshard = ZeRO-2) or replicate (0), tensor and
    # pipeline degrees, per-job activation checkpointing: none or full (its selective modes are
    # per-op SAC or every n-th layer, not the attention core; planner.export.torchtitan). Without a
    # pipeline its FSDP runs as the paper's ZeRO; with one (K > 1) it runs torch's schedules, which
    # reduce once a step and keep the weights gathered (sync_last_backward_stages). Its ZeRO-0 is
    # replicate (DDP, bucket_cap_mb=100, torchtitan's apply_ddp), whose buckets hold a second copy of
    # every gradient for the model's life (GradCopy.held); under bf16 it trains fp32 parameters in
    # autocast, so those gradients are fp32.
    "torchtitan": EngineLimits("torchtitan", True, True, (0, 2, 3), ("none", "full"), True,
                               precisions=("fp32", "bf16"), sync_last_backward_stages=2, optimizers=("adam",),
                               grad_copy=GradCopy((0,), held=True), llama_only=True, uniform_recompute=True,
                               sequence_divisor=2,
                               wide_reduce_zero=(0, 2, 3), split_backward_zero=(0, 2)),  # torch's zb-h1 (not run here)
}


def run_engine(plan: ir.Plan) -> str:
    """The engine ``planner run`` trains ``plan`` with when none is named: the one it was searched for (torch for
    torchtitan's, whose FSDP and pipelining are torch's own); for a plan of engine any, deepspeed where it runs the
    plan, else torch where it does (ZeRO-2/3, tensor parallelism, a schedule but 1F1B: plans search emits without
    --engine)."""
    from planner.runnable import is_runnable  # runnable imports this module's limits

    if plan.engine in ("torch", "torchtitan"):
        return "torch"
    if plan.engine == "any" and not is_runnable(plan, "deepspeed") and is_runnable(plan, "torch"):
        return "torch"
    return "deepspeed"

"""ZeRO, activation recomputation and mixed precision of one torch pipeline stage.

* ZeRO over the stage's data-parallel group (Rajbhandari et al. SC'20), per the plan's ``zero``:
  3: FSDP2 ``fully_shard`` with ``reshard_after_forward=True`` (parameters, gradients and
  optimizer state sharded; parameters all-gathered in forward and again in backward);
  2: ``fully_shard`` with ``reshard_after_forward=False`` (parameters stay gathered from forward
  to backward, gradients reduce-scattered, optimizer state sharded; FSDP2 reshards the
  parameters after backward, so between steps they are sharded as well: ZeRO-2's traffic,
  slightly less memory than ZeRO-2); 1: ``torch.distributed.optim.ZeroRedundancyOptimizer``
  (optimizer state sharded, gradients all-reduced and averaged as in data parallelism, each
  rank steps its share of the parameters and broadcasts them). Each layer of the stage is one
  FSDP unit (a layer sharing a parameter with another layer of the stage stays in the stage's
  root unit), the stage is the root.
* Recomputation (``recompute``): ``full`` checkpoints the stage's layers up to the model's last
  transformer block, each layer on its own in a model with blocks (each layer's input is kept and
  one layer is redone at a time: Megatron-LM's and torchtitan's full recomputation), else as one
  region (only each micro-batch's stage input is kept; GPipe's re-materialisation;
  ``ModelProfile.blockwise_recompute``, as the cost model counts it); the layers after it (final
  norm, logits head) are not checkpointed and keep their activations
  (``ModelProfile.recomputed_layers``; Megatron-LM and torchtitan checkpoint the transformer
  layers only); ``selective`` checkpoints each layer with a
  selective-checkpoint policy that recomputes only the attention core (every
  ``scaled_dot_product`` op; Korthikanti et al. 2022) and saves every other activation.
* Precision: ``bf16`` computes each stage's forward in bf16 (:class:`Bf16Compute`): every module
  runs with its own parameters cast to bf16, and a floating-point stage input is cast on entry,
  so activations, the residual stream and norms are bf16, as in the bf16 profile the plan was
  made from, and as torchtitan (FSDP2's ``param_dtype``), Megatron-LM and DeepSpeed's bf16 run a
  model; the parameters stay fp32 (the optimizer's master weights, with fp32 gradients and state),
  and the loss takes the fp32 logits (planner.export.losses). Under ZeRO-2 and 3 FSDP's own mixed
  precision does it instead (:func:`fully_shard_stage`): bf16 all-gathers of the fp32 shards.
  It replaced ``torch.autocast``, which kept an fp32 residual stream and fp32 norm inputs: on an
  H200 its steps took 10-25% longer and held GPT-2's peak 25% over the prediction from the bf16
  profile (docs/fidelity.md). The same rounding for every ZeRO stage (a bf16 grid under FSDP's mixed
  precision trained to the same losses as under :class:`Bf16Compute`), so that grids differ only in
  where the numbers live.
  ``fp16`` is refused by the torch export (it needs a dynamic loss scale that the pipelining
  schedule's loss function does not carry).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any

import torch
from torch import nn

from planner.export.optim import fused_adam_runs, torch_optimizer
from planner.grad_buffers import GRAD_BUCKET_BYTES

ATTENTION_CORE = "scaled_dot_product"
"""Ops whose name contains this are the attention core that selective recomputation redoes."""


def local(t: torch.Tensor) -> torch.Tensor:
    """The local tensor of a DTensor (FSDP shard or tensor-parallel shard), else the tensor itself."""
    from torch.distributed.tensor import DTensor

    data = t.data if isinstance(t, nn.Parameter) else t
    return data.to_local() if isinstance(data, DTensor) else data


def _attention_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    from torch.utils.checkpoint import CheckpointPolicy

    if ATTENTION_CORE in str(op):
        return CheckpointPolicy.PREFER_RECOMPUTE
    return CheckpointPolicy.MUST_SAVE


class Checkpointed(nn.Module):  # type: ignore[misc]
    """``inner`` under activation checkpointing: ``full`` keeps only the input, ``selective`` the
    input and every activation but the attention core's."""

    def __init__(self, inner: nn.Module, mode: str) -> None:
        super().__init__()
        self.inner = inner
        self.mode = mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

        if self.mode == "selective":
            ctx = partial(create_selective_checkpoint_contexts, _attention_policy)
            return checkpoint(self.inner, x, use_reentrant=False, context_fn=ctx)
        return checkpoint(self.inner, x, use_reentrant=False)


class Bf16Compute(nn.Module):  # type: ignore[misc]
    """``inner`` computed in ``dtype`` over fp32 parameters (module docstring, Precision): each module that has
    parameters of its own runs its forward with them cast to ``dtype`` (:func:`_cast_own_parameters`), and a
    floating-point input is cast on entry, so the whole forward, residual stream and norms included, runs in
    ``dtype``; the parameters stay fp32, the optimizer's master weights, and their gradients reach them in fp32
    through the casts.

    Within a step (:func:`casts_per_step`) each parameter is cast once and its copy shared by the step's
    micro-batches: one ``dtype`` copy of the weights for the step, the cost model's weight bytes, where a cast per
    micro-batch would hold one per micro-batch in flight until its backward. Outside one, every forward casts.
    The step's copies are made when it opens (:meth:`cast_all`), before any forward: made by the first forward
    inside a selective-checkpoint region, a cast was an op of that forward which the region's recomputation,
    finding the copy, did not replay (torch's CheckpointError, "Recomputed values ... have different metadata")."""

    def __init__(self, inner: nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.inner = inner
        self.dtype = dtype
        self.casts: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None
        cast_running_stats(inner, dtype)
        for module in inner.modules():
            if any(p is not None for p in module._parameters.values()):
                _cast_own_parameters(module, self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x.to(self.dtype) if x.is_floating_point() else x)

    def cast_all(self) -> None:
        """Open a step: every floating-point parameter of ``inner`` cast to ``dtype`` now, for the step to share."""
        self.casts = {}
        for param in self.inner.parameters():
            if param.is_floating_point() and param.dtype != self.dtype:
                self.cast(param)

    def cast(self, param: torch.Tensor) -> torch.Tensor:
        """``param`` in ``dtype``: this step's copy where a step is open (keyed by the parameter itself, which the
        entry holds, so that no other tensor takes its id), else a new one."""
        if self.casts is None:
            return param.to(self.dtype)
        hit = self.casts.get(id(param))
        if hit is None or hit[0] is not param:
            hit = (param, param.to(self.dtype))
            self.casts[id(param)] = hit
        return hit[1]


@contextlib.contextmanager
def casts_per_step(roots: Sequence[nn.Module]) -> Iterator[None]:
    """Inside: the :class:`Bf16Compute` modules under ``roots`` cast each parameter once (for a step's forwards and
    backwards; the optimizer must step after it, when the copies are dropped)."""
    wrappers = [m for root in roots for m in root.modules() if isinstance(m, Bf16Compute)]
    for w in wrappers:
        w.cast_all()
    try:
        yield
    finally:
        for w in wrappers:
            w.casts = None


def _cast_own_parameters(module: nn.Module, owner: Bf16Compute) -> None:
    """Hooks that give ``module``'s forward its own floating-point parameters cast to ``owner.dtype`` and put the
    parameters back after it (even if it raises). They run inside FSDP's: its pre-forward hook (prepended)
    gathers the weights before the cast, and its post-forward hook (appended) reshards them after they are
    put back (this one is prepended); recomputation runs the hooks again."""
    kept: dict[str, torch.Tensor] = {}

    def cast(mod: nn.Module, args: Any) -> None:
        for name, param in list(mod._parameters.items()):
            if param is not None and param.is_floating_point() and param.dtype != owner.dtype:
                kept[name] = param
                mod._parameters[name] = owner.cast(param)

    def restore(mod: nn.Module, args: Any, out: Any) -> None:
        mod._parameters.update(kept)
        kept.clear()

    module.register_forward_pre_hook(cast)
    module.register_forward_hook(restore, prepend=True, always_call=True)


def with_recompute(stage: nn.Sequential, recompute: str, recomputed: int | None = None,
                   per_layer: bool = False) -> nn.Module:
    """The stage with its recomputation: its first ``recomputed`` layers (default all) checkpointed, each
    on its own where ``per_layer`` (``ModelProfile.blockwise_recompute``) or else as one region, and the rest
    as they are (full); each layer (selective); or as is."""
    if recompute == "full":
        k = min(len(stage), len(stage) if recomputed is None else recomputed)
        if per_layer:
            for j in range(k):
                stage[j] = Checkpointed(stage[j], "full")
            return stage
        if k >= len(stage):
            return Checkpointed(stage, "full")
        return nn.Sequential(Checkpointed(stage[:k], "full"), *stage[k:]) if k > 0 else stage
    if recompute == "selective":
        for j, layer in enumerate(stage):
            stage[j] = Checkpointed(layer, "selective")
    return stage


def cast_running_stats(module: nn.Module, dtype: torch.dtype) -> None:
    """The running statistics of ``module``'s batch norms in ``dtype``, the dtype their weights compute in: torch's
    batch norm takes its weights and statistics in one dtype, and the engines cast the weights alone (Bf16Compute,
    FSDP's ``param_dtype``, DeepSpeed's bf16/fp16), which failed ("expected scalar type BFloat16 but found Float").
    In training a batch norm normalises by the batch's own statistics, so the losses do not change."""
    for norm in module.modules():
        if isinstance(norm, nn.modules.batchnorm._NormBase):
            for name in ("running_mean", "running_var"):
                stats = getattr(norm, name)
                if isinstance(stats, torch.Tensor) and stats.is_floating_point():
                    setattr(norm, name, stats.to(dtype))


def with_precision(module: nn.Module, precision: str) -> nn.Module:
    """``module`` computed in bf16 over its fp32 parameters for a ``bf16`` plan (:class:`Bf16Compute`), else as is."""
    return Bf16Compute(module, torch.bfloat16) if precision == "bf16" else module


def _shares_params(layer: nn.Module, others: Sequence[nn.Module]) -> bool:
    mine = {id(p) for p in layer.parameters()}
    return any(id(p) in mine for o in others if o is not layer for p in o.parameters())


COMPUTE_DTYPE = "planner_compute_dtype"
"""The attribute :func:`fully_shard_stage` sets on a stage root whose FSDP units compute in bf16."""


def fully_shard_stage(root: nn.Module, units: Sequence[nn.Module], mesh: Any, zero: int,
                      precision: str = "fp32") -> None:
    """FSDP2 over the data-parallel ``mesh``: one unit per layer, the stage as root (ZeRO 2 or 3).

    ``units`` are the stage's layers as wrapped for recomputation, so that a unit's all-gather
    runs in its own hooks, outside the checkpointed region (as torchtitan orders them). Under ``bf16`` FSDP's
    own mixed precision computes (module docstring, Precision): the fp32 shards are all-gathered as bf16
    weights, the root's float input is cast to bf16, and the gradients are reduce-scattered in fp32
    (``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``, as torchtitan sets it), so a unit's
    bf16 weights live only while it is gathered.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    reshard = zero == 3
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if precision == "bf16"
          else MixedPrecisionPolicy())
    if precision == "bf16":
        cast_running_stats(root, torch.bfloat16)
    for unit in units:
        if not _shares_params(unit, units) and any(True for _ in unit.parameters()):
            fully_shard(unit, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
    fully_shard(root, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
    if precision == "bf16":
        setattr(root, COMPUTE_DTYPE, torch.bfloat16)


def computes_in_bf16(modules: Sequence[nn.Module]) -> bool:
    """Whether any of ``modules`` computes in bf16: a :class:`Bf16Compute`, or a stage root FSDP's mixed precision
    casts (:func:`fully_shard_stage`)."""
    return any(isinstance(m, Bf16Compute) or getattr(m, COMPUTE_DTYPE, None) == torch.bfloat16 for m in modules)


def optimizer(name: str, params: list[nn.Parameter], lr: float, zero: int, group: Any) -> Any:
    """The plan's optimizer; for ZeRO-1 a ZeroRedundancyOptimizer over the data-parallel ``group``.

    ZeRO-1 steps the local tensors of DTensor parameters (views of the same storage; their
    gradients are handed over by :func:`zero1_grads`).
    """
    if zero != 1:
        return torch_optimizer(name, params, lr)
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.distributed.tensor import DTensor

    proto = torch_optimizer(name, [nn.Parameter(torch.zeros(1))], lr, fused=fused_adam_runs(params))
    sharded = [isinstance(p.data, DTensor) for p in params]
    proxies = [nn.Parameter(local(p)) if tp else p for p, tp in zip(params, sharded, strict=True)]
    # parameters as views of one flat buffer per rank: one broadcast per rank a step, not one per
    # parameter (a 2-rank step of a 4-layer MLP: 8 broadcasts, 5 ms); not with tensor-parallel
    # proxies, whose storage must stay their DTensor's local tensor
    opt = ZeroRedundancyOptimizer(proxies, optimizer_class=type(proto), process_group=group,
                                  parameters_as_bucket_view=not any(sharded), **proto.defaults)
    opt.planner_params = list(zip(params, proxies, strict=True))
    return opt


def zero1_grads(opt: Any) -> None:
    """Hand the (already averaged) gradients of DTensor parameters to their ZeRO-1 local proxies, each in its
    parameter's layout: a replicated parameter that computed on a shard of the sequence (a norm under sequence
    parallelism) has a partial gradient, each tensor rank's share, summed over the tensor group here (the plain
    optimizers' DTensor steps sum it themselves)."""
    for param, proxy in getattr(opt, "planner_params", ()):
        if proxy is not param and param.grad is not None:
            grad = param.grad
            if grad.placements != param.data.placements:
                grad = grad.redistribute(grad.device_mesh, param.data.placements)
            proxy.grad = local(grad)


def grad_buckets(grads: Sequence[torch.Tensor], limit_bytes: int = GRAD_BUCKET_BYTES) -> list[list[torch.Tensor]]:
    """Consecutive gradients in buckets of one dtype and device, each at most ``limit_bytes`` (a
    single larger tensor is a bucket of its own). One all-reduce per bucket, as the cost model
    charges (SimOptions.bucket_bytes): one all-reduce per parameter would pay one collective latency
    per tensor (measured on gloo, 2 CPU processes: 8 tensors of a 4-layer MLP took 13 ms a step
    against 1.5 ms predicted)."""
    buckets: list[list[torch.Tensor]] = []
    size = 0
    for g in grads:
        nbytes = g.numel() * g.element_size()
        last = buckets[-1] if buckets else None
        if last is None or (last[0].dtype, last[0].device) != (g.dtype, g.device) or size + nbytes > limit_bytes:
            buckets.append([g])
            size = nbytes
        else:
            last.append(g)
            size += nbytes
    return buckets


def sum_grads(params: Sequence[nn.Parameter], group: Any, divisor: int = 1,
              limit_bytes: int = GRAD_BUCKET_BYTES) -> None:
    """Sum the gradients (their local tensors) over ``group``, then divide by ``divisor``: one
    all-reduce per bucket of flattened gradients (:func:`grad_buckets`, at most ``limit_bytes``),
    copied back in place; a
    bucket of one contiguous gradient is reduced in place, so the flat copy never exceeds
    :data:`planner.grad_buffers.GRAD_BUCKET_BYTES` (the transient the cost model charges,
    :class:`planner.grad_buffers.GradCopy`)."""
    import torch.distributed as dist

    grads = []
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(local(p.grad))
    for bucket in grad_buckets(grads, limit_bytes):
        if len(bucket) == 1 and bucket[0].is_contiguous():
            dist.all_reduce(bucket[0], group=group)
            if divisor != 1:
                bucket[0].div_(divisor)
            continue
        flat = torch.cat([g.reshape(-1) for g in bucket])
        dist.all_reduce(flat, group=group)
        if divisor != 1:
            flat /= divisor
        offset = 0
        for g in bucket:
            g.copy_(flat[offset:offset + g.numel()].view(g.shape))
            offset += g.numel()


def unscaled(schedule_class: Any) -> dict[str, Any]:
    """The keyword that keeps a torch schedule class from dividing the gradients by M itself (``scale_grads``, torch
    2.7 on; earlier classes divide nothing): it divides each stage's parameters as the stage's last backward ends, so a
    weight two of a rank's chunks share (an interleaved plan's tie on one device group) is divided twice, the first
    time before the other chunk's backwards added their part. :func:`mean_over_microbatches` divides once instead."""
    import inspect

    return {"scale_grads": False} if "scale_grads" in inspect.signature(schedule_class).parameters else {}


def mean_over_microbatches(params: Sequence[nn.Parameter], microbatches: int) -> None:
    """Divide each of ``params``' gradients, summed over the step's micro-batches (each its mean loss), by their
    number, once per parameter object (``params`` holds each once): the step's gradient of the mean loss."""
    if microbatches > 1:
        for param in params:
            if param.grad is not None:
                param.grad.div_(microbatches)


def average_grads(params: Sequence[nn.Parameter], group: Any, dp: int) -> None:
    """Average gradients over the ``dp`` data-parallel replicas (ZeRO 0 and 1; FSDP does its own)."""
    sum_grads(params, group, dp)


def zero_stage_of(modules: Sequence[nn.Module], opt: Any) -> int:
    """The ZeRO stage the built modules and optimizer actually run (read back, for the rank checks)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.optim import ZeroRedundancyOptimizer

    if isinstance(opt, ZeroRedundancyOptimizer):
        return 1
    units = [m for root in modules for m in root.modules() if isinstance(m, FSDPModule)]
    if not units:
        return 0
    group = units[-1]._get_fsdp_state()._fsdp_param_group  # the innermost unit that holds parameters
    for m in units:
        g = m._get_fsdp_state()._fsdp_param_group
        if g is not None:
            group = g
    return 3 if group.post_forward_mesh_info is not None else 2

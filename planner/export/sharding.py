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
* Precision: ``bf16`` runs each stage's forward under ``torch.autocast(dtype=bfloat16)``:
  fp32 master weights, gradients and optimizer state, bf16 matrix products (autocast's op
  list; norms and the loss stay fp32). The same for every ZeRO stage, so that grids differ
  only in where the numbers live, not in their rounding. ``fp16`` is refused by the torch
  export (it needs a dynamic loss scale that the pipelining schedule's loss function does not
  carry).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
from torch import nn

from planner.export.optim import on_gpu, torch_optimizer
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


class Autocast(nn.Module):  # type: ignore[misc]
    """``inner``'s forward under ``torch.autocast`` in ``dtype`` (fp32 weights, 16-bit products)."""

    def __init__(self, inner: nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.inner = inner
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=x.device.type, dtype=self.dtype):
            return self.inner(x)


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


def with_precision(module: nn.Module, precision: str) -> nn.Module:
    return Autocast(module, torch.bfloat16) if precision == "bf16" else module


def _shares_params(layer: nn.Module, others: Sequence[nn.Module]) -> bool:
    mine = {id(p) for p in layer.parameters()}
    return any(id(p) in mine for o in others if o is not layer for p in o.parameters())


def fully_shard_stage(root: nn.Module, units: Sequence[nn.Module], mesh: Any, zero: int) -> None:
    """FSDP2 over the data-parallel ``mesh``: one unit per layer, the stage as root (ZeRO 2 or 3).

    ``units`` are the stage's layers as wrapped for recomputation, so that a unit's all-gather
    runs in its own hooks, outside the checkpointed region (as torchtitan orders them).
    """
    from torch.distributed.fsdp import fully_shard

    reshard = zero == 3
    for unit in units:
        if not _shares_params(unit, units) and any(True for _ in unit.parameters()):
            fully_shard(unit, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(root, mesh=mesh, reshard_after_forward=reshard)


def optimizer(name: str, params: list[nn.Parameter], lr: float, zero: int, group: Any) -> Any:
    """The plan's optimizer; for ZeRO-1 a ZeroRedundancyOptimizer over the data-parallel ``group``.

    ZeRO-1 steps the local tensors of DTensor parameters (views of the same storage; their
    gradients are handed over by :func:`zero1_grads`).
    """
    if zero != 1:
        return torch_optimizer(name, params, lr)
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.distributed.tensor import DTensor

    proto = torch_optimizer(name, [nn.Parameter(torch.zeros(1))], lr, fused=on_gpu(params))
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
    """Hand the (already averaged) gradients of DTensor parameters to their ZeRO-1 local proxies."""
    for param, proxy in getattr(opt, "planner_params", ()):
        if proxy is not param and param.grad is not None:
            proxy.grad = local(param.grad)


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

"""Attention as the fused kernels run it, for the analytic profile's saved bytes and FLOPs (torch side).

On the meta device ``F.scaled_dot_product_attention`` takes its math path, which keeps the ``s x s``
attention weights for backward (Korthikanti et al. 2022's ``5 a s^2 b`` bytes per block). The fused
kernels a GPU runs keep only the inputs, the output and one log-sum-exp per row (FlashAttention, Dao
et al. 2022; FlashAttention-2, Dao 2023), as does torch's own CPU kernel
(``aten._scaled_dot_product_flash_attention_for_cpu``), which has meta kernels and FLOP formulas
(:mod:`planner.profiler.flops`). :class:`FusedAttention` routes SDPA on meta tensors to that kernel, so
that an analytic profile keeps what a real run keeps: ``llama-tiny`` at 1,024 tokens saved 43.1 MB per
block through the math path, 9.1 MB measured here. Attention written with matmuls and softmax is not
SDPA and keeps its weights, as it does when it runs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_NAMES = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def fused_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False,
                    scale: float | None = None, enable_gqa: bool = False) -> torch.Tensor:
    """SDPA through the fused CPU kernel (works on meta tensors; it takes grouped-query heads as they are,
    keeping the key and value un-repeated, as the fused kernels do). A boolean mask becomes the additive
    mask SDPA makes of it (and keeps)."""
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros(attn_mask.shape, dtype=query.dtype, device=query.device).masked_fill(
            attn_mask.logical_not(), float("-inf"))
    out, _ = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)
    return out


def ran_fused(out: torch.Tensor) -> bool:
    """Whether SDPA's output came from a fused kernel (its backward keeps no attention weights): flash,
    memory-efficient or cuDNN attention, not the math path (whose last op is a matmul's view)."""
    name = out.grad_fn.name() if out.grad_fn is not None else ""
    return any(kind in name for kind in ("Flash", "Efficient", "Cudnn"))


class FusedAttention(TorchFunctionMode):
    """Routes ``F.scaled_dot_product_attention`` on meta tensors to :func:`fused_attention`; counts the
    calls (``calls``) and those whose backward keeps the attention weights (``saving``: the math path,
    which a real device may still take, e.g. for a mask its fused kernels do not take)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.saving = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is not torch.nn.functional.scaled_dot_product_attention:
            return func(*args, **kwargs)
        given = dict(zip(_NAMES, args, strict=False)) | kwargs
        self.calls += 1
        if given["query"].device.type == "meta":
            return fused_attention(**given)
        out = func(*args, **kwargs)
        self.saving += bool(torch.is_grad_enabled() and not ran_fused(out))
        return out

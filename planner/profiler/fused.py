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

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

_NAMES = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def fused_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False,
                    scale: float | None = None, enable_gqa: bool = False) -> torch.Tensor:
    """SDPA through the fused CPU kernel (works on meta tensors; it takes grouped-query heads as they are,
    keeping the key and value un-repeated, as the fused kernels do). A boolean mask becomes the additive
    mask SDPA makes of it (and keeps). Values of another head size than the queries' (multi-head latent
    attention: DeepSeek's, Youtu's) go through the memory-efficient kernel, the fused one that takes them (the
    flash kernels take one head size; on meta tensors the CPU one answers in the queries' size)."""
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros(attn_mask.shape, dtype=query.dtype, device=query.device).masked_fill(
            attn_mask.logical_not(), float("-inf"))
    if value.shape[-1] != query.shape[-1]:
        return _efficient(query, key, value, attn_mask, dropout_p, is_causal, scale)
    out, _ = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)
    return out


def _efficient(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None,
               dropout_p: float, is_causal: bool, scale: float | None) -> torch.Tensor:
    """SDPA through the memory-efficient kernel (grouped key and value heads repeated, as it needs them)."""
    if key.shape[-3] != query.shape[-3]:
        groups = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(groups, -3), value.repeat_interleave(groups, -3)
    out = torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, attn_mask, torch.is_grad_enabled(), dropout_p, is_causal, scale=scale)[0]
    return out  # type: ignore[no-any-return]


def ran_fused(out: torch.Tensor) -> bool:
    """Whether SDPA's output came from a fused kernel (its backward keeps no attention weights): flash,
    memory-efficient or cuDNN attention, not the math path (whose last op is a matmul's view)."""
    name = out.grad_fn.name() if out.grad_fn is not None else ""
    return any(kind in name for kind in ("Flash", "Efficient", "Cudnn"))


_SDPA = F.scaled_dot_product_attention
"""torch's own SDPA (``torch._C._nn.scaled_dot_product_attention``)."""


class AttentionMode(TorchFunctionMode):
    """A mode that hands every ``F.scaled_dot_product_attention`` call to :meth:`route`: those the model makes,
    which the mode sees, and those made inside another torch function, which runs with the mode off
    (``F.multi_head_attention_forward``, which ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer`` run,
    looks SDPA up in ``torch.nn.functional``: while the mode is on, that name is the mode's)."""

    def __init__(self) -> None:
        super().__init__()
        self._previous: Callable[..., Any] = _SDPA
        self._busy = False

    def route(self, given: dict[str, Any], sdpa: Callable[..., Any]) -> Any:
        """One SDPA call's result; ``given``: its arguments by name; ``sdpa``: torch's, to run it as it is."""
        return sdpa(**given)

    def __enter__(self) -> AttentionMode:
        self._previous = F.scaled_dot_product_attention
        setattr(F, "scaled_dot_product_attention", self._sdpa)  # noqa: B010
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        setattr(F, "scaled_dot_product_attention", self._previous)  # noqa: B010
        super().__exit__(*exc)

    def _sdpa(self, *args: Any, **kwargs: Any) -> Any:
        if self._busy:  # route's own call of torch's SDPA
            return self._previous(*args, **kwargs)
        self._busy = True
        try:
            return self.route(dict(zip(_NAMES, args, strict=False)) | kwargs, self._previous)
        finally:
            self._busy = False

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is not _SDPA or self._busy:
            return func(*args, **kwargs)
        return self._sdpa(*args, **kwargs)


class FusedAttention(AttentionMode):
    """Routes SDPA on meta tensors to :func:`fused_attention`; counts the calls (``calls``) and those whose
    backward keeps the attention weights (``saving``: the math path, which a real device may still take, e.g.
    for a mask its fused kernels do not take)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.saving = 0

    def route(self, given: dict[str, Any], sdpa: Callable[..., Any]) -> Any:
        self.calls += 1
        if given["query"].device.type == "meta":
            return fused_attention(**given)
        out = sdpa(**given)
        self.saving += bool(torch.is_grad_enabled() and not ran_fused(out))
        return out

"""A mixture of experts' routed work on the meta device, where analytic profiles count.

transformers' experts modules (classes decorated with its ``use_experts_implementation``: Mixtral's, Qwen2-MoE's,
Qwen3-MoE's, OLMoE's, DeepSeek's, gpt-oss's and others) hold every expert's weights as 3-D parameters (``gate_up_proj``
or ``up_proj``, and ``down_proj``: one matrix per expert) and run each token through the ``k`` experts its router
chose. Which experts a token runs is read off the values (``nonzero``, indexing by a mask), which the meta device does
not have, so the model's own forward cannot run there.

:func:`routed_evenly` gives each such module, while it is entered, a forward that does on meta tensors the work of a
step whose ``tokens x k`` token-expert pairs are spread evenly over the experts (the balance a load-balancing loss
trains for; Fedus et al., "Switch Transformers", JMLR 2022, section 2.2): each expert's gate-and-up (or up)
projection, its gate or activation, and its down projection on its share of the pairs, then the router's weights
applied and each token's ``k`` outputs summed, as transformers' ``batched_mm`` and ``grouped_mm`` forwards do. Each
projection is one batched GEMM over the experts, ``tokens x k / experts`` rows each, as a grouped GEMM computes it
(transformers' default, ``grouped_mm``), its weight gradient too. The FLOPs, the bytes moved and the activations
saved are those of that balanced step. Tensors on a real device run the model's own
forward, whose routing is the router's.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn


def is_experts(module: nn.Module) -> bool:
    """Whether ``module`` is a transformers experts module (its weights 3-D, one matrix per expert)."""
    down = getattr(module, "down_proj", None)
    up = getattr(module, "gate_up_proj" if getattr(module, "has_gate", True) else "up_proj", None)
    return (hasattr(module, "_is_expert_parallel") and isinstance(down, nn.Parameter) and down.dim() == 3
            and isinstance(up, nn.Parameter) and up.dim() == 3)


def _project(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, transposed: bool) -> torch.Tensor:
    """Each expert's ``rows`` (experts, n, in) through its matrix (stored (out, in), or (in, out) where
    ``transposed``) and bias: one batched GEMM, as a grouped GEMM computes it (its weight gradient one too)."""
    out = torch.bmm(rows, weight if transposed else weight.transpose(1, 2))
    return out if bias is None else out + bias.unsqueeze(1)


def _bias(module: Any, name: str) -> torch.Tensor | None:
    return getattr(module, f"{name}_bias") if getattr(module, "has_bias", False) else None


def balanced_forward(module: Any, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
                     ) -> torch.Tensor:
    """The experts' output for ``hidden`` (tokens, width) with each token's ``k`` pairs spread evenly over the
    experts (module doc): ``ceil(tokens x k / experts)`` rows each, the last few padded; the routing's values are not
    read."""
    tokens, k = int(top_k_index.shape[0]), int(top_k_index.shape[-1])
    experts, width = int(module.down_proj.shape[0]), int(hidden.shape[-1])
    pairs = hidden.repeat_interleave(k, dim=0)
    rows = -(-tokens * k // experts)
    if rows * experts > tokens * k:
        pairs = torch.cat([pairs, pairs.new_zeros(rows * experts - tokens * k, width)])
    gated = getattr(module, "has_gate", True)
    transposed = bool(getattr(module, "is_transposed", False))
    up_name = "gate_up_proj" if gated else "up_proj"
    up = _project(pairs.view(experts, rows, width), getattr(module, up_name), _bias(module, up_name), transposed)
    inner = module._apply_gate(up) if gated else module.act_fn(up)
    out = _project(inner, module.down_proj, _bias(module, "down_proj"), transposed).reshape(-1, width)
    out = out[: tokens * k]
    if getattr(module, "has_post_expert_norm", False):
        out = module.post_expert_norm(out)
    out = out * top_k_weights.reshape(-1, 1).to(out.dtype)
    return out.view(tokens, k, width).sum(dim=1).to(hidden.dtype)


def _on_meta_evenly(module: nn.Module) -> Any:
    """A forward for ``module`` that routes evenly on meta tensors and runs its own forward otherwise."""
    own = type(module).forward

    def forward(self: nn.Module, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                *args: Any, **kwargs: Any) -> torch.Tensor:
        if hidden.device.type == "meta":
            return balanced_forward(self, hidden, top_k_index, top_k_weights)
        return own(self, hidden, top_k_index, top_k_weights, *args, **kwargs)  # type: ignore[no-any-return]

    return types.MethodType(forward, module)


@contextmanager
def routed_evenly(model: nn.Module) -> Iterator[int]:
    """While entered, every experts module of ``model`` routes evenly on the meta device (module doc); yields how
    many there are. Their own forwards are back on exit, whatever happened."""
    found = [m for m in model.modules() if is_experts(m) and "forward" not in vars(m)]
    try:
        for m in found:
            m.forward = _on_meta_evenly(m)
        yield len(found)
    finally:
        for m in found:
            vars(m).pop("forward", None)

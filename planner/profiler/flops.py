"""FLOP counting: ``torch.utils.flop_counter.FlopCounterMode`` plus the ops it misses.

Which counter and why: fvcore's ``FlopCountAnalysis`` traces the forward only (no backward
FLOPs) and has no handle for ``scaled_dot_product_attention``; torch's ``FlopCounterMode``
counts forward and backward at the aten level (mm, addmm, bmm, baddbmm, convolution and its
backward, the CUDA SDPA kernels) but misses the CPU SDPA kernel
(``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward), which we add with
torch's own SDPA formulas. So the counts here cover convolutions, linear layers, matmuls and
attention, forward and backward, on CPU, CUDA and the meta device. Like both counters,
element-wise ops (ReLU, batch and layer norm, softmax outside SDPA, pooling) count zero:
they are a small share of the FLOPs of the zoo models (well under 1%) but not of their time,
which is why measured times, not FLOPs, are the reference. Attention is counted without
causal masking (full S x S), as torch does; the fused CPU/CUDA kernels' backward counts 5
matmuls (torch's formula, QK^T recomputed), the math path used on the meta device 4. One
multiply-add is 2 FLOPs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.flop_counter import (
    FlopCounterMode,
    flop_registry,
    sdpa_backward_flop_count,
    sdpa_flop_count,
    shape_wrapper,
)

FLOP_COUNTER = "torch.utils.flop_counter.FlopCounterMode + CPU SDPA formulas"


def _cpu_sdpa(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return int(sdpa_flop_count(query, key, value))


def _cpu_sdpa_backward(grad_out: Any, query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None,
                       **kwargs: Any) -> int:
    return int(sdpa_backward_flop_count(grad_out, query, key, value))


def _custom_mapping() -> dict[Any, Any]:
    aten = torch.ops.aten
    mapping: dict[Any, Any] = {}
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        mapping[aten._scaled_dot_product_flash_attention_for_cpu] = _cpu_sdpa
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward"):
        mapping[aten._scaled_dot_product_flash_attention_for_cpu_backward] = _cpu_sdpa_backward
    return mapping


def flop_counter() -> FlopCounterMode:
    """A silent FlopCounterMode that also counts the CPU SDPA kernels."""
    return FlopCounterMode(display=False, custom_mapping=_custom_mapping())


_REGISTRY: dict[Any, Any] = {}


def op_flops(func: Any, args: Any, kwargs: Any, out: Any) -> float:
    """FLOPs of one aten op call by the formulas ``flop_counter`` uses (0 for ops it does not count)."""
    if not _REGISTRY:
        _REGISTRY.update(flop_registry)
        _REGISTRY.update({op: shape_wrapper(f) for op, f in _custom_mapping().items()})
    formula = _REGISTRY.get(func._overloadpacket)
    return 0.0 if formula is None else float(formula(*args, **kwargs, out_val=out))

"""FLOP counting: ``torch.utils.flop_counter.FlopCounterMode`` plus the ops it misses.

Which counter and why: fvcore's ``FlopCountAnalysis`` traces the forward only (no backward
FLOPs) and has no handle for ``scaled_dot_product_attention``; torch's ``FlopCounterMode``
counts forward and backward at the aten level (mm, addmm, bmm, baddbmm, convolution and its
backward, the CUDA SDPA kernels) but misses the CPU SDPA kernel
(``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward), and before torch 2.13
rejects grouped-query shapes (fewer key and value heads than query heads) in its SDPA formulas,
which stopped a measured profile of a Llama on a GPU with torch 2.11. So every fused SDPA kernel,
CPU and CUDA, is counted here by torch's formulas written for any number of key and value heads
(:func:`attention_flops`). nn.LSTM on the CPU runs oneDNN's fused recurrent layer
(``aten.mkldnn_rnn_layer``), which torch's counter also misses (a measured profile gave an LSTM 0 FLOPs where the
meta device's decomposition counts its products): counted here by its products (:func:`rnn_layer_flops`). Grouped
GEMMs (a mixture of experts' projections: ``aten._grouped_mm`` and transformers' fallback custom op, whose inner
``mm`` calls no counter sees) are counted by their shapes (:func:`grouped_mm_flops`). So the counts here cover
convolutions, linear layers, matmuls, attention, recurrent layers and experts, forward and backward, on CPU, CUDA and
the meta device. Like both counters,
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
from torch.utils.flop_counter import FlopCounterMode, flop_registry, shape_wrapper

FLOP_COUNTER = "torch.utils.flop_counter.FlopCounterMode + CPU SDPA formulas"


def attention_flops(query: Any, key: Any, value: Any, backward: bool = False) -> int:
    """FLOPs of fused attention on ``(..., tokens, head_dim)`` shapes (leading dimensions: batch and query
    heads): forward ``Q K^T`` and the weights times ``V``, ``2 rows s_q s_k (d + d_v)``; backward torch's five
    products (the scores recomputed, the gradients of the weights, ``V``, ``Q`` and ``K``), ``(3 d + 2 d_v)``.
    Key and value may have fewer heads (grouped-query attention: each is shared by ``heads_q / heads_kv`` query
    heads, which the kernel broadcasts), as torch's own formula takes from torch 2.13 on; older ones reject such
    shapes. Counted over every query row, without causal masking, as torch counts."""
    *lead, s_q, d_qk = query
    s_k, d_v = key[-2], value[-1]
    rows = 1
    for n in lead:
        rows *= int(n)
    return 2 * rows * int(s_q) * int(s_k) * ((3 * d_qk + 2 * d_v) if backward else (d_qk + d_v))


def _sdpa(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return attention_flops(query, key, value)


def _sdpa_backward(grad_out: Any, query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None,
                   **kwargs: Any) -> int:
    return attention_flops(query, key, value, backward=True)


def rnn_layer_flops(input_shape: Any, w_ih: Any, w_hh: Any, backward: bool = False) -> int:
    """FLOPs of one fused recurrent layer (oneDNN's LSTM or GRU on the CPU, ``aten.mkldnn_rnn_layer``) over a
    ``(steps, batch, features)`` input: every step multiplies the input by ``W_ih`` (gates x hidden by features)
    and the hidden state by ``W_hh`` (gates x hidden by hidden), ``2 steps batch (|W_ih| + |W_hh|)``; backward
    twice that (the gradients of the inputs and of the weights). Gate nonlinearities count zero, as element-wise
    ops do here."""
    steps, batch = int(input_shape[0]), int(input_shape[1])
    weights = int(w_ih[0]) * int(w_ih[1]) + int(w_hh[0]) * int(w_hh[1])
    return 2 * steps * batch * weights * (2 if backward else 1)


def _rnn_layer(input: Any, w_ih: Any, w_hh: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return rnn_layer_flops(input, w_ih, w_hh)


def _rnn_layer_backward(input: Any, w_ih: Any, w_hh: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return rnn_layer_flops(input, w_ih, w_hh, backward=True)


def grouped_mm_flops(a: Any, b: Any) -> int:
    """FLOPs of a grouped GEMM (``aten._grouped_mm``: a mixture of experts' projections, each row or group of rows
    through its own expert's matrix): rows ``(S, K)`` by stacked matrices ``(E, K, N)``, ``2 S K N``; rows by rows
    grouped along ``S`` into ``(E, K, N)`` (a weight gradient), ``(K, S)`` by ``(S, N)``, ``2 K S N``; batched
    ``(E, M, K)`` by ``(E, K, N)``, ``2 E M K N``. The rows past the offsets' last (none without expert
    parallelism) are counted."""
    lead = 1
    for n in a:
        lead *= int(n)
    return 2 * lead * int(b[-1])


def _grouped_mm(a: Any, b: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return grouped_mm_flops(a, b)


def _grouped_fallback_backward(a: Any, b: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return 2 * grouped_mm_flops(a, b)  # the input's gradient and the weights'


def _grouped_ops() -> dict[Any, Any]:
    """transformers' grouped GEMM fallback (its CPU and non-bf16 path, a custom op whose inner products no counter
    sees) and its backward, where transformers has registered them."""
    ops = getattr(torch.ops, "transformers", None)
    if ops is None or not hasattr(ops, "grouped_mm_fallback"):
        return {}
    return {ops.grouped_mm_fallback: _grouped_mm, ops.grouped_mm_fallback_backward: _grouped_fallback_backward}


_FUSED_ATTENTION = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
                    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention")
"""The SDPA kernels whose forward takes ``query, key, value`` first and whose ``_backward`` takes
``grad_out, query, key, value`` first (their aten schemas)."""


def _custom_mapping() -> dict[Any, Any]:
    aten = torch.ops.aten
    mapping: dict[Any, Any] = {}
    for name in _FUSED_ATTENTION:
        if hasattr(aten, name):
            mapping[getattr(aten, name)] = _sdpa
        if hasattr(aten, f"{name}_backward"):
            mapping[getattr(aten, f"{name}_backward")] = _sdpa_backward
    if hasattr(aten, "mkldnn_rnn_layer"):  # nn.LSTM on the CPU runs oneDNN's fused layer, which torch counts as 0
        mapping[aten.mkldnn_rnn_layer] = _rnn_layer
        mapping[aten.mkldnn_rnn_layer_backward] = _rnn_layer_backward
    if hasattr(aten, "_grouped_mm"):  # its backward is grouped GEMMs too
        mapping[aten._grouped_mm] = _grouped_mm
    return {**mapping, **_grouped_ops()}


def flop_counter() -> FlopCounterMode:
    """A silent FlopCounterMode that also counts the CPU SDPA kernels."""
    return FlopCounterMode(display=False, custom_mapping=_custom_mapping())


_REGISTRY: dict[Any, Any] = {}


def op_flops(func: Any, args: Any, kwargs: Any, out: Any) -> float:
    """FLOPs of one aten op call by the formulas ``flop_counter`` uses (0 for ops it does not count)."""
    if not _REGISTRY or any(op not in _REGISTRY for op in _grouped_ops()):  # or transformers' ops came since
        _REGISTRY.update(flop_registry)
        _REGISTRY.update({op: shape_wrapper(f) for op, f in _custom_mapping().items()})
    formula = _REGISTRY.get(func._overloadpacket)
    return 0.0 if formula is None else float(formula(*args, **kwargs, out_val=out))

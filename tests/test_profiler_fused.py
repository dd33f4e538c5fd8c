"""profiler.fused: SDPA on meta tensors keeps what its fused kernels keep, and counts what they count."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from planner.profiler.flops import flop_counter
from planner.profiler.fused import FusedAttention, fused_attention, ran_fused


def _saved(device: str, heads: int = 4, kv_heads: int = 4, seq: int = 256, causal: bool = True,
            mask: bool = False) -> tuple[int, float, bool]:
    """Bytes autograd keeps for SDPA's backward, its FLOPs forward and backward, and whether it ran fused."""
    torch.manual_seed(0)
    q = torch.randn(2, heads, seq, 16, device=device, requires_grad=True)
    k, v = (torch.randn(2, kv_heads, seq, 16, device=device, requires_grad=True) for _ in range(2))
    attn_mask = torch.ones(seq, seq, dtype=torch.bool, device=device).tril() if mask else None
    kept: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        kept.append(t.numel() * t.element_size())
        return t

    counter, mode = flop_counter(), FusedAttention()
    with counter, mode:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal and not mask,
                                                 enable_gqa=kv_heads != heads)
        out.sum().backward()
    assert mode.calls == 1
    return sum(kept), float(counter.get_total_flops()), mode.saving == 0


@pytest.mark.parametrize(("heads", "kv_heads", "mask"), [(4, 4, False), (4, 2, False), (4, 4, True)])
def test_meta_attention_keeps_and_counts_what_the_fused_cpu_kernel_does(heads: int, kv_heads: int,
                                                                        mask: bool) -> None:
    meta_bytes, meta_flops, meta_fused = _saved("meta", heads, kv_heads, mask=mask)
    cpu_bytes, cpu_flops, cpu_fused = _saved("cpu", heads, kv_heads, mask=mask)
    assert meta_fused and meta_flops == cpu_flops
    s, batch = 256, 2
    assert meta_bytes < batch * heads * s * s * 4  # less than one fp32 tensor of the s x s weights
    if not mask:  # q, the output, k and v (grouped-query: fewer heads) and one log-sum-exp per row
        assert meta_bytes == batch * s * 16 * 4 * (2 * heads + 2 * kv_heads) + batch * heads * s * 4
    if cpu_fused:  # the CPU kernel took it: the same bytes
        assert meta_bytes == cpu_bytes


def test_the_math_path_keeps_the_weights_and_is_told_apart() -> None:
    q = torch.randn(1, 2, 64, 8, requires_grad=True)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        math = F.scaled_dot_product_attention(q, q, q)
    assert not ran_fused(math) and ran_fused(fused_attention(q, q, q))
    mode = FusedAttention()
    with mode, torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        F.scaled_dot_product_attention(q, q, q)
    assert (mode.calls, mode.saving) == (1, 1)

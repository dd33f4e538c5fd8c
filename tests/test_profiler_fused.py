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


def _mha_saved(device: str) -> tuple[int, int]:
    """Bytes autograd keeps for nn.MultiheadAttention's forward under FusedAttention, and the SDPA calls seen."""
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(32, 4, batch_first=True, device=device)
    x = torch.randn(2, 64, 32, device=device, requires_grad=True)
    kept: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        kept.append(t.numel() * t.element_size())
        return t

    mode = FusedAttention()
    with mode, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        mha(x, x, x, need_weights=False)
    return sum(kept), mode.calls


def test_sdpa_inside_another_torch_function_is_routed_too() -> None:
    """nn.MultiheadAttention (and nn.TransformerEncoderLayer) call SDPA inside F.multi_head_attention_forward,
    which runs with the mode off: on meta it took the math path and kept the s x s weights in fp32 (an
    analytic profile of a 1024-wide, 16-head encoder layer at 2,048 tokens said 1.33 GB saved, 0.20 GB fused)."""
    meta_bytes, meta_calls = _mha_saved("meta")
    cpu_bytes, cpu_calls = _mha_saved("cpu")
    assert (meta_calls, cpu_calls) == (1, 1)
    assert meta_bytes < 2 * 4 * 64 * 64 * 4  # less than one fp32 tensor of the s x s weights
    assert meta_bytes == cpu_bytes  # the CPU's fused kernel keeps the same
    assert F.scaled_dot_product_attention is torch._C._nn.scaled_dot_product_attention  # put back on exit


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_meta_attention_with_values_of_another_head_size_answers_in_theirs(kv_heads: int) -> None:
    """Multi-head latent attention (DeepSeek's, Youtu's) gives values another head size than queries and keys; the
    CPU flash kernel's meta answer took the queries' (24 for 16), so the output projection after it failed and
    an analytic profile of Youtu was refused ("the model rejects input"). The memory-efficient kernel takes them:
    the output is the values' size, counted by the fused formula, its backward keeping no attention weights."""
    from planner.profiler.flops import attention_flops

    q, k = (torch.empty(2, h, 32, 24, device="meta", requires_grad=True) for h in (4, kv_heads))
    v = torch.empty(2, kv_heads, 32, 16, device="meta", requires_grad=True)
    counter, mode = flop_counter(), FusedAttention()
    with counter, mode:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv_heads != 4)
        out.sum().backward()
    assert out.shape == (2, 4, 32, 16) and (mode.calls, mode.saving) == (1, 0) and ran_fused(out)
    shapes = ((2, 4, 32, 24), (2, 4, 32, 24), (2, 4, 32, 16))
    assert counter.get_total_flops() == attention_flops(*shapes) + attention_flops(*shapes, backward=True)
    cpu = F.scaled_dot_product_attention(*(torch.randn(t.shape) for t in (q, k, v)), is_causal=True,
                                         enable_gqa=kv_heads != 4)
    assert cpu.shape == out.shape

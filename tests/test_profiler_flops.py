"""profiler.flops: FLOPs of convolutions, linears and attention, forward and backward, on CPU and meta."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

from planner.profiler import load_model, profile_model
from planner.profiler.flops import attention_flops, flop_counter


def _count(fn: object) -> int:
    with flop_counter() as counter:
        fn()  # type: ignore[operator]
    return int(counter.get_total_flops())


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_linear_and_conv_forward_and_backward(device: str) -> None:
    lin = nn.Linear(32, 16, device=device)
    x = torch.randn(8, 32, device=device, requires_grad=True)
    assert _count(lambda: lin(x)) == 2 * 8 * 32 * 16
    out = lin(x)
    assert _count(lambda: out.backward(torch.ones_like(out))) == 2 * 2 * 8 * 32 * 16
    conv = nn.Conv2d(3, 8, 3, padding=1, device=device)
    img = torch.randn(2, 3, 10, 10, device=device)
    assert _count(lambda: conv(img)) == 2 * 2 * 8 * 10 * 10 * 3 * 9


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_attention_is_counted_on_cpu_and_meta(device: str) -> None:
    q = torch.randn(2, 4, 16, 8, device=device, requires_grad=True)
    fwd = _count(lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True))
    assert fwd == 2 * (2 * 2 * 4 * 16 * 16 * 8)  # QK^T and PV
    out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    bwd = _count(lambda: out.backward(torch.ones_like(out)))
    # CPU runs the fused kernel (torch's formula: 5 matmuls, recomputing QK^T); meta runs the math path (4)
    assert bwd == (fwd * 5 // 2 if device == "cpu" else 2 * fwd)


def test_vgg16_and_resnet152_forward_flops_per_image() -> None:
    for name, gflops in (("vgg16", 30.94), ("resnet152", 23.03)):
        prof = profile_model(load_model(name, 2, device="meta"), mode="analytic")
        per_image = sum(layer.forward_flops for layer in prof.layers) / 2 / 1e9
        assert per_image == pytest.approx(gflops, rel=1e-3)
        for layer in prof.layers:
            assert layer.backward_flops == pytest.approx(2 * layer.forward_flops, rel=0.01) or layer is prof.layers[0]


def test_op_flops_follows_the_counters_formulas_per_call() -> None:
    from torch.utils._python_dispatch import TorchDispatchMode

    from planner.profiler.flops import op_flops

    seen: list[float] = []

    class Each(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            seen.append(op_flops(func, args, kwargs or {}, out))
            return out

    lin, conv = nn.Linear(32, 16, device="meta"), nn.Conv2d(3, 8, 3, padding=1, device="meta")
    x, img = torch.empty(8, 32, device="meta"), torch.empty(2, 3, 10, 10, device="meta")
    with Each():
        torch.relu(lin(x))
        conv(img)
    assert sum(seen) == _count(lambda: lin(x)) + _count(lambda: conv(img))
    assert 0.0 in seen and 2 * 8 * 32 * 16 in seen  # relu counts nothing, the linear its matmul


def test_grouped_query_attention_counts_every_query_head() -> None:
    """Fewer key and value heads than query heads (Llama's GQA): counted, not rejected as torch before 2.13
    did, and as many FLOPs as with the key and value repeated to every head."""
    q = torch.randn(2, 8, 16, 4, requires_grad=True)
    kv = torch.randn(2, 2, 16, 4, requires_grad=True)
    fwd = _count(lambda: F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True))
    assert fwd == 2 * (2 * 2 * 8 * 16 * 16 * 4)
    out = F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
    assert _count(lambda: out.backward(torch.ones_like(out))) == fwd * 5 // 2


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 4), st.integers(1, 8), st.sampled_from([1, 2, 4]), st.integers(1, 64), st.integers(1, 64),
       st.sampled_from([8, 64, 128]), st.sampled_from([8, 64, 128]))
def test_attention_formulas_equal_torchs_own(b: int, kv_heads: int, group: int, s_q: int, s_k: int, d_qk: int,
                                             d_v: int) -> None:
    """The formulas are torch 2.13's (which takes grouped-query shapes) for every shape."""
    q, k, v = (b, kv_heads * group, s_q, d_qk), (b, kv_heads, s_k, d_qk), (b, kv_heads, s_k, d_v)
    assert attention_flops(q, k, v) == sdpa_flop_count(q, k, v)
    assert attention_flops(q, k, v, backward=True) == sdpa_backward_flop_count((b, kv_heads * group, s_q, d_v), q, k, v)


def test_an_lstm_on_the_cpu_counts_its_products_as_on_the_meta_device() -> None:
    """nn.LSTM on the CPU runs oneDNN's fused layer, which torch's counter missed (0 FLOPs); counted, it agrees
    with the meta device's decomposition within the biases' and the last step's share."""
    import torch

    from planner.profiler.flops import flop_counter, rnn_layer_flops

    def total(device: str) -> int:
        with torch.device(device):
            lstm = torch.nn.LSTM(32, 32, batch_first=True)
            x = torch.randn(8, 16, 32, requires_grad=True)
        with flop_counter() as counter:
            y, _ = lstm(x)
            y.sum().backward()
        return int(counter.get_total_flops())

    cpu = total("cpu")
    assert cpu == rnn_layer_flops((16, 8, 32), (128, 32), (128, 32)) * 3  # forward + backward (twice)
    assert abs(cpu - total("meta")) / cpu < 0.02


def test_a_mixture_of_experts_grouped_gemms_count_on_the_cpu_as_balanced_on_the_meta_device() -> None:
    """transformers' grouped GEMM fallback (its CPU fp32 path: a custom op whose inner products no counter saw, a
    measured Mixtral's experts counted 0) counts 2 S K N a projection, its backward twice that; the meta device's
    evenly routed experts (planner.profiler.experts) count the same, so measured and analytic profiles agree."""
    from planner.profiler.experts import routed_evenly
    from tests.test_profiler_hfsplit import family_model

    def experts_flops(device: str) -> int:
        with torch.device(device):
            model = family_model("Mixtral")  # 4 experts, 2 a token; hidden 64, FFN 128
        experts = model.model.layers[0].mlp.experts
        hidden = torch.randn(32, 64, device=device, requires_grad=True)
        index = torch.arange(64, device=device).reshape(32, 2) // 16  # 16 pairs an expert: the balanced routing
        weights = torch.full((32, 2), 0.5, device=device)
        with routed_evenly(model), flop_counter() as counter:
            experts(hidden, index, weights).sum().backward()
        return int(counter.get_total_flops())

    pairs, gate_up, down = 64, 64 * 256, 128 * 64  # S = 32 tokens x 2; gate and up fused: 2 x 128 outputs
    assert experts_flops("cpu") == experts_flops("meta") == 3 * 2 * pairs * (gate_up + down)

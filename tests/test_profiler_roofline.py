"""profiler.roofline: closed forms (a GEMM, a memory-bound op, launches), monotonicity, fused attention,
the fixed-part law at a third batch size, and a transformer block against a hand count."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

from planner import gpus
from planner.gpus import Roofline, roofline_of
from planner.profiler import load_model
from planner.profiler.layers import split_model
from planner.profiler.roofline import attention_flops, loss_roofline, profile_roofline, roofline_pass

BF16 = torch.bfloat16
LAUNCH_S = 4e-6


def _meta(*shape: int, grad: bool = False, dtype: torch.dtype = BF16) -> torch.Tensor:
    return torch.empty(*shape, device="meta", dtype=dtype, requires_grad=grad)


def _eff(share: float, sms: int, largest_elements: float) -> float:
    """The wave-quantisation curve, written out: share x T / (T + SMs/2), T in 128 x 128 tiles."""
    tiles = largest_elements / (128 * 128)
    return share * tiles / (tiles + sms / 2)


def test_constants_come_from_the_gpu_catalog() -> None:
    best = roofline_of("h100", "bf16", 1.0)
    assert best == Roofline(989.4e12, 792.1 / 989, 132, 3.35e12, LAUNCH_S, attention_share=0.35,
                            unaligned_share=gpus.UNALIGNED_GEMM_SHARE, host_s=gpus.HOST_S)
    assert roofline_of("a100", "fp32", 1.0).gemm_share == 0.80 and roofline_of("a100", "tf32").peak_flops == 156e12
    assert roofline_of("a100", "fp32").unaligned_share == 1.0  # no tensor cores, no 16-byte fast path
    assert roofline_of("a100", "tf32").unaligned_share == gpus.UNALIGNED_GEMM_SHARE
    # by default the shares are what training sustains of the best cases: the GPU's own share (the H100's fitted
    # on MosaicML's runs, planner.gpus.SUSTAINED_H100; the A100's on SC'21's, SUSTAINED)
    sustained = roofline_of("h100", "bf16")
    assert sustained.gemm_share == pytest.approx(792.1 / 989 * gpus.SUSTAINED_H100)
    assert sustained.attention_share == pytest.approx(0.35 * gpus.SUSTAINED_H100)
    assert roofline_of("a100", "bf16").gemm_share == pytest.approx(267.9 / 312 * gpus.SUSTAINED)


def test_a_large_gemm_runs_at_the_share_of_peak_its_tiles_allow() -> None:
    n = 8192
    layer = nn.Linear(n, n, bias=False).to(device="meta", dtype=BF16)
    roof = roofline_of("h100", "bf16", 1.0)
    out = roofline_pass([layer], _meta(n, n, grad=True), roof)
    gemm_s = 2 * n**3 / (989.4e12 * _eff(792.1 / 989, 132, n * n)) + LAUNCH_S
    assert out.forward_s == [pytest.approx(gemm_s, rel=1e-12)]
    assert out.backward_s == [pytest.approx(2 * gemm_s, rel=1e-12)]  # input and weight gradients
    assert out.memory_s == [0.0] and out.launches == [3]
    assert 2 * n**3 / (gemm_s - LAUNCH_S) / 989.4e12 == pytest.approx(0.788, abs=1e-3)  # 4096 tiles: near 0.801


def test_a_memory_bound_layer_moves_its_bytes_at_the_bandwidth() -> None:
    rows, cols = 4096, 4096
    out = roofline_pass([nn.ReLU()], _meta(rows, cols, grad=True), roofline_of("a100", "bf16"))
    tensor_bytes = rows * cols * 2  # bf16: 2-byte elements
    assert out.forward_s == [pytest.approx(2 * tensor_bytes / 2.039e12 + LAUNCH_S, rel=1e-12)]  # read, write
    assert out.backward_s == [pytest.approx(3 * tensor_bytes / 2.039e12 + LAUNCH_S, rel=1e-12)]  # grad, out, write
    assert out.memory_s[0] == pytest.approx(out.forward_s[0] + out.backward_s[0])


class _TinyOps(nn.Module):
    def __init__(self, count: int) -> None:
        super().__init__()
        self.count = count

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.count):
            x = x + 1
        return x


def test_tiny_kernels_cost_their_launches_or_the_hosts_time() -> None:
    roof = roofline_of("h100", "bf16")
    out = roofline_pass([_TinyOps(5)], _meta(1, 1), roof)
    assert out.launches == [5] and out.forward_s[0] == pytest.approx(5 * gpus.HOST_S)  # host-bound
    assert out.backward_s == [0.0]  # the model input needs no gradient
    on_gpu = roofline_pass([_TinyOps(5)], _meta(1, 1), replace(roof, host_s=0.0))
    assert on_gpu.forward_s[0] == pytest.approx(5 * LAUNCH_S, rel=1e-3)  # the GPU's side: the launches


def test_a_product_off_the_16_byte_grid_runs_at_the_unaligned_share() -> None:
    """GPT-2's output layer: a vocabulary of 50257 (not a multiple of 8) against the padded 50304."""
    roof = replace(roofline_of("h100", "bf16", 1.0), host_s=0.0)
    times = {}
    for vocab in (50304, 50257):
        layer = nn.Linear(768, vocab, bias=False).to(device="meta", dtype=BF16)
        times[vocab] = roofline_pass([layer], _meta(8192, 768), roof).forward_s[0] - LAUNCH_S
    rate = 2 * 8192 * 768 / roof.peak_flops
    assert times[50304] == pytest.approx(rate * 50304 / _eff(roof.gemm_share, 132, 8192 * 50304), rel=1e-9)
    assert times[50257] == pytest.approx(rate * 50257 / _eff(roof.gemm_share, 132, 8192 * 50257)
                                         / gpus.UNALIGNED_GEMM_SHARE, rel=1e-9)
    fp32 = replace(roofline_of("h100", "fp32"), host_s=0.0)
    odd = nn.Linear(768, 50257, bias=False).to(device="meta")
    even = nn.Linear(768, 50304, bias=False).to(device="meta")
    per_column = [roofline_pass([m], _meta(8192, 768, dtype=torch.float32), fp32).forward_s[0] / n
                  for m, n in ((odd, 50257), (even, 50304))]
    assert per_column[0] == pytest.approx(per_column[1], rel=1e-3)  # fp32 has no such penalty


def _linear_s(m: int, k: int, n: int) -> float:
    layer = nn.Linear(k, n).to(device="meta", dtype=BF16)
    out = roofline_pass([layer], _meta(m, k, grad=True), roofline_of("a100", "bf16"))
    return out.forward_s[0] + out.backward_s[0]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 8192), st.integers(1, 8192), st.integers(1, 8192), st.sampled_from([0, 1, 2]),
       st.integers(1, 4096))
def test_more_work_is_never_faster(m: int, k: int, n: int, dim: int, extra: int) -> None:
    bigger = [m, k, n]
    bigger[dim] += extra
    assert _linear_s(*bigger) >= _linear_s(m, k, n)


@settings(max_examples=60, deadline=None)
@given(st.floats(0, 1e13), st.floats(0, 1e11), st.floats(0, 1e6), st.floats(1, 1e3))
def test_a_kernel_with_more_flops_or_bytes_is_never_faster(flops: float, moved: float, tiles: float,
                                                           grow: float) -> None:
    roof = roofline_of("a100", "bf16")
    base, _ = roof.kernel(flops, moved, tiles)
    assert roof.kernel(flops * grow, moved, tiles)[0] >= base and roof.kernel(flops, moved * grow, tiles)[0] >= base
    assert roof.efficiency(tiles) <= roof.gemm_share


class _Attention(nn.Module):
    """Attention of its input (queries) over key and value parameters of ``kv_heads`` heads."""

    def __init__(self, shape: tuple[int, int, int, int], causal: bool, kv_heads: int | None = None) -> None:
        super().__init__()
        b, h, s, d = shape
        self.k = nn.Parameter(_meta(b, kv_heads or h, s, d))
        self.v = nn.Parameter(_meta(b, kv_heads or h, s, d))
        self.causal, self.gqa = causal, kv_heads is not None

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, self.k, self.v, is_causal=self.causal, enable_gqa=self.gqa)


def test_attention_runs_as_one_fused_kernel_each_way() -> None:
    b, h, s, d = 2, 8, 2048, 64
    q = _meta(b, h, s, d, grad=True)
    assert attention_flops(q.shape, q.shape, q.shape, False, False) == sdpa_flop_count(q.shape, q.shape, q.shape)
    assert attention_flops(q.shape, q.shape, q.shape, False, True) == sdpa_backward_flop_count(
        q.shape, q.shape, q.shape, q.shape)
    roof = roofline_of("a100", "bf16", 1.0)
    full = roofline_pass([_Attention((b, h, s, d), causal=False)], q, roof)
    causal = roofline_pass([_Attention((b, h, s, d), causal=True)], q, roof)
    assert full.launches == [2] and causal.launches == [2]  # no S x S scores, softmax or mask kernels
    compute = 4 * b * h * s * s * d / (312e12 * _eff((0.50 + 0.73) / 2, 108, b * h * s * d))  # FlashAttention-2
    assert full.forward_s[0] == pytest.approx(compute + LAUNCH_S, rel=1e-12)
    assert causal.forward_s[0] == pytest.approx(compute / 2 + LAUNCH_S, rel=1e-12)
    assert full.backward_s[0] == pytest.approx(compute * 10 / 4 + LAUNCH_S, rel=1e-12)  # 5 matmuls, not 2
    gqa = roofline_pass([_Attention((b, h, s, d), causal=True, kv_heads=2)], q, roof)
    assert gqa.launches == [2] and gqa.forward_s[0] == pytest.approx(causal.forward_s[0], rel=1e-12)


class _Block(nn.Module):
    """A pre-norm GPT block written out: LN, QKV, causal SDPA, projection, residual; LN, MLP (GELU), residual."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        h = hidden
        self.ln1, self.qkv, self.proj = nn.LayerNorm(h), nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.ln2, self.up, self.down = nn.LayerNorm(h), nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, h))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


def _hand_count_forward_s(roof: Roofline, b: int, s: int, h: int) -> float:
    """The block's forward by hand: 4 GEMMs and fused attention on the wave curve; layer norms, the
    head-merging copy, GELU and the residual adds at the bandwidth (2 bytes per element); 11 launches."""
    tokens = b * s
    bw = roof.bandwidth_Bps

    def gemm(k: int, n: int) -> float:
        compute = 2 * tokens * k * n / (roof.peak_flops * _eff(roof.gemm_share, roof.sm_count,
                                                                max(tokens * k, k * n, tokens * n)))
        return max(compute, 2 * (tokens * k + k * n + tokens * n) / bw)

    act = 2 * tokens * h  # bytes of one activation
    assert roof.attention_share is not None
    attention = 4 * tokens * s * h / 2 / (roof.peak_flops * _eff(roof.attention_share, roof.sm_count, tokens * h))
    gemms = gemm(h, 3 * h) + gemm(h, h) + gemm(h, 4 * h) + gemm(4 * h, h)
    memory = (2 * 2 * act + 2 * act + 2 * 3 * act + 2 * 4 * act) / bw  # 2 LNs, copy, 2 adds, GELU over 4h
    return gemms + max(attention, 4 * act / bw) + memory + 11 * roof.launch_s


@pytest.mark.parametrize("gpu", ["a100", "h100"])
def test_a_transformer_block_matches_a_hand_count(gpu: str) -> None:
    b, s, h = 8, 1024, 768
    roof = roofline_of(gpu, "bf16")
    block = _Block(h, 12).to(device="meta", dtype=BF16)
    out = roofline_pass([block], _meta(b, s, h, grad=True), roof)
    device_s = _hand_count_forward_s(roof, b, s, h)
    on_gpu = roofline_pass([block], _meta(b, s, h, grad=True), replace(roof, host_s=0.0))
    assert on_gpu.forward_s[0] == pytest.approx(device_s, rel=0.01)  # biases, LN stats
    assert out.forward_s[0] == pytest.approx(max(device_s, 11 * roof.host_s), rel=0.01)  # or the host's time


def test_the_replicated_part_of_a_block_is_its_norms_and_residual_adds() -> None:
    """What Megatron's tensor parallelism without sequence parallelism runs whole on every rank: the two layer norms
    (read and write s b h) and the two residual adds (two reads, a write), 4 kernels; not the GEMMs, the attention,
    the head-merging copy or the GELU over 4h, which each rank runs on its shard."""
    b, s, h = 8, 1024, 768
    roof = replace(roofline_of("a100", "bf16"), host_s=0.0)
    block = _Block(h, 12).to(device="meta", dtype=BF16)
    out = roofline_pass([block], _meta(b, s, h, grad=True), roof)
    act = 2 * b * s * h
    want = (2 * 2 * act + 2 * 3 * act) / roof.bandwidth_Bps + 4 * roof.launch_s
    assert out.forward_replicated_s[0] == pytest.approx(want, rel=0.01)  # the norms' statistics besides
    assert 0 < out.backward_replicated_s[0] < out.backward_s[0] / 4
    host_bound = roofline_pass([_TinyOps(5)], _meta(1, 1), roofline_of("h100", "bf16"))
    assert host_bound.forward_replicated_s == host_bound.forward_s  # a rank issues every kernel whatever its share


@pytest.mark.parametrize(("name", "overrides", "seq"), [("gpt2", {"n_layer": 2}, 512),
                                                         ("llama-tiny", {}, 256)])
def test_the_fixed_part_law_predicts_a_third_batch_size(name: str, overrides: dict[str, int], seq: int) -> None:
    batch = 16
    loaded = load_model(name, batch, (seq,), dtype="bfloat16", device="meta", overrides=overrides)
    layers = split_model(loaded.module, loaded.example_input).layers
    roof = replace(roofline_of("h100", "bf16"), host_s=0.0)  # a layer turning host-bound bends the line
    prof = profile_roofline(layers, loaded.example_input, roof)
    assert prof.small_batch == 4
    small = roofline_pass(layers, loaded.example_input[:4], roof)
    third = roofline_pass(layers, loaded.example_input[:8], roof)
    for i in range(len(layers)):
        for t_big, t_small, t_third, fixed in ((prof.full.forward_s[i], small.forward_s[i], third.forward_s[i],
                                                prof.forward_fixed_s[i]),
                                               (prof.full.backward_s[i], small.backward_s[i], third.backward_s[i],
                                                prof.backward_fixed_s[i])):
            assert fixed is not None

            def law(size: int, fixed: float = fixed, t_big: float = t_big) -> float:
                return fixed + size / batch * (t_big - fixed)  # costmodel.layers' scaling

            assert law(4) == pytest.approx(t_small, rel=1e-9)  # the fit goes through both points
            assert law(8) == pytest.approx(t_third, rel=0.01)  # measured: < 1e-12 here (no kernel changes regime)


def test_identical_blocks_are_walked_once_and_agree_with_a_full_walk() -> None:
    loaded = load_model("llama-tiny", 4, (32,), dtype="bfloat16", device="meta", overrides={"num_hidden_layers": 5})
    layers = split_model(loaded.module, loaded.example_input).layers
    roof = roofline_of("a100", "bf16")
    once = roofline_pass(layers, loaded.example_input, roof)
    every = roofline_pass(layers, loaded.example_input, roof, once_per_kind=False)
    assert once == every and len(once.forward_s) == 7


def test_the_loss_is_timed_by_the_roofline() -> None:
    """Cross-entropy in fp32 over bf16 logits, forward and backward: memory-bound passes over the logits."""
    roof = replace(roofline_of("h100", "bf16"), host_s=0.0)
    shape = (8, 1024, 50304)
    loss_s, fixed_s = loss_roofline(shape, BF16, roof)
    assert loss_s is not None and fixed_s is not None and 0 <= fixed_s < loss_s
    logit_s = 8 * 1024 * 50304 / roof.bandwidth_Bps  # one byte per logit
    assert 12 * logit_s <= loss_s <= 80 * logit_s  # at least the fp32 copy and the gradient's way back
    bigger, _ = loss_roofline((8, 1024, 2 * 50304), BF16, roof)
    assert bigger is not None and bigger == pytest.approx(2 * loss_s, rel=0.05)
    assert loss_roofline((8, 1), BF16, roof) == (None, None)  # one class: no loss to take
    assert loss_roofline((8, 16), torch.long, roof) == (None, None)

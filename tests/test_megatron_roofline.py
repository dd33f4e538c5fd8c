"""scripts/megatron_roofline.py: a Megatron GPT layer's kernels per tensor-parallel rank, against SC'21's FLOP count
and the roofline law."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import megatron_roofline as mr

from planner import gpus


@given(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2]), st.sampled_from([512, 2048]),
       st.sampled_from([(2048, 16), (4096, 32), (12288, 96)]))
def test_a_ranks_gemms_are_sc21s_layer_flops_over_t(t: int, b: int, s: int, ha: tuple[int, int]) -> None:
    # Narayanan et al. SC'21 section 5.1: a layer's forward is 24 b s h^2 + 4 b s^2 h FLOPs, split t ways
    h, a = ha
    x = mr.Layout(b, s, h, a, 4 * h, t)
    flops = sum(k[0] for k in mr.block_kernels(x))
    assert flops == pytest.approx((24 * b * s * h * h + 4 * b * s * s * h) / t)
    head = sum(k[0] for k in mr.head_kernels(x, 51200))
    assert head == pytest.approx(2 * b * s * h * 51200 / t)


def test_dropout_adds_memory_bound_kernels_only() -> None:
    on, off = (mr.block_kernels(mr.Layout(1, 2048, 4096, 32, 16384, 4, d)) for d in (True, False))
    assert sum(k[0] for k in on) == sum(k[0] for k in off)
    assert len(on) == len(off) + 1 and sum(k[1] for k in on) > sum(k[1] for k in off)


def test_forward_time_is_the_rooflines_sum_over_kernels() -> None:
    roof = gpus.roofline_of("a100", "bf16")
    kernels = mr.block_kernels(mr.Layout(1, 2048, 8192, 64, 32768, 8))
    assert mr.forward_s(roof, kernels) == pytest.approx(sum(roof.kernel(*k)[0] for k in kernels))
    # every kernel pays at least its compute at the share of peak, or its bytes at the bandwidth
    floor = sum(max(f / (roof.peak_flops * roof.gemm_share), n / roof.bandwidth_Bps) for f, n, _ in kernels)
    assert mr.forward_s(roof, kernels) > floor


def test_sequence_parallelism_runs_norms_and_adds_on_a_tth_of_the_sequence() -> None:
    """Korthikanti et al. 2022, section 4.2.2: with sequence parallelism the layer norms and the
    bias+dropout+add kernels touch s/t of the tokens on each rank; the GEMMs and the attention core do not change."""
    t = 8
    whole, sp = (mr.block_kernels(mr.Layout(1, 2048, 12288, 96, 4 * 12288, t, True, p)) for p in (False, True))
    assert [k[0] for k in whole] == [k[0] for k in sp]
    act = 2.0 * 2048 * 12288
    norm_bytes = act * (2 + 3.5 + 2 + 3.5)  # two norms (read, write), two bias+dropout+adds (two reads, write, mask)
    saved = sum(k[1] for k in whole) - sum(k[1] for k in sp)
    assert saved == pytest.approx(norm_bytes * (1 - 1 / t))

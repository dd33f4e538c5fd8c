"""costmodel.whole_tensors: torch's ZeRO-1 deals whole tensors, so one rank holds more than an even share."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner import costmodel as cm
from planner import ir
from planner.cluster import cluster_from_dict
from planner.costmodel.whole_tensors import heaviest_ratio, heaviest_share
from tests.conftest import make_cluster_dict, make_profile_dict


def test_the_mlps_tensors_over_two_ranks_as_zero_redundancy_optimizer_deals_them() -> None:
    """The zoo MLP's tensors (three 1024-wide weights, a head, four biases): largest first to the lighter rank,
    rank 0 gets 1048576 + 802816 = 1851392 elements, rank 1 the rest; even would be 1456645."""
    mlp = [802816, 1024, 1048576, 1024, 1048576, 1024, 10240, 10]
    assert heaviest_share(mlp, 2) == 1851392
    assert heaviest_share(mlp, 1) == sum(mlp)
    assert heaviest_share([5, 5, 5, 5], 4) == 5 and heaviest_share([7], 3) == 7


@given(st.lists(st.integers(1, 10**9), min_size=1, max_size=40), st.integers(1, 64))
def test_the_heaviest_share_lies_between_the_even_share_and_it_plus_one_tensor(counts: list[int], ranks: int) -> None:
    """Graham's bound for dealing largest first: at least the largest tensor and the even share, at most the even
    share plus the largest tensor; exactly the sum on one rank."""
    share = heaviest_share(counts, ranks)
    assert share >= max(max(counts), sum(counts) / ranks) - 1e-6
    assert share <= sum(counts) / ranks + max(counts) + 1e-6


def _profile(tensors: list[list[int]] | None) -> ir.ModelProfile:
    doc: dict[str, Any] = make_profile_dict(4)
    for i, layer in enumerate(doc["layers"]):
        layer.update(in_features=500, out_features=500)
        if tensors is not None:
            layer["tensor_counts"] = tensors[i]
    return ir.ModelProfile.from_dict(doc)


UNEVEN = [[250_000], [150_000, 100_000], [200_000, 50_000], [125_000, 125_000]]
"""Four 250,000-parameter layers; over two ranks the first gets 250k + 150k + 125k = 525k of 1M (even: 500k)."""


def _stage_static(profile: ir.ModelProfile, engine: str, zero: int = 1, optimizer: str = "adam") -> tuple[int, float]:
    cluster = cluster_from_dict(make_cluster_dict(1, 2))
    stage = ir.Stage((0, 4), ("n0.g0", "n0.g1"), ("dp",) * 4, 0, zero=zero)
    plan = ir.Plan(profile, cluster, "1f1b", 1, optimizer, (stage,), ir.Prediction(0.0, 0.0, 0.0, 0), engine=engine)
    cost = cm.stage_costs_for(profile, cluster, plan.stages, 1, optimizer, engine=engine)[0]
    return cost.static_bytes, cost.optimizer_step_s


def test_torchs_zero1_stage_holds_the_heaviest_ranks_state_and_deepspeeds_an_even_one() -> None:
    """Adam's fp32 state is 8 bytes a parameter: an even share of 1M parameters over 2 ranks is 4 MB; the rank
    torch deals 525k parameters holds 4.2 MB, 200 kB more, and steps 5% more. DeepSpeed (flattened, even), the
    paper's ZeRO (engine any), ZeRO-0 and a profile without tensor counts are unchanged."""
    uneven, unknown = _profile(UNEVEN), _profile(None)
    assert heaviest_ratio(uneven, ir.Stage((0, 4), ("a", "b"), ("dp",) * 4, 0, zero=1)) == pytest.approx(1.05)
    static, step = _stage_static(uneven, "torch")
    base_static, base_step = _stage_static(unknown, "torch")
    assert static - base_static == pytest.approx(0.05 * 8 * 500_000, abs=1) and step == pytest.approx(1.05 * base_step)
    for engine in ("deepspeed", "any"):
        assert _stage_static(uneven, engine) == _stage_static(unknown, engine)
    assert _stage_static(uneven, "torch", zero=0) == _stage_static(unknown, "torch", zero=0)


@given(st.lists(st.lists(st.integers(1, 10**6), min_size=1, max_size=4), min_size=4, max_size=4))
def test_whole_tensors_never_hold_less_than_an_even_share(tensors: list[list[int]]) -> None:
    """Whatever the tensors, torch's ZeRO-1 stage holds at least what the even share gives (the ratio is >= 1)."""
    tensors = [sorted(t, reverse=True) for t in tensors]
    doc = make_profile_dict(4)
    for layer, counts in zip(doc["layers"], tensors, strict=True):
        layer.update(param_count=sum(counts), param_bytes=4 * sum(counts), tensor_counts=counts)
    profile = ir.ModelProfile.from_dict(doc)
    bare = dataclasses.replace(profile, layers=tuple(dataclasses.replace(x, tensor_counts=()) for x in profile.layers))
    assert _stage_static(profile, "torch")[0] >= _stage_static(bare, "torch")[0]

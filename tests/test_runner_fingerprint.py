"""runner.fingerprint: the trained weights' projections that `planner run --check` compares with one process's."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from planner.export.parallel import _conv1d_to_linear, fused_qkv_rows
from planner.runner.fingerprint import (
    GRAD_NOISE,
    SMALL_UPDATE,
    Reference,
    WeightCheck,
    fingerprints,
    gradient_norms,
    merge,
    noise_keys,
    project,
    read_check,
    reference,
    starting_values,
    weight_check,
)
from planner.runner.reference import WEIGHT_RTOL


def _layers() -> list[nn.Module]:
    torch.manual_seed(0)
    return [nn.Linear(4, 3), nn.Sequential(nn.LayerNorm(3), nn.Linear(3, 2))]


def _trained(layers: list[nn.Module], scale: float = 0.1) -> Reference:
    start = starting_values(layers)
    with torch.no_grad():
        for p in (p for layer in layers for p in layer.parameters()):
            p.add_(scale * torch.ones_like(p))
    return reference(layers, start)


def test_keys_name_the_layer_and_the_parameter_in_module_order() -> None:
    assert list(fingerprints(_layers(), [0, 1])) == ["0.weight", "0.bias", "1.0.weight", "1.0.bias", "1.1.weight",
                                                     "1.1.bias"]
    assert list(fingerprints(_layers(), [1])) == ["1.0.weight", "1.0.bias", "1.1.weight", "1.1.bias"]


def test_a_projection_is_linear_and_its_difference_reads_as_the_weights_difference() -> None:
    """p(w + d) - p(w) = p(d) (to the fp32 sum's rounding), and over many directions |p(d)| averages
    |d| sqrt(2 / pi) (a standard normal)."""
    layer = nn.Linear(200, 50)
    before = fingerprints([layer], [0])["0.weight"]
    d = torch.randn(50, 200) * 1e-3
    with torch.no_grad():
        layer.weight.add_(d)
    after = fingerprints([layer], [0])["0.weight"]
    assert after - before == pytest.approx(project("0.weight", d),
                                         rel=1e-5)  # w + d rounded to fp32
    draws = [abs(project(f"k{i}", d)) for i in range(400)]
    assert sum(draws) / len(draws) == pytest.approx(float(d.norm()) * math.sqrt(2 / math.pi), rel=0.1)


@settings(max_examples=20, deadline=None)
@given(tp=st.sampled_from([1, 2, 4]), fused=st.booleans())
def test_a_conv1d_rewritten_as_a_linear_projects_as_the_conv1d_did(tp: int, fused: bool) -> None:
    """Tensor parallelism turns GPT-2's Conv1D ([in, out]) into a Linear ([out, in]), c_attn's rows reordered per
    rank: read back in the model's layout, its projections are the Conv1D's to rounding."""
    from transformers.pytorch_utils import Conv1D

    hidden = 8
    parent = nn.Module()
    parent.add_module("c", Conv1D(3 * hidden if fused else hidden, hidden))
    before = fingerprints([parent], [0])
    _conv1d_to_linear(parent, "c", fused_qkv_rows(hidden, tp) if fused else None)
    assert isinstance(parent.c, nn.Linear)
    after = fingerprints([parent], [0])
    assert after.keys() == before.keys()
    for key, value in before.items():
        assert after[key] == pytest.approx(value, rel=1e-12, abs=1e-12)


def test_equal_weights_differ_by_nothing_and_a_perturbed_one_by_its_share_of_the_update() -> None:
    layers = _layers()
    ref = _trained(layers)
    got = merge([fingerprints(layers, [0]), fingerprints(layers, [1])])
    check = weight_check(got, ref)
    assert check == WeightCheck(0.0, "", 6, ())
    with torch.no_grad():
        layers[1][1].weight.add_(0.05 * torch.randn(2, 3))  # half its update of 0.1 a value, in size
    check = weight_check(merge([fingerprints(layers, [0, 1])]), ref)
    assert check.worst == "1.1.weight" and 0.02 < check.max_rel_diff < 2.5  # type: ignore[operator]


def test_a_frozen_parameter_that_moved_is_judged_against_the_models_largest_update() -> None:
    """Its own update is 0: a rank that trained it differs by a multiple of SMALL_UPDATE's share of the largest."""
    layers = _layers()
    ref = _trained(layers)
    ref = Reference(ref.projections, {**ref.update_norms, "0.bias": 0.0})
    largest = max(ref.update_norms.values())
    with torch.no_grad():
        layers[0].bias.add_(0.01)
    check = weight_check(merge([fingerprints(layers, [0, 1])]), ref)
    assert check.worst == "0.bias"
    diff = abs(fingerprints(layers, [0])["0.bias"] - ref.projections["0.bias"])
    assert check.max_rel_diff == pytest.approx(diff / (SMALL_UPDATE * largest))


def test_every_ranks_copy_counts_and_one_that_drifted_is_the_worst() -> None:
    layers = _layers()
    ref = _trained(layers)
    good = fingerprints(layers, [0, 1])
    drifted = {**good, "0.weight": good["0.weight"] + 1.0}
    check = weight_check(merge([good, drifted]), ref)
    assert check.worst == "0.weight" and check.compared == 6 and check.max_rel_diff > 1  # type: ignore[operator]


def test_a_weight_not_finite_is_none_and_keys_either_side_alone_are_told() -> None:
    layers = _layers()
    ref = _trained(layers)
    got = fingerprints(layers, [0])
    check = weight_check(merge([{**got, "0.bias": math.nan, "9.extra": 1.0}]), ref)
    assert check.max_rel_diff is None and check.worst == "0.bias" and check.compared == 2
    assert check.missing == ("1.0.weight", "1.0.bias", "1.1.weight", "1.1.bias")


def test_the_run_documents_keys_read_back() -> None:
    check = WeightCheck(3e-4, "2.block.q.weight", 21, ("0.wte.weight",), ("1.block.k.bias",))
    doc = check.to_dict()
    assert set(doc) == {"max_rel_weight_diff", "worst_weight", "weights_compared", "weights_missing",
                        "weights_unjudged"}
    assert read_check(doc) == check
    assert read_check({"losses": [1.0]}) is None
    assert read_check({**doc, "max_rel_weight_diff": None}) == WeightCheck(None, "2.block.q.weight", 21,
                                                                             ("0.wte.weight",), ("1.block.k.bias",))


class _Attention(nn.Module):
    """One head of self-attention with q, k and v of their own: the key's bias shifts every score of a query alike,
    which softmax ignores, so its exact gradient is 0."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k, self.v = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.q(x) @ self.k(x).transpose(-1, -2) / math.sqrt(8)
        return torch.softmax(scores, dim=-1) @ self.v(x)


def _adam_steps(attn: nn.Module, pieces: int) -> list[dict[str, float]]:
    """Three Adam steps on fixed data, each step's gradient summed over ``pieces`` shares of the batch (as a plan
    splits it); every step's gradient norms (fingerprint.gradient_norms)."""
    opt = torch.optim.Adam(attn.parameters(), lr=1e-3)
    grads = []
    for step in range(3):
        x = 10 * torch.randn(8, 6, 8, generator=torch.Generator().manual_seed(step))
        opt.zero_grad()
        for piece in x.chunk(pieces):
            (attn(piece).pow(2).mean() / pieces).backward()
        grads.append(gradient_norms([attn]))
        opt.step()
    return grads


def test_a_key_bias_whose_gradient_is_rounding_noise_is_compared_but_not_judged() -> None:
    """Its fp32 gradient is a few ulps set by the summation order and Adam moves it by lr whatever that noise is:
    two correct ways of summing the batch disagree on it by a large share of its update (ViT, ZeRO-2, Adam: 4.8e-2,
    a false failure) while every other weight agrees. It is found as noise, compared, and left out of the largest
    difference."""
    one, two = _Attention(), _Attention()
    start = starting_values([one])
    noise = noise_keys(_adam_steps(one, 1))
    _adam_steps(two, 4)
    assert noise == {"0.k.bias"}
    judged_all = weight_check(merge([fingerprints([two], [0])]), reference([one], start))
    assert judged_all.worst == "0.k.bias" and judged_all.max_rel_diff > WEIGHT_RTOL["fp32"]  # type: ignore[operator]
    check = weight_check(merge([fingerprints([two], [0])]), reference([one], start, noise))
    assert check.max_rel_diff < 1e-4 and check.unjudged == ("0.k.bias",) and check.compared == 6  # type: ignore[operator]
    nan = weight_check(merge([{**fingerprints([two], [0]), "0.k.bias": math.nan}]), reference([one], start, noise))
    assert nan.max_rel_diff is None and nan.worst == "0.k.bias"  # not finite is judged all the same


@given(scale=st.floats(1e-3, 1e3), real=st.floats(1e-6, 1.0), noise=st.floats(1e-14, 1e-8))
def test_noise_is_a_gradient_under_grad_noise_of_the_largest_not_zero_and_not_a_small_real_one(
        scale: float, real: float, noise: float) -> None:
    """BERT's query bias, the smallest real gradient measured, was 4e-6 of the largest; key biases 1e-12 to 1.4e-10;
    a parameter with a gradient of exactly 0 (a token that never came) is judged: any move of it is a bug."""
    steps = [{"a": scale, "b": real * scale, "c": noise * scale, "z": 0.0}, {"a": scale / 2, "c": noise * scale}]
    assert noise_keys(steps) == {"c"}
    assert 1e-8 < GRAD_NOISE < 1e-6


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 60), chunk=st.integers(1, 16))
def test_a_projection_drawn_in_chunks_is_linear_and_the_same_in_every_process(n: int, chunk: int) -> None:
    """The direction is drawn a chunk at a time (a large embedding's float64 copies stay small): still linear in
    the value, a standard normal's dot product, and the same for the same key wherever it is computed."""
    import planner.runner.fingerprint as fp

    a, b = torch.randn(n, dtype=torch.float64), torch.randn(n, dtype=torch.float64)
    old = fp.CHUNK
    fp.CHUNK = chunk
    try:
        assert project("k", a + b) == pytest.approx(project("k", a) + project("k", b), rel=1e-9, abs=1e-9)
        assert project("k", a) == project("k", a.clone().reshape(-1, 1))
    finally:
        fp.CHUNK = old

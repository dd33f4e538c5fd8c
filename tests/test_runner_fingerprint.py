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
    SMALL_UPDATE,
    Reference,
    WeightCheck,
    _direction,
    fingerprints,
    merge,
    read_check,
    reference,
    starting_values,
    weight_check,
)


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
    assert after - before == pytest.approx(float(d.double().flatten() @ _direction("0.weight", d.numel())),
                                         rel=1e-5)  # w + d rounded to fp32
    draws = [abs(float(d.double().flatten() @ _direction(f"k{i}", d.numel()))) for i in range(400)]
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
    check = WeightCheck(3e-4, "2.block.q.weight", 21, ("0.wte.weight",))
    doc = check.to_dict()
    assert set(doc) == {"max_rel_weight_diff", "worst_weight", "weights_compared", "weights_missing"}
    assert read_check(doc) == check
    assert read_check({"losses": [1.0]}) is None
    assert read_check({**doc, "max_rel_weight_diff": None}) == WeightCheck(None, "2.block.q.weight", 21,
                                                                             ("0.wte.weight",))

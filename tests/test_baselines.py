"""baselines: the partitioners of DeepSpeed, torchgpipe and PipeDream, reimplemented faithfully."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner import ir
from planner.search import baselines as bl
from tests.conftest import make_profile_dict

# ----------------------------------------------------------------------------- DeepSpeed


def test_partition_uniform_spreads_the_residual_over_the_first_parts() -> None:
    assert bl.partition_uniform(10, 4) == [0, 3, 6, 8, 10]
    assert bl.partition_uniform(8, 4) == [0, 2, 4, 6, 8]
    assert bl.partition_uniform(3, 5) == [0, 1, 2, 3, 3, 3]  # DeepSpeed's own edge case


def test_partition_balanced_on_a_vgg_like_model_isolates_the_big_classifier() -> None:
    # 13 convolutions of few parameters, then three fully-connected layers holding most
    weights = [2_000] * 13 + [100_000_000, 16_000_000, 4_000_000]
    parts = bl.partition_balanced(weights, 2)
    assert parts == [0, 14, 16]


def test_deepspeed_parameters_counts_a_tied_weight_in_every_layer_that_holds_it() -> None:
    doc = make_profile_dict(4)
    doc["ties"] = [{"name": "wte", "layers": [0, 3], "param_count": 1000, "param_bytes": 4000}]
    profile = ir.ModelProfile.from_dict(doc)
    counts = bl.deepspeed_layer_weights(profile)
    assert counts[3] == profile.layers[3].param_count + 1000
    assert counts[0] == profile.layers[0].param_count


ds_utils = None
try:  # DeepSpeed is a dev extra; the comparison runs wherever it is installed
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from deepspeed.runtime import utils as ds_utils  # type: ignore[no-redef]
except Exception:  # any import failure means "not available here"
    ds_utils = None

needs_deepspeed = pytest.mark.skipif(ds_utils is None, reason="deepspeed is not importable")


@needs_deepspeed
@given(st.integers(0, 40), st.integers(1, 12))
def test_partition_uniform_equals_deepspeed(items: int, parts: int) -> None:
    assert bl.partition_uniform(items, parts) == list(ds_utils.partition_uniform(items, parts))


@needs_deepspeed
@given(st.lists(st.integers(0, 10**8), min_size=1, max_size=24), st.integers(1, 8))
def test_partition_balanced_equals_deepspeed(weights: list[int], parts: int) -> None:
    assert bl.partition_balanced(weights, parts) == [int(x) for x in ds_utils.partition_balanced(weights, parts)]


@needs_deepspeed
@given(st.lists(st.floats(0, 1e3, allow_nan=False), min_size=1, max_size=16), st.integers(1, 6))
def test_partition_balanced_equals_deepspeed_on_floats(weights: list[float], parts: int) -> None:
    assert bl.partition_balanced(weights, parts) == [int(x) for x in ds_utils.partition_balanced(weights, parts)]


# ----------------------------------------------------------------------------- torchgpipe


def test_block_partition_matches_torchgpipes_own_tests() -> None:
    # torchgpipe tests/test_balance.py: solve([1..6], 2) == [[1, 2, 3, 4], [5, 6]]; solve([0, 0], 2)
    assert bl.block_partition([1, 2, 3, 4, 5, 6], 2) == [4, 2]
    assert bl.block_partition([0, 0], 2) == [1, 1]
    with pytest.raises(ValueError):
        bl.block_partition([42], 0)
    with pytest.raises(ValueError):
        bl.block_partition([42], 2)


@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=30), st.integers(1, 8))
def test_block_partition_is_a_partition(seq: list[int], parts: int) -> None:
    if parts > len(seq):
        return
    balance = bl.block_partition(seq, parts)
    assert len(balance) == parts and sum(balance) == len(seq)
    assert all(b >= 1 for b in balance)


def test_balance_by_time_uses_forward_times_in_microseconds() -> None:
    doc = make_profile_dict(6)
    for i, layer in enumerate(doc["layers"]):
        layer["forward_s"] = (i + 1) / 100  # torchgpipe's test: Delay(i/100) for i in 1..6
    assert bl.balance_by_time(ir.ModelProfile.from_dict(doc), 2) == [4, 2]


# ----------------------------------------------------------------------------- PipeDream


def test_pipedream_single_level_is_pure_data_parallel_when_communication_is_free() -> None:
    stages = bl.pipedream_partition([1.0] * 6, [0.0] * 6, [(4, 1e12)])
    assert stages == [bl.PipeDreamStage(0, 6, 4)]


def test_pipedream_puts_weight_heavy_layers_on_few_replicas() -> None:
    # compute in the first layers, parameters in the last one, slow network: PipeDream
    # replicates the compute-heavy front and leaves the weight-heavy tail on one device
    times = [1.0, 1.0, 1.0, 0.01]
    params = [1e3, 1e3, 1e3, 4e8]
    stages = bl.pipedream_partition(times, params, [(4, 1.25e8)])
    assert stages[-1] == bl.PipeDreamStage(3, 4, 1)
    assert sum(s.replicas for s in stages) == 4
    assert stages[0].first == 0 and stages[-1].end == 4


def test_pipedream_hierarchy_multiplies_replicas_across_servers() -> None:
    times = [1.0] * 8
    stages = bl.pipedream_partition(times, [0.0] * 8, [(2, 1e10), (4, 1e9)])
    # free weight sync: data parallel everywhere, 2 GPUs per server x 4 servers
    assert stages == [bl.PipeDreamStage(0, 8, 8)]


@given(st.lists(st.floats(1e-3, 1.0), min_size=1, max_size=10), st.integers(1, 4), st.integers(1, 3))
def test_pipedream_stages_cover_the_layers_and_use_every_device(times: list[float], per: int, servers: int) -> None:
    params = [1e6 * (i + 1) for i in range(len(times))]
    stages = bl.pipedream_partition(times, params, [(per, 1e10), (servers, 1e9)])
    assert stages[0].first == 0 and stages[-1].end == len(times)
    assert all(a.end == b.first for a, b in itertools.pairwise(stages))
    assert sum(s.replicas for s in stages) == per * servers

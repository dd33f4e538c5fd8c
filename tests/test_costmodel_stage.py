"""costmodel.stage: a tied weight's copy and gradient all-reduce follow the holding stage's layout."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner import costmodel as cm
from planner import ir
from planner.cluster import cluster_from_dict, group_of
from planner.costmodel.layers import FORM_INDEX, Grid, layer_table
from planner.costmodel.precision import OPTIMIZER_BYTES_PER_PARAM
from planner.costmodel.stage import tie_copy_on, tie_grad_bytes, tie_shares
from planner.errors import FormatError
from tests.conftest import make_cluster_dict, make_profile_dict

TIE = {"name": "wte", "layers": [0, 3], "param_count": 250_000, "param_bytes": 1_000_000}
"""The whole of layer 0 of the contract profile (250,000 fp32 parameters), tied to layer 3."""


def _profile(tie: dict[str, Any] = TIE, trainable: int | None = None) -> ir.ModelProfile:
    """Four 1 MB layers whose weight shapes are known (the split forms open), layers 0 and 3 tied."""
    doc = make_profile_dict(4, ties=[tie])
    for layer in doc["layers"]:
        layer.update(in_features=500, out_features=500)
    if trainable is not None:
        doc["layers"][0]["trainable_count"] = trainable
    return ir.ModelProfile.from_dict(doc)


def _two_stages(width: int, tp: int, form: str, zero: int = 0) -> tuple[ir.Cluster, list[ir.Stage]]:
    """Layers 0-1 on server 0, 2-3 on server 1, ``width`` GPUs each as a ``tp`` x ``width/tp`` grid."""
    cluster = cluster_from_dict(make_cluster_dict(2, width))
    return cluster, [ir.Stage((a, a + 2), tuple(f"n{n}.g{g}" for g in range(width)), (form, form), 0, tp=tp,
                              zero=zero) for n, a in ((0, 0), (1, 2))]


def _tie_terms(profile: ir.ModelProfile, cluster: ir.Cluster, stages: list[ir.Stage], optimizer: str = "sgd"
               ) -> tuple[int, float]:
    """The copy's bytes on the last stage and the tie's all-reduce there (with ties less without)."""
    with_ties = cm.stage_costs_for(profile, cluster, stages, 1, optimizer)[1]
    bare = cm.stage_cost_values(profile, cluster, stages[1], 1, optimizer, None)
    return with_ties.static_bytes - bare.static_bytes, with_ties.allreduce_s - bare.allreduce_s


def test_a_split_copy_is_a_tensor_shard_and_its_all_reduce_moves_the_shard() -> None:
    """At tp = 8 under split_out each device keeps 1/8 of the copy (sgd fp32: 8 bytes per parameter) and all-reduces
    1/8 of the gradient between the stages; at tp = 1 the whole copy and gradient, as before."""
    profile = _profile()
    cluster, split = _two_stages(8, 8, "split_out")
    inter = cluster.link("inter_node")
    copy, allreduce = _tie_terms(profile, cluster, split)
    assert copy == 8 * 250_000 // 8
    assert allreduce == pytest.approx(cm.ring_allreduce_s(1_000_000 / 8, 2, inter))
    cluster1, whole = _two_stages(1, 1, "dp")
    copy1, allreduce1 = _tie_terms(profile, cluster1, whole)
    assert copy1 == 8 * 250_000  # the whole copy: 4 bytes of weight and 4 of gradient a parameter
    assert allreduce1 == pytest.approx(cm.ring_allreduce_s(1_000_000, 2, inter))


def test_a_replicated_copy_stays_whole_on_every_tensor_rank() -> None:
    """Under the dp form the tensor group replicates the weights: the copy and its all-reduce are whole."""
    profile = _profile()
    cluster, replicated = _two_stages(8, 8, "dp")
    copy, allreduce = _tie_terms(profile, cluster, replicated)
    assert copy == 8 * 250_000
    assert allreduce == pytest.approx(cm.ring_allreduce_s(1_000_000, 2, cluster.link("inter_node")))


@pytest.mark.parametrize(("zero", "want"), [(0, 2_000_000), (1, 1_500_000), (2, 1_250_000), (3, 1_000_000)])
def test_zero_shards_the_copy_as_it_shards_the_owner_layer(zero: int, want: int) -> None:
    """tp = 2 split_out, dp = 2, adam fp32 (4 + 4 + 8 bytes per parameter, halved by the tensor split): ZeRO-1
    halves the state, ZeRO-2 the gradients too, ZeRO-3 everything; exactly the owner layer's charge there."""
    profile = _profile()
    cluster, stages = _two_stages(4, 2, "split_out", zero)
    copy, _ = _tie_terms(profile, cluster, stages, "adam")
    assert copy == want
    table = cm.cached_layer_table(profile, cm.stage_grid(cluster, stages[1], "fp32"), 1, "adam")
    assert copy == math.ceil(table.static[zero, 0, FORM_INDEX["split_out"]])


def test_a_tie_larger_than_the_layer_it_is_counted_in_is_refused_where_the_profile_is_built() -> None:
    """Built in Python, the profile refuses it as a file's is (tests/test_ir.py): one rule, in ModelProfile, where
    the cost model had its own copy; the shares the cost model charges are then at most 1."""
    profile = _profile()
    with pytest.raises(FormatError, match="larger than layer 0"):
        dataclasses.replace(profile, ties=(dataclasses.replace(profile.ties[0], param_count=300_000,
                                                               param_bytes=1_200_000),))
    with pytest.raises(FormatError, match="names layer 9"):
        dataclasses.replace(profile, ties=(dataclasses.replace(profile.ties[0], layers=(0, 9)),))
    assert all(0 <= share <= 1 for tie in profile.ties for share in tie_shares(profile, tie))


@settings(max_examples=60, deadline=None)
@given(tp_log=st.integers(0, 3), dp_log=st.integers(0, 1), form=st.sampled_from(ir.ALL_FORMS),
       zero=st.integers(0, 3), share=st.floats(0.0, 1.0), trainable=st.integers(0, 250_000),
       optimizer=st.sampled_from(sorted(OPTIMIZER_BYTES_PER_PARAM)), precision=st.sampled_from(["fp32", "bf16"]))
def test_a_copy_never_exceeds_the_owner_layers_charge_under_the_same_layout(
        tp_log: int, dp_log: int, form: str, zero: int, share: float, trainable: int, optimizer: str,
        precision: str) -> None:
    """For any layout, the copy of a tie that is part of its owner layer costs at most what the owner layer is
    charged there, exactly that when the tie is the whole layer, and 1/tp of the one-device copy under a tensor form
    without ZeRO; its gradient at most the owner's."""
    count = round(250_000 * share)
    profile = _profile({**TIE, "param_count": count, "param_bytes": 4 * count}, trainable)
    whole = _profile(TIE, trainable)
    tp, width = 2 ** tp_log, 2 ** (tp_log + dp_log)
    grid = Grid(group_of(cluster_from_dict(make_cluster_dict(1, 16)), [f"n0.g{g}" for g in range(width)]), tp,
                precision)
    table, f = layer_table(profile, grid, 1, optimizer), FORM_INDEX[form]
    tie = profile.ties[0]
    copy = tie_copy_on(profile, tie, table, f, zero)
    assert 0.0 <= copy <= table.static[zero, 0, f] * (1 + 1e-12)
    assert tie_copy_on(whole, whole.ties[0], table, f, zero) == pytest.approx(table.static[zero, 0, f])
    assert 0.0 <= tie_grad_bytes(profile, tie, table, f) <= table.grad[0, f] * (1 + 1e-12)
    if form != "dp" and zero == 0:
        alone = Grid(group_of(cluster_from_dict(make_cluster_dict(1, 16)), ["n0.g0"]), 1, precision)
        one = tie_copy_on(profile, tie, layer_table(profile, alone, 1, optimizer), FORM_INDEX["dp"], 0)
        assert copy == pytest.approx(one / tp, abs=1e-6)


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_a_zero_optimizer_step_updates_the_partition_its_memory_counts(zero: int) -> None:
    """Under ZeRO a dp-form layer in a tensor group of 2 keeps its state sharded over all 4 devices (its gradients are
    synchronised over them), so each device steps a quarter of it: the same as on a tp 1 x dp 4 grid, not the half
    that ``1 / dp`` alone would give (the time was twice as long, and search preferred the tp 1 grid for it)."""
    doc = make_cluster_dict(1, 4)
    for gpu in doc["nodes"][0]["gpus"]:
        gpu["memory_bandwidth_Bps"] = 1e11
    cluster, profile = cluster_from_dict(doc), ir.ModelProfile.from_dict(make_profile_dict(4, batch_size=8))
    devices = tuple(f"n0.g{g}" for g in range(4))
    steps = [cm.stage_cost_values(profile, cluster, ir.Stage((0, 4), devices, ("dp",) * 4, 0, tp=tp, zero=zero), 1,
                                  "adam", None).optimizer_step_s for tp in (1, 2)]
    whole = cm.stage_cost_values(profile, cluster, ir.Stage((0, 4), devices, ("dp",) * 4, 0, tp=1), 1, "adam",
                                 None).optimizer_step_s
    assert steps[1] == pytest.approx(steps[0])
    assert steps[0] == pytest.approx(whole / 4)


@pytest.mark.parametrize("engine", ["torch", "deepspeed", "any"])
def test_a_stage_running_both_ends_of_a_tie_holds_its_gradient_twice_at_one_micro_batch(engine: str) -> None:
    """The tie's second gradient is added into the first while both are held (twice its bytes, as measured); from
    two micro-batches on the largest layer's new gradient
    is counted already (planner.costmodel.variant), and the paper's count (engine any) has neither."""
    profile, untied = _profile(), ir.ModelProfile.from_dict(make_profile_dict(4))
    cluster = cluster_from_dict(make_cluster_dict(1, 2))
    whole = [ir.Stage((0, 4), ("n0.g0", "n0.g1"), ("dp",) * 4, 0)]
    for m in (1, 2):
        tied = cm.stage_costs_for(profile, cluster, whole, m, "sgd", engine=engine)[0]
        bare = cm.stage_costs_for(untied, cluster, whole, m, "sgd", engine=engine)[0]
        expect = 2 * TIE["param_bytes"] if (m == 1 and engine != "any") else 0
        assert tied.workspace_bytes - bare.workspace_bytes == expect, (m, engine)
    apart = _two_stages(1, 1, "dp")  # one end of the tie on each stage: nothing added
    split = cm.stage_costs_for(profile, *apart, 1, "sgd", engine="torch")
    bare_split = cm.stage_costs_for(untied, *apart, 1, "sgd", engine="torch")
    assert [c.workspace_bytes for c in split] == [c.workspace_bytes for c in bare_split]

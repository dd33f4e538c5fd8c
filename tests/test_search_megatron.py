"""planner.search.megatron: Megatron-LM's layouts for ``planner compare``'s ``megatron`` row."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from planner import ir
from planner.search import baselines as bl
from planner.search import megatron as mg
from tests.conftest import make_cluster_dict
from tests.test_baselines import _pc


def _llama(heads: int = 16, kv_heads: int = 8) -> ir.ModelProfile:
    """A Llama profile whose embedding and output layer do not carry their weight shapes (the split forms closed)."""
    from tests.test_export_torchtitan import llama_profile

    return llama_profile(6, heads=heads, kv_heads=kv_heads, shaped=False)


def test_megatron_tp_is_a_server_lowered_to_divide_the_heads() -> None:
    cluster = ir.Cluster.from_dict(make_cluster_dict(2, 4))
    assert bl.megatron_tp(_llama(16, 8), cluster) == 4
    assert bl.megatron_tp(_llama(2, 2), cluster) == 2  # 4 does not divide 2 heads


def test_megatron_layouts_are_tp_in_a_server_pipelines_and_data_parallel_rest() -> None:
    profile, cluster = _llama(), ir.Cluster.from_dict(make_cluster_dict(2, 4))
    layouts = bl.megatron_layouts(profile, cluster, (1, 2))
    assert isinstance(layouts, list)
    assert [(lay.config, lay.flags) for lay in layouts] == [
        ("8", ""), ("4-4", ""), ("4-4", "--decoder-first-pipeline-num-layers 2 --decoder-last-pipeline-num-layers 4"),
        ("4-4", "--decoder-first-pipeline-num-layers 4 --decoder-last-pipeline-num-layers 2")]
    assert {lay.tp for lay in layouts} == {4}
    two = layouts[1]
    assert [layers for layers, _, _ in two.stages] == [(0, 4), (4, 8)]  # 3 blocks each, Megatron's default
    assert [layers for layers, _, _ in layouts[2].stages] == [(0, 3), (3, 8)]  # 2 blocks, then 4
    assert two.stages[1][1] == ("n1.g0", "n1.g1", "n1.g2", "n1.g3")  # a stage on consecutive ranks
    forms = [f for _, _, fs in two.stages for f in fs]
    assert forms == ["dp"] + ["tp"] * 6 + ["dp"]  # the tp form on the blocks only
    plan = two.plan(profile, cluster, 2, "sgd")
    from planner.runnable import problems

    assert problems(plan) == [] and [s.dp for s in plan.stages] == [1, 1]
    assert bl.megatron_layouts(profile, cluster, (1, 2), uneven=False) == layouts[:2]
    cnn, _ = _pc(16)
    refused = bl.megatron_layouts(cnn, cluster, (1,))
    assert isinstance(refused, bl.NotFitting) and "transformer blocks" in refused.reason


def test_megatron_cuts_blocks_by_rank_counts_with_the_embedding_first_and_the_head_last() -> None:
    from tests.test_export_torchtitan import llama_profile

    profile = llama_profile(12)  # embedding, 12 blocks, head: 14 layers
    assert mg.megatron_parts(profile, (3, 3, 3, 3)) == [0, 4, 7, 10, 14]  # layers 4, 3, 3, 4
    assert mg.megatron_parts(profile, (1,) * 12) == [0, *range(2, 13), 14]
    assert mg.megatron_parts(profile, (2, 4, 4, 2), 2) == [0, 2, 4, 6, 7, 8, 10, 12, 14]  # chunk c on rank c mod 4
    with pytest.raises(ValueError, match="do not cover"):
        mg.megatron_parts(profile, (3, 3, 3))


def test_megatron_writes_a_layout_where_no_block_counts_run() -> None:
    """12 blocks on 8 ranks: ends of at most the middle's 2 would leave none for them; Megatron then runs the cut
    written out (--pipeline-model-parallel-layout): equal layer counts, the embedding and the head counted."""
    from tests.test_export_torchtitan import llama_profile

    profile = llama_profile(12, heads=16, kv_heads=8)
    assert mg.block_counts(12, 8) == []
    layouts = bl.megatron_layouts(profile, ir.Cluster.from_dict(make_cluster_dict(2, 4)), (8,), tp=1)
    assert isinstance(layouts, list)
    eight = [lay for lay in layouts if len(lay.stages) == 8]
    assert [layers for layers, _, _ in eight[0].stages] == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10), (10, 12),
                                                            (12, 13), (13, 14)]
    assert [lay.flags for lay in eight] == ["--pipeline-model-parallel-layout Et|t*2|t*2|t*2|t*2|t*2|t|L"]


def test_megatron_interleaved_layouts_put_chunk_c_on_stage_c_mod_pp() -> None:
    """Megatron's interleaved schedule: v chunks a rank where every rank's count divides by v, micro-batch counts
    that are multiples of pp, chunk c on pipeline rank c mod pp (SC'21 section 2.2), on 2 stages or more
    (Megatron-LM d98e8a6 asks for pp > 2 only with --no-overlap-p2p-communication; its default overlaps)."""
    from planner.runnable import problems
    from tests.test_export_torchtitan import llama_profile

    profile, cluster = llama_profile(12, heads=16, kv_heads=8), ir.Cluster.from_dict(make_cluster_dict(4, 4))
    layouts = bl.megatron_layouts(profile, cluster, (1, 2, 3, 4, 8), interleaved=True)
    assert isinstance(layouts, list)
    assert [(lay.config, lay.virtual_stages, lay.microbatches, lay.flags) for lay in layouts] == [
        ("8-8", 2, (2, 4, 8), ""), ("8-8", 3, (2, 4, 8), ""),
        ("8-8", 4, (2, 4, 8), "--decoder-first-pipeline-num-layers 4 --decoder-last-pipeline-num-layers 8 "
                              "--num-virtual-stages-per-pipeline-rank 4"),
        ("8-8", 4, (2, 4, 8), "--decoder-first-pipeline-num-layers 8 --decoder-last-pipeline-num-layers 4 "
                              "--num-virtual-stages-per-pipeline-rank 4"),
        ("8-8", 6, (2, 4, 8), ""),
        ("4-4-4-4", 2, (4, 8), "--decoder-first-pipeline-num-layers 2 --decoder-last-pipeline-num-layers 2 "
                               "--num-virtual-stages-per-pipeline-rank 2"),
        ("4-4-4-4", 3, (4, 8), "")]  # pp 1 has no interleaving
    four = layouts[-1]
    assert [layers for layers, _, _ in four.stages] == [(0, 2), *((i, i + 1) for i in range(2, 12)), (12, 14)]
    assert [devices[0] for _, devices, _ in four.stages] == ["n0.g0", "n1.g0", "n2.g0", "n3.g0"] * 3
    assert all(lay.schedule == "interleaved" and lay.tp == 4 for lay in layouts)
    plan = four.plan(profile, cluster, 4, "sgd")
    assert (plan.virtual_stages, plan.pipeline_stages, len(plan.stages)) == (3, 4, 12) and problems(plan) == []
    uneven = layouts[-2].plan(profile, cluster, 4, "sgd")
    assert [s.layers for s in uneven.stages] == [(0, 2), (2, 4), (4, 6), (6, 7), (7, 8), (8, 10), (10, 12), (12, 14)]
    assert problems(uneven) == []
    assert bl.megatron_layouts(profile, cluster, (3,), interleaved=True) == []  # no multiple of pp
    two = layouts[0].plan(profile, cluster, 2, "sgd")
    assert (two.virtual_stages, two.pipeline_stages) == (2, 2) and problems(two) == []
    from planner.judge import judge

    assert judge(two).plan.predicted.iteration_s > 0  # the simulator plays it


def test_megatron_tries_every_tensor_degree_that_divides_a_server_and_the_heads() -> None:
    """Megatron-LM runs any --tensor-model-parallel-size that divides the heads (Megatron-Core's TransformerConfig
    check) and the GPUs; inside a server of 4: 4, 2 and 1, the server's first; 2 heads: 2 and 1."""
    cluster = ir.Cluster.from_dict(make_cluster_dict(2, 4))
    assert bl.megatron_tps(_llama(16, 8), cluster) == (4, 2, 1)
    assert bl.megatron_tps(_llama(2, 2), cluster) == (2, 1)
    assert bl.megatron_tps(_llama(8, 1), cluster) == (1,)  # one KV head: only tp 1 shards it whole
    for tp in (4, 2, 1):
        layouts = bl.megatron_layouts(_llama(16, 8), cluster, (1, 2), tp=tp, uneven=False)
        assert isinstance(layouts, list) and {lay.tp for lay in layouts} == {tp}
        assert [lay.config for lay in layouts] == [ir.config_string([8 // pp] * pp) for pp in bl.divisors(8 // tp)]
    one = bl.megatron_layouts(_llama(16, 8), cluster, (1,), tp=1)
    assert isinstance(one, list) and {f for _, _, fs in one[0].stages for f in fs} == {"dp"}


def test_megatron_keeps_blocks_the_engines_do_not_shard_at_tp_1() -> None:
    import dataclasses

    profile = _llama(16, 8)
    layers = tuple(dataclasses.replace(x, block=dataclasses.replace(x.block, shardable=False)) if x.block else x
                   for x in profile.layers)
    assert bl.megatron_tps(dataclasses.replace(profile, layers=layers), ir.Cluster.from_dict(make_cluster_dict(2, 4))
                           ) == (1,)


def _rules_brute(blocks: int, pp: int, v: int) -> set[tuple[int, ...]]:
    """Every count per rank Megatron accepts (module doc of planner.search.megatron: positive, multiples of v, the
    ranks between the ends equal), with the ends at most the middle's, filtered to the least middle share (or one
    block more under 1F1B)."""
    valid = set()
    for counts in itertools.product(range(v, blocks + 1, v), repeat=pp):
        middle = set(counts[1:-1])
        if sum(counts) == blocks and len(middle) <= 1 and all(c <= max(middle, default=max(counts))
                                                               for c in (counts[0], counts[-1])):
            valid.add(counts)
    if not valid:
        return valid
    least = min(max(c) for c in valid)
    return {c for c in valid if max(c) <= least + (1 if v == 1 else 0)}


@given(st.integers(1, 14), st.integers(1, 5), st.integers(1, 4))
def test_block_counts_are_megatrons_rules_at_the_least_share_by_brute_force(blocks: int, pp: int, v: int) -> None:
    counts = mg.block_counts(blocks, pp, v)
    assume(pp > 1 or v == 1)
    expected = _rules_brute(blocks, pp, v) if pp > 1 else ({(blocks,)} if blocks >= 1 else set())
    assert set(counts) == expected and len(counts) == len(set(counts))
    if blocks % (pp * v) == 0:
        assert counts[0] == (blocks // pp,) * pp  # Megatron's default first, where it divides


def _shaped_llama(dtype: str = "float32") -> ir.ModelProfile:
    """A Llama profile whose embedding and output layer carry their weight shapes (the split forms open)."""
    import dataclasses

    profile = _llama(16, 8)
    layers = list(profile.layers)
    layers[0] = dataclasses.replace(layers[0], in_features=32000, out_features=256)
    layers[-1] = dataclasses.replace(layers[-1], in_features=256, out_features=32000)
    return dataclasses.replace(profile, layers=tuple(layers), dtype=dtype)


def test_megatron_shards_the_embedding_and_output_layer_so_a_micro_batch_of_one_runs() -> None:
    # Megatron-LM runs the vocabulary-parallel embedding and a column-parallel output layer (Shoeybi et
    # al. 2019, section 3): every rank of the tensor group takes the whole micro-batch.
    from planner.runnable import problems
    profile, cluster = _shaped_llama(), ir.Cluster.from_dict(make_cluster_dict(2, 4))
    layouts = bl.megatron_layouts(profile, cluster, (8,))
    assert isinstance(layouts, list)
    forms = [f for _, _, fs in layouts[1].stages for f in fs]
    assert forms == ["split_in"] + ["tp"] * 6 + ["split_out"]
    one_sample = layouts[1].plan(profile, cluster, 8, "sgd")  # batch 8 in 8 micro-batches of one sample
    assert problems(one_sample) == []
    unshaped = bl.megatron_layouts(_llama(16, 8), cluster, (8,))
    assert isinstance(unshaped, list) and unshaped[1].stages[0][2][0] == "dp"  # no weight shape: no split form


def test_a_baseline_trains_in_the_profiles_precision_as_the_planners_row_does() -> None:
    cluster = ir.Cluster.from_dict(make_cluster_dict(2, 4))
    for dtype, precision in (("bfloat16", "bf16"), ("float32", "fp32")):
        layouts = bl.megatron_layouts(_shaped_llama(dtype), cluster, (2,))
        assert isinstance(layouts, list)
        assert layouts[0].plan(_shaped_llama(dtype), cluster, 2, "sgd").precision == precision
        assert bl.dp_layout(_shaped_llama(dtype), cluster).plan(_shaped_llama(dtype), cluster, 1, "sgd").precision \
            == precision



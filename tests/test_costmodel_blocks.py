"""planner.costmodel.blocks: a transformer block under Megatron-LM's tp form (replicated work, activations)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner import costmodel as cm
from planner import ir
from planner.cluster import cluster_from_dict, group_of
from planner.costmodel.blocks import block_activation_ratios, tp_shares
from tests.conftest import make_cluster_dict
from tests.test_export_torchtitan import llama_profile


def _replicated(profile: ir.ModelProfile, fwd: float, bwd: float) -> ir.ModelProfile:
    """``profile`` with every block's forward and backward ``fwd``/``bwd`` of their time replicated under tp."""
    return dataclasses.replace(profile, layers=tuple(
        dataclasses.replace(x, forward_replicated_s=fwd * x.forward_s, backward_replicated_s=bwd * x.backward_s)
        if x.block is not None else x for x in profile.layers))


@given(st.sampled_from([2, 4, 8]), st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.booleans())
def test_each_rank_runs_a_share_of_the_sharded_part_and_the_replicated_part_whole(tp: int, fwd: float, bwd: float,
                                                                                   sp: bool) -> None:
    """Korthikanti et al. 2022, section 4.2.2: without sequence parallelism the norms and residual adds (share r)
    run whole on each of the t ranks, the rest 1/t of it: (1 - r)/t + r; with it, 1/t of everything."""
    profile = _replicated(llama_profile(2), fwd, bwd)
    f_share, b_share = tp_shares(profile, tp, sp)
    for share, r in ((f_share, fwd), (b_share, bwd)):
        assert share[1] == pytest.approx(1 / tp if sp else (1 - r) / tp + r)
        assert share[0] == share[-1] == pytest.approx(1 / tp)  # not blocks: nothing recorded, all of it divides
    assert np.all(tp_shares(llama_profile(2), tp, False)[0] == 1 / tp)  # unknown (measured profiles): it divides


@pytest.mark.parametrize("sp", [False, True])
def test_a_tp_block_pays_its_replicated_time_on_every_rank_without_sequence_parallelism(sp: bool) -> None:
    tp, r = 4, 0.1
    plain, profile = llama_profile(2), _replicated(llama_profile(2), r, r)
    cluster = cluster_from_dict(make_cluster_dict(1, 4, 10**12))
    grid = cm.Grid(group_of(cluster, [g.name for g in cluster.gpus]), tp, "fp32", sp)
    base, table = cm.layer_table(plain, grid, 1, "adam"), cm.layer_table(profile, grid, 1, "adam")
    extra = 0.0 if sp else r * (1 - 1 / tp)  # the replicated share, whole where 1/t was charged
    for got, want, whole in ((table.fwd, base.fwd, 1e-3), (table.bwd, base.bwd, 2e-3)):
        assert got[1, cm.TP] == pytest.approx(want[1, cm.TP] + extra * whole, rel=1e-9)
        assert np.array_equal(got[:, cm.DP], want[:, cm.DP]) and got[0, cm.TP] == want[0, cm.TP]


@pytest.mark.parametrize("tp", [1, 2, 8])
@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_a_block_whose_attention_ran_fused_has_no_attention_term_to_shard_or_drop(tp: int,
                                                                                   sequence_parallel: bool) -> None:
    """Korthikanti et al. Table 2 without 5as/h: a fused kernel kept no s x s weights, so the profiled bytes are
    the 34 s b h part alone; tensor parallelism scales it by (10 + 24/t)/34 (34/t with sequence parallelism) and
    selective recomputation drops nothing more."""
    eager = llama_profile(2)
    fused = dataclasses.replace(eager, layers=tuple(
        dataclasses.replace(lp, block=dataclasses.replace(lp.block, attention_saved=False)) if lp.block else lp
        for lp in eager.layers))
    act, sel, dp_sel = block_activation_ratios(fused, tp, sequence_parallel)
    rest = 34.0 / tp if sequence_parallel else 10.0 + 24.0 / tp
    assert act[1] == pytest.approx(rest / 34) and sel[1] == act[1] and dp_sel[1] == 1.0
    eager_act, eager_sel, _ = block_activation_ratios(eager, tp, sequence_parallel)
    assert eager_sel[1] < eager_act[1]  # eager attention kept the 5as/h term: selective drops it
    block = eager.layers[1].block
    assert block is not None and ir.BlockShape.from_dict(dataclasses.replace(block, attention_saved=False).to_dict()) \
        == dataclasses.replace(block, attention_saved=False)
    legacy = {k: v for k, v in block.to_dict().items() if k != "attention_saved"}
    assert ir.BlockShape.from_dict(legacy).attention_saved  # files written before the field counted the weights

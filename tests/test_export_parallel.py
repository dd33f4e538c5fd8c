"""export.parallel: Megatron sharding of transformer blocks (whole heads, GPT-2's fused Conv1D), refusals."""

from __future__ import annotations

import pytest
import torch

from planner.errors import ExportError
from planner.export import parallel
from tests.test_export_grids import tiny_gpt2


def _block() -> torch.nn.Module:
    from planner.profiler.layers import split_model

    torch.manual_seed(0)
    model, example = tiny_gpt2()
    return split_model(model, example).layers[1]


def test_fused_qkv_rows_give_each_rank_its_own_heads_of_q_k_and_v() -> None:
    rows = parallel.fused_qkv_rows(hidden=8, tp=2)  # 8 = 4 heads x 2 dims; rank 0 gets heads 0-1
    assert sorted(rows.tolist()) == list(range(24))
    assert rows[:12].tolist() == [0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19]
    assert rows[12:].tolist() == [4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23]


def test_gpt2_conv1d_becomes_an_equal_linear_with_permuted_qkv() -> None:
    block = _block()
    attn = block.get_submodule(parallel.block_parts(block, 0, 1).attn)
    x = torch.randn(3, 32)
    want = attn.c_attn(x)
    parallel._conv1d_to_linear(attn, "c_attn", parallel.fused_qkv_rows(32, 2))
    assert isinstance(attn.c_attn, torch.nn.Linear)
    torch.testing.assert_close(attn.c_attn(x), want[:, parallel.fused_qkv_rows(32, 2)])


def test_a_frozen_conv1d_becomes_a_frozen_linear() -> None:
    """A frozen GPT-2 block run tp once became trainable: the new Linear's weights defaulted to requires_grad."""
    block = _block()
    attn = block.get_submodule(parallel.block_parts(block, 0, 1).attn)
    attn.c_attn.weight.requires_grad_(False)
    attn.c_proj.requires_grad_(False)
    parallel._conv1d_to_linear(attn, "c_attn", parallel.fused_qkv_rows(32, 2))
    parallel._conv1d_to_linear(attn, "c_proj")
    assert not attn.c_attn.weight.requires_grad and attn.c_attn.bias.requires_grad
    assert not any(p.requires_grad for p in attn.c_proj.parameters())


def test_block_parts_find_gpt2_attention_and_mlp() -> None:
    assert parallel.block_parts(_block(), 0, 1) == parallel.BlockParts("gpt2", "block", "block.attn", "block.mlp")


def _bert_block() -> torch.nn.Module:
    from planner.profiler.layers import split_model
    from tests.test_export_parallel_runs import tiny_bert

    torch.manual_seed(0)
    model, example = tiny_bert()
    return split_model(model, example).layers[1]


def test_block_parts_find_berts_self_attention_and_intermediate_layer() -> None:
    block = _bert_block()
    parts = parallel.block_parts(block, 0, 1)
    assert parts == parallel.BlockParts("bert", "block", "block.attention.self", "block.intermediate")
    parallel.check_block(block, 2, 8, True, 0, 1)  # 4 heads over 2
    with pytest.raises(ExportError, match="4 heads"):
        parallel.check_block(block, 3, 8, False, 0, 1)


def test_heads_that_tp_does_not_divide_are_refused() -> None:
    with pytest.raises(ExportError, match="4 heads and 4 KV heads, which tp 3"):
        parallel.check_block(_block(), 3, 8, False, 0, 1)


def test_sequence_parallel_needs_a_sequence_tp_divides() -> None:
    with pytest.raises(ExportError, match="sequence of 9 tokens over tp 2"):
        parallel.check_block(_block(), 2, 9, True, 0, 1)


def test_a_layer_without_attention_and_mlp_cannot_run_the_tp_form() -> None:
    with pytest.raises(ExportError, match="stage 1: layer 4"):
        parallel.block_parts(torch.nn.Linear(4, 4), 1, 4)


def _moves(module: torch.nn.Sequential) -> list[tuple[int, str, str, str]]:
    """(layer, pre/post, source, destination) of every Relayout hook, in order."""
    out = []
    for j, layer in enumerate(module):
        out += [(j, "pre", str(h.src), str(h.dst)) for h in layer._forward_pre_hooks.values()
                if isinstance(h, parallel.Relayout)]
        out += [(j, "post", str(h.__self__.src), str(h.__self__.dst)) for h in layer._forward_hooks.values()
                if isinstance(getattr(h, "__self__", None), parallel.Relayout)]
    return out


def test_dp_runs_split_the_samples_and_gather_them_before_a_sharded_form_and_at_a_stage_end() -> None:
    """Only where the layout changes: into a run of dp layers (to Shard(0)), out of it (to Replicate); the
    last stage ends on the rank's share (its loss per share: no gather of the logits)."""
    forms = ["dp", "dp", "tp", "tp", "dp"]
    middle = torch.nn.Sequential(*(torch.nn.Identity() for _ in forms))
    parallel.split_samples(middle, forms, None)
    assert _moves(middle) == [(0, "pre", "R", "S(0)"), (2, "pre", "S(0)", "R"), (4, "pre", "R", "S(0)"),
                              (4, "post", "S(0)", "R")]
    assert parallel.sample_split(list(middle)) == [True, True, False, False, True]
    last = torch.nn.Sequential(*(torch.nn.Identity() for _ in forms))
    parallel.split_samples(last, forms, None, shard_output=True)
    assert _moves(last)[-1] == (4, "pre", "R", "S(0)")  # no gather after the last layer
    tensor_last = torch.nn.Sequential(torch.nn.Identity(), torch.nn.Identity())
    parallel.split_samples(tensor_last, ["dp", "tp"], None, shard_output=True)
    assert _moves(tensor_last) == [(0, "pre", "R", "S(0)"), (1, "pre", "S(0)", "R"), (1, "post", "R", "S(0)")]
    assert parallel.sample_split(list(tensor_last)) == [True, False]

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


def test_a_split_embedding_layer_shards_its_token_table_not_its_position_one() -> None:
    """GPT-2's first layer holds wte (the vocabulary) and wpe (the positions): the profile's weight shape is wte's."""
    from planner.profiler.layers import split_model
    from tests.test_export_grids import tiny_gpt2_untied

    model, example = tiny_gpt2_untied()
    first = split_model(model, example).layers[0]
    target = first.get_submodule(parallel.split_target(first, 0, 0, "split_in", "Embedding"))
    assert target is model.transformer.wte
    parallel.check_split(first, 2, 0, 0, "split_in", "Embedding")  # 64 tokens, 32 wide: both split over 2
    with pytest.raises(ExportError, match="64 vocabulary features do not split over 3"):
        parallel.check_split(first, 3, 0, 0, "split_in", "Embedding")
    with pytest.raises(ExportError, match="shards exactly one Embedding in a layer of type Embedding"):
        parallel.split_target(torch.nn.Sequential(torch.nn.Linear(2, 2)), 0, 0, "split_in", "Embedding")


class _Residual(torch.nn.Module):
    """``x + relu(fc(x))``: the layer's input is read twice."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.fc(x))


class _Normed(torch.nn.Module):
    """``relu(fc(norm(x)))``: a norm over the features before the Linear."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.fc = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(self.norm(x)))


def _split_layers(*blocks: torch.nn.Module) -> list[torch.nn.Module]:
    from planner.profiler.fxsplit import split_fx

    return list(split_fx(torch.nn.Sequential(*blocks), torch.randn(2, 8)).layers)


@pytest.mark.parametrize(("blocks", "pairs"), [
    ((torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.Dropout(0.0), torch.nn.Linear(8, 8)),
     [True, True]),  # activation functions and dropout act feature by feature
    ((torch.nn.Linear(8, 8), _Residual(8), _Residual(8)), [False, False]),  # the residual sum reads the input whole
    ((torch.nn.Linear(8, 8), _Normed(8), _Normed(8)), [False, False]),  # the norm joins layer 0, after its Linear
    ((torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 8), torch.nn.Softmax(-1)), [False]),
])
def test_a_column_layer_keeps_its_output_sharded_only_where_the_ops_up_to_the_row_layer_are_feature_wise(
        blocks: tuple[torch.nn.Module, ...], pairs: list[bool]) -> None:
    """split_out -> split_in: only where the features between the two Linears may stay sharded (else the column
    layer gathers them: a sharded residual or norm fails on the rank's share, 128 of 256 features)."""
    layers = _split_layers(*blocks)
    assert len(layers) == len(pairs) + 1
    pair = ["split_out", "split_in"]
    for j, expected in enumerate(pairs):
        module = torch.nn.Sequential(*layers[j:j + 2])
        targets = {k: parallel.split_target(module[k], 0, j + k, pair[k]) for k in range(2)}
        assert parallel.sharded_pair(module, pair, targets, 0) is expected, (j, layers[j].code, layers[j + 1].code)
        assert not parallel.sharded_pair(module, ["split_in", "split_out"], targets, 0)


@pytest.mark.parametrize("positions", [128, 64])
def test_a_split_embedding_layer_shards_the_table_of_the_profiles_shape(positions: int) -> None:
    """GPT-2 with a vocabulary of 64 and ``positions`` positions: the profile's weight shape is wte's (64 x 32). The
    export picked the table with the most rows: wpe where positions outnumber the tokens (a character-level model),
    and where they are as many it refused the split ('shards exactly one Embedding'), which planner.runnable
    accepts, so a torch plan failed at export."""
    from planner.profiler.core import profile_model
    from planner.profiler.layers import split_model
    from planner.profiler.loader import LoadedModel
    from planner.profiler.zoo import gpt2

    model = gpt2(n_layer=1, n_embd=32, n_head=4, vocab_size=64, n_positions=positions, bos_token_id=0,
                 eos_token_id=0, tie_word_embeddings=False)
    example = torch.randint(0, 64, (2, 8))
    prof = profile_model(LoadedModel("gpt2", model, example, (8,)), mode="analytic", device_flops="a100").layers[0]
    assert prof.type == "Embedding" and (prof.in_features, prof.out_features) == (64, 32)
    first = split_model(model, example).layers[0]
    shape = (prof.in_features, prof.out_features)
    for form in ("split_in", "split_out"):
        target = first.get_submodule(parallel.split_target(first, 0, 0, form, "Embedding", shape))
        assert target is model.transformer.wte
    parallel.check_split(first, 4, 0, 0, "split_in", "Embedding", shape)  # 64 tokens over 4 (128 positions too)
    with pytest.raises(ExportError, match="64 vocabulary features do not split over 3"):
        parallel.check_split(first, 3, 0, 0, "split_in", "Embedding", shape)

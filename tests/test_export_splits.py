"""export.splits: which module a split form shards (a Linear, the embedding of the profile's shape), its width
checks, and where a column-parallel layer hands a row-parallel one its output still sharded (export.featurewise)."""

from __future__ import annotations

import pytest
import torch

from planner.errors import ExportError
from planner.export import splits


def test_a_split_embedding_layer_shards_its_token_table_not_its_position_one() -> None:
    """GPT-2's first layer holds wte (the vocabulary) and wpe (the positions): the profile's weight shape is wte's."""
    from planner.profiler.layers import split_model
    from tests.test_export_grids import tiny_gpt2_untied

    model, example = tiny_gpt2_untied()
    first = split_model(model, example).layers[0]
    target = first.get_submodule(splits.split_target(first, 0, 0, "split_in", "Embedding"))
    assert target is model.transformer.wte
    splits.check_split(first, 2, 0, 0, "split_in", "Embedding")  # 64 tokens, 32 wide: both split over 2
    with pytest.raises(ExportError, match="64 vocabulary features do not split over 3"):
        splits.check_split(first, 3, 0, 0, "split_in", "Embedding")
    with pytest.raises(ExportError, match="shards exactly one Embedding in a layer of type Embedding"):
        splits.split_target(torch.nn.Sequential(torch.nn.Linear(2, 2)), 0, 0, "split_in", "Embedding")


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
        targets = {k: splits.split_target(module[k], 0, j + k, pair[k]) for k in range(2)}
        assert splits.sharded_pair(module, pair, targets, 0) is expected, (j, layers[j].code, layers[j + 1].code)
        assert not splits.sharded_pair(module, ["split_in", "split_out"], targets, 0)


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
        target = first.get_submodule(splits.split_target(first, 0, 0, form, "Embedding", shape))
        assert target is model.transformer.wte
    splits.check_split(first, 4, 0, 0, "split_in", "Embedding", shape)  # 64 tokens over 4 (128 positions too)
    with pytest.raises(ExportError, match="64 vocabulary features do not split over 3"):
        splits.check_split(first, 3, 0, 0, "split_in", "Embedding", shape)

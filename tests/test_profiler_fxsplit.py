"""profiler.fxsplit: cut points where one tensor crosses, runnable layers equal to the model, clear trace errors."""

from __future__ import annotations

import pickle
import re
from typing import Any

import pytest
import torch
from torch import nn

from planner.errors import TraceError
from planner.profiler.fxsplit import split_fx
from planner.profiler.layered import primary_output
from planner.profiler.loader import load_model


def check_exact(module: nn.Module, x: torch.Tensor, layers: tuple[nn.Module, ...], param_counts: tuple[int, ...]
                ) -> None:
    """The layers run in order equal the model bit for bit, on the model's own parameter objects.

    The model runs once before: a process's first forward of a small transformer (BLOOM's, in about one process of
    ten under pytest) was seen to differ in the last bit from every later one, the split's layers included."""
    module.eval()
    with torch.no_grad():
        module(x)
        want = primary_output(module(x))
        got = x
        for layer in layers:
            got = layer(got)
    assert torch.equal(want, got)
    assert {id(p) for layer in layers for p in layer.parameters()} == {id(p) for p in module.parameters()}
    assert sum(param_counts) == sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("name", ["mlp", "vgg11_bn", "resnet18"])
def test_split_runs_equal_the_whole_model(name: str) -> None:
    torch.manual_seed(0)
    loaded = load_model(name, 2, None if name == "mlp" else (3, 32, 32))
    lm = split_fx(loaded.module, loaded.example_input)
    check_exact(loaded.module, loaded.example_input, lm.layers, lm.param_counts)
    assert lm.method == "fx" and lm.blocks == () and lm.block(0) is None


@pytest.mark.parametrize(("name", "count"), [("vgg16", 16), ("vgg19", 19), ("resnet34", 18), ("resnet50", 18),
                                             ("resnet152", 52)])
def test_layer_counts(name: str, count: int) -> None:
    loaded = load_model(name, 2, device="meta")
    assert len(split_fx(loaded.module, loaded.example_input)) == count


def test_residual_block_is_one_layer_with_weight_facts() -> None:
    loaded = load_model("resnet50", 2, device="meta")
    lm = split_fx(loaded.module, loaded.example_input)
    assert lm.names[:3] == ("conv1", "layer1.0", "layer1.1")
    assert lm.types[:2] == ("Conv2d", "Bottleneck")
    assert (lm.in_features[0], lm.out_features[0]) == (3, 64)
    assert (lm.in_features[-1], lm.out_features[-1]) == (2048, 1000)


class _Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # input-dependent control flow: fx cannot trace it
            return self.fc(x)
        return -self.fc(x)


def test_untraceable_model_says_why_and_what_to_do() -> None:
    with pytest.raises(TraceError) as err:
        split_fx(_Branchy(), torch.randn(2, 4))
    assert "control flow" in err.value.cause or "control flow" in err.value.hint
    assert "nn.Sequential" in err.value.hint


def test_sequential_of_untraceable_blocks_splits_at_the_blocks() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(_Branchy(), nn.ReLU(), _Branchy())
    x = torch.randn(3, 4)
    lm = split_fx(model, x)
    assert lm.method == "fx-children" and len(lm) == 2
    with torch.no_grad():
        assert torch.equal(lm.run(x), model(x))


def test_fx_layers_pickle() -> None:
    loaded = load_model("mlp", 2)
    lm = split_fx(loaded.module, loaded.example_input)
    clone = pickle.loads(pickle.dumps(lm.layers[0]))
    with torch.no_grad():
        assert torch.equal(clone(loaded.example_input), lm.layers[0](loaded.example_input))


def test_layers_run_on_other_batch_sizes() -> None:
    """Pipeline engines run the layers on micro-batches: nothing is specialised to the traced batch."""
    torch.manual_seed(0)
    loaded = load_model("resnet18", 4, (3, 32, 32))
    lm = split_fx(loaded.module, loaded.example_input)
    micro = torch.randn(1, 3, 32, 32)
    loaded.module.eval()
    with torch.no_grad():
        assert torch.equal(lm.run(micro), primary_output(loaded.module(micro)))


class _TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(30, 8)
        self.body = nn.Linear(8, 8)
        self.head = nn.Linear(8, 30, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(self.emb(x))))


def test_fx_split_finds_tied_weights_and_counts_them_once() -> None:
    model = _TiedLM()
    lm = split_fx(model, torch.randint(0, 30, (2, 5)))
    assert lm.names == ("emb", "body", "head")
    assert len(lm.ties) == 1 and lm.ties[0].name == "emb.weight" and lm.ties[0].layers == (0, 2)
    assert lm.param_counts == (240, 72, 0)


def test_torch_transformer_layers_are_weighted_layers_of_their_own() -> None:
    """torch.fx keeps torch.nn's nn.TransformerEncoderLayer whole (a standard module): it holds linear layers and
    attention, so it is a layer of its own, not joined to the embedding before it (a stack of them was one layer,
    which no pipeline could cut)."""
    torch.manual_seed(0)
    blocks = [nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True) for _ in range(3)]
    model = nn.Sequential(nn.Embedding(50, 32), *blocks, nn.Linear(32, 50))
    x = torch.randint(0, 50, (2, 8))
    lm = split_fx(model, x)
    assert lm.method == "fx" and len(lm) == 5
    assert lm.types[1:4] == ("TransformerEncoderLayer",) * 3
    check_exact(model, x, lm.layers, lm.param_counts)


@pytest.mark.parametrize("norm", [True, False])
def test_a_torch_transformer_encoder_is_cut_into_its_layers(norm: bool) -> None:
    """nn.TransformerEncoder is a standard module, so fx kept it whole: a model built on it was one layer besides
    its embedding and head. Called without a mask it runs its layers one after another (and its norm), and is
    traced so; with a mask it stays whole."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 3, norm=nn.LayerNorm(32) if norm else None, enable_nested_tensor=False)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.encoder, self.head = nn.Embedding(50, 32), encoder, nn.Linear(32, 50)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.encoder(self.embed(x)))

    model, x = Model(), torch.randint(0, 50, (2, 8))
    lm = split_fx(model, x)
    assert lm.method == "fx" and len(lm) == 5
    assert lm.types[1:4] == ("TransformerEncoderLayer",) * 3
    check_exact(model, x, lm.layers, lm.param_counts)

    class Masked(Model):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            causal = nn.Transformer.generate_square_subsequent_mask(8)
            return self.head(self.encoder(self.embed(x), mask=causal))

    masked = Masked()
    assert len(split_fx(masked, x)) < 5


class _Outputs(nn.Module):
    """A model returning ``kind``: a dict of its logits and hidden state, or the pair as a tuple or list."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.fc, self.head, self.kind = nn.Linear(4, 4), nn.Linear(4, 2), kind

    def forward(self, x: torch.Tensor) -> Any:
        h = torch.relu(self.fc(x))
        if self.kind == "dict":
            return {"logits": self.head(h), "hidden": h}
        return (self.head(h), h) if self.kind == "tuple" else [self.head(h), h]


@pytest.mark.parametrize(("kind", "said"), [("dict", "a dict (keys 'logits', 'hidden')"), ("tuple", "a tuple of 2"),
                                            ("list", "a list of 2")])
def test_a_model_returning_several_values_is_refused_in_its_own_words(kind: str, said: str) -> None:
    """Before: 'returns immutable_dict' (torch.fx's own type), which names nothing the user wrote."""
    with pytest.raises(TraceError, match=re.escape(f"_Outputs.forward returns {said}, not one tensor")):
        split_fx(_Outputs(kind), torch.randn(2, 4))

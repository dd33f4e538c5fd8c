"""profiler.layers: cut points, runnable layers equal to the model, ties, clear trace errors."""

from __future__ import annotations

import pickle

import pytest
import torch
from torch import nn

from planner.errors import TraceError
from planner.profiler.layers import primary_output, split_model
from planner.profiler.loader import load_model
from planner.profiler.zoo import bert, gpt2


def _check_exact(module: nn.Module, x: torch.Tensor) -> None:
    lm = split_model(module, x)
    module.eval()
    with torch.no_grad():
        want = primary_output(module(x))
        got = lm.run(x)
    assert torch.equal(want, got)
    # the layers use the model's own parameter objects, not copies
    model_params = {id(p) for p in module.parameters()}
    layer_params = {id(p) for layer in lm.layers for p in layer.parameters()}
    assert layer_params == model_params
    assert sum(lm.param_counts) == sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("name", ["mlp", "vgg11", "vgg11_bn", "resnet18", "resnet50"])
def test_split_runs_equal_the_whole_model(name: str) -> None:
    torch.manual_seed(0)
    shape = None if name == "mlp" else (3, 32, 32)
    loaded = load_model(name, 2, shape)
    _check_exact(loaded.module, loaded.example_input)


def test_gpt2_tiny_split_is_exact_and_ties_wte_and_lm_head() -> None:
    torch.manual_seed(0)
    model = gpt2(n_layer=2, n_embd=64, n_head=4, vocab_size=101)
    x = torch.randint(0, 101, (2, 12))
    _check_exact(model, x)
    lm = split_model(model, x)
    assert lm.names[0] == "transformer.wte" and lm.names[-1] == "lm_head" and len(lm) == 4
    assert len(lm.ties) == 1
    tie = lm.ties[0]
    assert tie.name == "transformer.wte.weight" and tie.layers == (0, 3) and tie.param_count == 101 * 64
    assert lm.param_counts[-1] == 64 * 2  # ln_f only: lm_head.weight counted in layer 0


def test_bert_tiny_split_is_exact() -> None:
    torch.manual_seed(0)
    model = bert(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=99)
    _check_exact(model, torch.randint(0, 99, (2, 10)))


@pytest.mark.parametrize(("name", "count"), [("vgg16", 16), ("vgg19", 19), ("resnet34", 18), ("resnet50", 18),
                                             ("resnet152", 52), ("gpt2", 14)])
def test_layer_counts(name: str, count: int) -> None:
    loaded = load_model(name, 2, device="meta")
    lm = split_model(loaded.module, loaded.example_input)
    assert len(lm) == count


def test_residual_block_is_one_layer_with_weight_facts() -> None:
    loaded = load_model("resnet50", 2, device="meta")
    lm = split_model(loaded.module, loaded.example_input)
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
        split_model(_Branchy(), torch.randn(2, 4))
    assert "control flow" in err.value.cause or "control flow" in err.value.hint
    assert "nn.Sequential" in err.value.hint


def test_sequential_of_untraceable_blocks_splits_at_the_blocks() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(_Branchy(), nn.ReLU(), _Branchy())
    x = torch.randn(3, 4)
    lm = split_model(model, x)
    assert lm.method == "fx-children" and len(lm) == 2
    with torch.no_grad():
        assert torch.equal(lm.run(x), model(x))


def test_fx_layers_pickle() -> None:
    loaded = load_model("mlp", 2)
    lm = split_model(loaded.module, loaded.example_input)
    clone = pickle.loads(pickle.dumps(lm.layers[0]))
    with torch.no_grad():
        assert torch.equal(clone(loaded.example_input), lm.layers[0](loaded.example_input))


@pytest.mark.parametrize("name", ["vgg11", "resnet18", "gpt2"])
def test_layers_run_on_other_batch_sizes(name: str) -> None:
    """Pipeline engines run the layers on micro-batches: nothing is specialised to the traced batch."""
    torch.manual_seed(0)
    if name == "gpt2":
        model: nn.Module = gpt2(n_layer=1, n_embd=32, n_head=2, vocab_size=50)
        x, micro = torch.randint(0, 50, (4, 8)), torch.randint(0, 50, (1, 8))
    else:
        loaded = load_model(name, 4, (3, 32, 32))
        model, x, micro = loaded.module, loaded.example_input, torch.randn(1, 3, 32, 32)
    lm = split_model(model, x)
    model.eval()
    with torch.no_grad():
        assert torch.equal(lm.run(micro), primary_output(model(micro)))


def test_structural_splits_match_the_exported_data_flow() -> None:
    """torch.export (non-strict) + networkx: exactly one input-derived tensor crosses every cut."""
    from planner.profiler.layers import verify_cuts

    torch.manual_seed(0)
    for model in (gpt2(n_layer=2, n_embd=32, n_head=2, vocab_size=50, bos_token_id=0, eos_token_id=0),
                  bert(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                       vocab_size=50)):
        x = torch.randint(0, 50, (2, 8))
        lm = split_model(model, x)
        assert verify_cuts(model, x, lm) == [1] * (len(lm) - 1)


def test_verify_cuts_catches_a_cut_inside_a_residual_block() -> None:
    import dataclasses

    from planner.profiler.layers import verify_cuts

    model = gpt2(n_layer=1, n_embd=32, n_head=2, vocab_size=50, bos_token_id=0, eos_token_id=0)
    x = torch.randint(0, 50, (2, 8))
    lm = split_model(model, x)
    bad = dataclasses.replace(
        lm, layers=(*lm.layers, lm.layers[-1]), names=("emb", "ln_1", "rest", "head"),
        scopes=(lm.scopes[0], ("transformer.h.0.ln_1",), ("transformer.h.0",), lm.scopes[-1]))
    with pytest.raises(TraceError, match="2 tensors cross the cut after layer 1"):
        verify_cuts(model, x, bad)


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
    lm = split_model(model, torch.randint(0, 30, (2, 5)))
    assert lm.names == ("emb", "body", "head")
    assert len(lm.ties) == 1 and lm.ties[0].name == "emb.weight" and lm.ties[0].layers == (0, 2)
    assert lm.param_counts == (240, 72, 0)
    assert sum(lm.param_counts) == sum(p.numel() for p in model.parameters())

"""profiler.hfcode: decoders the planner has not named, recognised by their forwards' code and split as the family
whose code they run, exactly; the rest refused as before."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from planner.errors import TraceError
from planner.profiler.hfcode import code_of, family_of
from planner.profiler.hfsplit import split_hf
from planner.profiler.layers import split_model
from tests.test_profiler_hfsplit import _exact_both, family_model


class _Base:
    def forward(self, hidden: torch.Tensor, mask: Any = None) -> torch.Tensor:
        """Docstrings, annotations and decorators do not compute."""
        out: torch.Tensor = _FooNorm(hidden, eps=1e-5, scale=2)
        return out


class _Same:
    @staticmethod
    def wrapped(fn: Any) -> Any:
        return fn

    @wrapped
    def forward(self, hidden, mask=None):  # type: ignore[no-untyped-def]
        out = _BarNorm(hidden, scale=2, eps=1e-5)
        return out


class _Other:
    def forward(self, hidden: torch.Tensor, mask: Any = None) -> torch.Tensor:
        out: torch.Tensor = _FooNorm(hidden, eps=1e-5, scale=2)
        return out * 2


def _FooNorm(x: torch.Tensor, eps: float, scale: int) -> torch.Tensor:
    return x


_BarNorm = _FooNorm


def test_code_is_compared_without_docs_annotations_decorators_prefix_or_keyword_order() -> None:
    assert code_of(_Base.forward, "_Foo") == code_of(_Same.forward, "_Bar")
    assert code_of(_Base.forward, "_Foo") != code_of(_Other.forward, "_Foo")  # one more operation
    assert code_of(_Base.forward, "_Foo") != code_of(_Same.forward, "_Foo")  # another class's name
    assert code_of(len, "x") is None  # no source: never equal to anything


# (family, config fields beyond family_model's, the family whose forwards it runs, gated, shardable)
_RECOGNISED = [
    ("Helium", {"head_dim": 16}, "Llama", True, True),  # Llama's code throughout: sharded by the planner's tp
    ("Jais2", {"head_dim": 16}, "Llama", False, True),  # an ungated MLP (up and down), Arcee's
    ("Ernie4_5", {"head_dim": 16}, "Llama", True, True),
    ("Glm4", {"head_dim": 16}, "Llama", True, False),  # its decoder layer adds post-norms: not sharded
    ("SmolLM3", {"head_dim": 16}, "Qwen2", True, False),  # layers without rotary positions (NoPE): its own attention
    ("Ministral3", {"head_dim": 16}, "Mistral", True, False),
]


@pytest.mark.parametrize(("family", "fields", "runs", "gated", "shardable"), _RECOGNISED)
def test_decoders_running_a_known_familys_forwards_split_exactly(family: str, fields: dict[str, object], runs: str,
                                                                  gated: bool, shardable: bool) -> None:
    torch.manual_seed(0)
    model = family_model(family, **fields)
    assert family_of(model, ("Gemma", runs)) == runs and family_of(model.model, (runs,)) == runs
    lm = _exact_both(model, model.model, torch.randint(0, 96, (2, 16)), model.config.model_type)
    shape = lm.block(1)
    assert shape is not None and (shape.gated, shape.shardable) == (gated, shardable)


def test_a_forward_that_adds_to_the_familys_is_not_recognised() -> None:
    """MiniCPM3 scales its hidden states in the causal LM's forward: not Llama's; refused with the classes the planner
    splits (and how it recognises others). OLMo 3 masks each layer by its type in the model's forward: not Llama's
    code either, so named by hand (tests/test_profiler_hfmasks.py)."""
    model = family_model("MiniCPM3")
    assert family_of(model, ("Llama", "Mistral", "Qwen2")) is None
    with pytest.raises(TraceError, match="forwards are, as code"):
        split_model(model, torch.randint(0, 96, (2, 16)))
    assert family_of(family_model("Olmo3"), ("Llama", "Mistral", "Qwen2", "Olmo2")) is None


def test_a_subclass_that_overrides_the_forward_or_is_not_a_transformers_class_is_not_recognised() -> None:
    import transformers

    class Scaled(transformers.LlamaForCausalLM):  # type: ignore[misc]
        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return super().forward(*args, **kwargs)

    config = family_model("Llama").config
    assert family_of(Scaled(config), ("Llama",)) is None
    assert split_hf(Scaled(config), torch.randint(0, 96, (2, 16))) is None
    assert family_of(nn.Linear(2, 2), ("Llama",)) is None


@pytest.mark.parametrize(("family", "fields"), [
    ("Granite", {"embedding_multiplier": 12.0, "logits_scaling": 8.0, "residual_multiplier": 0.22,
                 "attention_multiplier": 0.0078125}),
    ("Cohere", {"logit_scale": 0.0625, "use_qk_norm": True}),
])
def test_llamas_with_scales_split_exactly_their_scales_in_the_end_layers(family: str, fields: dict[str, object]
                                                                          ) -> None:
    """Granite scales its embeddings and logits, Cohere its logits, in forwards otherwise Llama's (planner names
    them): split exactly, the scales in the first and last layers; Granite's blocks (Llama's attention and MLP,
    scaled residuals) are sharded, Cohere's (parallel attention and MLP, its own attention) are not, and a scaled
    embedding is not offered the vocabulary split."""
    torch.manual_seed(0)
    model = family_model(family, head_dim=16, **fields)
    assert family_of(model, ("Llama",)) is None  # the scales: not Llama's forwards, so named rather than recognised
    lm = _exact_both(model, model.model, torch.randint(0, 96, (2, 16)), family.lower())
    shape = lm.block(1)
    assert shape is not None and shape.gated and shape.shardable is (family == "Granite")
    assert (lm.in_features[0] is None) is (family == "Granite") and lm.in_features[-1] == 64


@pytest.mark.parametrize(("family", "fields"), [
    ("Phi", {"embd_pdrop": 0.1, "resid_pdrop": 0.1, "partial_rotary_factor": 0.5}),
    ("Starcoder2", {"embedding_dropout": 0.1, "residual_dropout": 0.1, "sliding_window": None}),
])
def test_llamas_with_an_embedding_dropout_split_exactly_in_training_too(family: str, fields: dict[str, object]
                                                                         ) -> None:
    """Phi and Starcoder2 drop out their embeddings in forwards otherwise Llama's (planner names them): split
    exactly, and in training mode the layers draw the same dropout masks as the model, in the same order."""
    torch.manual_seed(0)
    model = family_model(family, head_dim=16, **fields)
    x = torch.randint(0, 96, (2, 16))
    lm = _exact_both(model, model.model, x, family.lower())
    shape = lm.block(1)
    assert shape is not None and not shape.gated and not shape.shardable
    model.train()
    torch.manual_seed(1)
    want = model(x).logits
    got = x
    torch.manual_seed(1)
    for layer in lm.layers:
        got = layer.train()(got)
    assert torch.equal(want, got)

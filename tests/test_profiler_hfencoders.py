"""profiler.hfencoders: BERT, RoBERTa, XLM-RoBERTa and ViT split by structure, bit for bit, with their heads."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest
import torch
from torch import nn

from planner import ir
from planner.errors import TraceError
from planner.profiler.hfsplit import split_hf
from planner.profiler.layered import LayeredModel, primary_output
from planner.profiler.verify import verify_cuts
from tests.test_profiler_fxsplit import check_exact
from tests.test_profiler_hfsplit import _split


def encoder(name: str, **fields: object) -> nn.Module:
    """transformers' ``name`` (a BERT, RoBERTa or XLM-RoBERTa class) at hidden 64, 2 blocks of 4 heads, FFN 128,
    40 positions, 96 tokens, 3 labels (a bare model without its pooler, :func:`_built`)."""
    import transformers

    family = name.split("For")[0].removesuffix("Model")
    config = getattr(transformers, f"{family}Config")(vocab_size=96, hidden_size=64, num_hidden_layers=2,
                                                      num_attention_heads=4, intermediate_size=128,
                                                      max_position_embeddings=40, num_labels=3, **fields)
    return _built(getattr(transformers, name), config)


def _built(cls: type[nn.Module], config: object) -> nn.Module:
    """``cls(config)``; a bare model without its pooler (its output is not the model's first, and nothing trains it:
    the split leaves it out)."""
    pooled = cls.__name__.endswith("Model") and "add_pooling_layer" in inspect.signature(cls.__init__).parameters
    return cls(config, add_pooling_layer=False) if pooled else cls(config)


def vit(name: str, **fields: object) -> nn.Module:
    """transformers' ``name`` (ViT or DeiT) at hidden 64, 2 blocks of 4 heads, 32-pixel images of 8-pixel patches, 5
    labels."""
    import transformers

    config = transformers.DeiTConfig if name.startswith("DeiT") else transformers.ViTConfig
    return _built(getattr(transformers, name), config(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=32, patch_size=8,
        num_labels=5, **fields))


def _exact(model: nn.Module, x: torch.Tensor) -> LayeredModel:
    """``model``'s split, checked bit for bit against it on ``x``, one tensor crossing each cut of its data flow."""
    lm = _split(model, x)
    check_exact(model, x, lm.layers, lm.param_counts)
    assert verify_cuts(model, x, lm) == [1] * (len(lm) - 1)
    return lm


def _same_in_training(model: nn.Module, x: torch.Tensor) -> None:
    """With dropout on, the split draws the same masks as the model: the same outputs."""
    lm = _split(model, x)
    model.train()
    torch.manual_seed(1)
    want = primary_output(model(x))
    torch.manual_seed(1)
    assert torch.equal(lm.run(x), want)


_HEADS = {"ForMaskedLM": 4, "ForSequenceClassification": 4, "ForTokenClassification": 4, "Model": 3}
"""Layers of each kind of model: embeddings, 2 blocks and the head (the bare model ends with its last block)."""


@pytest.mark.parametrize("family", ["Bert", "Roberta", "XLMRoberta", "Camembert", "Electra"])
@pytest.mark.parametrize("kind", sorted(_HEADS))
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_bert_and_roberta_split_exactly_with_their_heads(family: str, kind: str, attention: str) -> None:
    """The masked LM (its decoder tied to the word embedding), the sequence classifier (BERT's pooler, dropout and
    classifier; RoBERTa's head over the first token), the token classifier and the bare model, SDPA or eager: bit
    for bit, one tensor crossing each cut; the blocks sharded as BERT's; in training with dropout too."""
    torch.manual_seed(0)
    model = encoder(f"{family}{kind}", attn_implementation=attention)
    x = torch.randint(3, 96, (2, 16))
    lm = _exact(model, x)
    assert len(lm) == _HEADS[kind] and lm.method.startswith("structure:")
    assert lm.block(1) == ir.BlockShape(64, 4, 4, 128, 16, gated=False)
    assert [t.layers for t in lm.ties] == ([(0, 3)] if kind == "ForMaskedLM" else [])
    check_exact(model, torch.randint(3, 96, (1, 6)), lm.layers, lm.param_counts)
    _same_in_training(encoder(f"{family}{kind}", hidden_dropout_prob=0.3, attention_probs_dropout_prob=0.3), x)


def distilbert(name: str, **fields: object) -> nn.Module:
    """transformers' ``name`` (DistilBERT) at width 64, 2 blocks of 4 heads, FFN 128, 40 positions, 3 labels."""
    import transformers

    return getattr(transformers, name)(transformers.DistilBertConfig(
        vocab_size=96, dim=64, n_layers=2, n_heads=4, hidden_dim=128, max_position_embeddings=40, num_labels=3,
        **fields))


@pytest.mark.parametrize("kind", sorted(_HEADS))
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_distilbert_splits_exactly_with_its_heads(kind: str, attention: str) -> None:
    """DistilBERT: its masked-LM head (the projector tied to the word embedding), sequence classifier over the first
    token, token classifier and bare model: bit for bit, one tensor crossing each cut, in training with dropout; its
    blocks (q_lin, ffn.lin1, ...) not sharded; a sequence past its positions refused."""
    torch.manual_seed(0)
    model = distilbert(f"DistilBert{kind}", attn_implementation=attention)
    x = torch.randint(1, 96, (2, 16))
    lm = _exact(model, x)
    assert len(lm) == _HEADS[kind] and lm.method == "structure:distilbert"
    assert lm.block(1) == ir.BlockShape(64, 4, 4, 128, 16, gated=False, shardable=False)
    assert [t.layers for t in lm.ties] == ([(0, 3)] if kind == "ForMaskedLM" else [])
    _same_in_training(distilbert(f"DistilBert{kind}", dropout=0.3, attention_dropout=0.3, seq_classif_dropout=0.3),
                      x)
    with pytest.raises(TraceError, match=r"40 learned positions \(max_position_embeddings\)"):
        split_hf(model, torch.randint(1, 96, (1, 41)))


@pytest.mark.parametrize(("name", "tokens"), [("ViTForImageClassification", 17), ("ViTModel", 17),
                                              ("DeiTForImageClassification", 18), ("DeiTModel", 18)])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_vit_splits_exactly_with_its_patches_as_the_sequence(name: str, tokens: int, attention: str) -> None:
    """ViT and DeiT: patch embeddings with the class token (and DeiT's distillation token), blocks, the final norm
    with the classifier over the class token (or after the last block): bit for bit; their blocks see 16 patches and
    the special tokens, not the 3 channels of the input's second dimension; not sharded."""
    torch.manual_seed(0)
    model = vit(name, attn_implementation=attention)
    x = torch.randn(2, 3, 32, 32)
    lm = _exact(model, x)
    assert len(lm) == (3 if name.endswith("Model") else 4) and lm.method == f"structure:{model.config.model_type}"
    assert lm.block(1) == ir.BlockShape(64, 4, 4, 128, tokens, gated=False, shardable=False)
    _same_in_training(vit(name, hidden_dropout_prob=0.3, attention_probs_dropout_prob=0.3), x)


def test_an_encoder_built_as_a_decoder_is_refused() -> None:
    """is_decoder=True makes BERT's forward mask causally; the split blocks attend both ways."""
    with pytest.raises(TraceError, match="is_decoder=True") as err:
        split_hf(encoder("BertForMaskedLM", is_decoder=True), torch.randint(3, 96, (1, 8)))
    assert "is_decoder=False" in err.value.hint


@pytest.mark.parametrize(("name", "usable"), [("BertForMaskedLM", 40), ("RobertaForMaskedLM", 38)])
def test_a_sequence_past_the_learned_positions_is_refused(name: str, usable: int) -> None:
    """BERT has max_position_embeddings positions, RoBERTa that many less its padding index and one (its positions
    start after the padding token's): one token more is refused, as many run."""
    model = encoder(name, pad_token_id=1)
    split_hf(model, torch.randint(3, 96, (1, usable)))
    with pytest.raises(TraceError, match=rf"{usable} learned positions \(max_position_embeddings\)"):
        split_hf(model, torch.randint(3, 96, (1, usable + 1)))


def test_a_bare_models_pooler_is_in_no_layer() -> None:
    """BertModel's pooler (built by default) reads the first token of its output; the model's first output is the
    last block's, so the split leaves the pooler out and counts its weights nowhere."""
    import transformers

    torch.manual_seed(0)
    model = transformers.BertModel(encoder("BertModel").config).eval()
    x = torch.randint(3, 96, (2, 16))
    lm = _split(model, x)
    with torch.no_grad():
        assert torch.equal(lm.run(x), primary_output(model(x)))
    assert sum(lm.param_counts) == sum(p.numel() for p in model.parameters()) - 64 * 64 - 64


def modernbert(name: str, **fields: object) -> nn.Module:
    """transformers' ``name`` (ModernBERT) at hidden 64, 4 blocks of 4 heads (full and sliding layers alternating, a
    window of 8 tokens, shorter than the tests' 20), gated MLP of 96, 3 labels."""
    import transformers

    ids = dict.fromkeys(("pad_token_id", "bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id"), 0)
    return getattr(transformers, name)(transformers.ModernBertConfig(
        vocab_size=96, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, intermediate_size=96,
        max_position_embeddings=64, local_attention=8, global_attn_every_n_layers=2, num_labels=3, **ids, **fields))


@pytest.mark.parametrize(("kind", "pooling"), [(k, "cls") for k in sorted(_HEADS)]
                         + [("ForSequenceClassification", "mean")])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_modernbert_splits_exactly_with_its_rotary_and_sliding_layers(kind: str, pooling: str, attention: str) -> None:
    """ModernBERT: each block rebuilds its rotary embeddings and its mask by layer type (full, or a window both ways
    shorter than the sequence) with the model module's own mask functions; the final norm joins the head (the
    decoder tied to the token embedding; the classifier over the first token or the mean of them): bit for bit, one
    tensor crossing each cut, in training with dropout; gated blocks, not sharded."""
    torch.manual_seed(0)
    model = modernbert(f"ModernBert{kind}", attn_implementation=attention, classifier_pooling=pooling)
    x = torch.randint(1, 96, (2, 20))
    lm = _exact(model, x)
    assert len(lm) == _HEADS[kind] + 2 and lm.method == "structure:modernbert"
    assert lm.block(1) == ir.BlockShape(64, 4, 4, 96, 20, gated=True, shardable=False)
    assert [t.layers for t in lm.ties] == ([(0, 5)] if kind == "ForMaskedLM" else [])
    _same_in_training(modernbert(f"ModernBert{kind}", classifier_pooling=pooling, embedding_dropout=0.3,
                                 attention_dropout=0.3, mlp_dropout=0.3, classifier_dropout=0.3), x)


@pytest.mark.parametrize(("model", "head"), [
    (lambda: encoder("BertForSequenceClassification"), "Head"),  # pooler's dense and classifier
    (lambda: encoder("BertForTokenClassification"), "Linear"),
    (lambda: distilbert("DistilBertForMaskedLM"), "Head"),
    (lambda: vit("ViTForImageClassification"), "Linear"),
])
def test_a_head_of_more_than_one_linear_is_not_typed_linear(model: Callable[[], nn.Module], head: str) -> None:
    """The torch export's split forms shard layers typed "Linear", one nn.Linear each: a head chaining two is a
    "Head" (a plan splitting it would fail at export)."""
    m = model()
    x = torch.randn(2, 3, 32, 32) if "ViT" in type(m).__name__ else torch.randint(3, 96, (2, 16))
    assert _split(m, x).types[-1] == head


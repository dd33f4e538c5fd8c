"""The zoo's transformers: GPT-2, BERT and Llama models built from ``transformers`` configs (no download).

Each named model is a config class, a model class and the published config fields:
GPT-2 small/medium (OpenAI's released sizes), BERT-base, Llama 2 7B/13B/70B and Llama 3
8B/70B (the models' published ``config.json``: hidden, layers, heads, KV heads, FFN, vocab,
context, RMSNorm epsilon, rotary base; table in ``docs``/the shared facts file), and
``llama-tiny`` (hidden 64, 2 blocks, 4 heads, 2 KV heads) for tests. ``build`` makes the
model for a sequence length, raising the learned or rotary position range
(``n_positions``/``max_position_embeddings``) to it when it is longer, and applies
``overrides`` (``planner profile --set KEY=VALUE``): any field of the config class, an
unknown one being a UsageError that names the close ones. Dropout is 0 so that the split
layers run one by one equal the whole model bit for bit; SDPA attention (the causal mask
inside the blocks, which the structural split needs).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from torch import nn

from planner.errors import UsageError

DEFAULT_SEQ_LEN = 128


@dataclass(frozen=True)
class HFModel:
    """A zoo transformer: ``transformers`` config and model class names, its config fields, its context."""

    config_class: str
    model_class: str
    fields: Mapping[str, Any]
    positions_key: str
    """The config field bounding the sequence length (raised to a longer one asked for)."""
    seq_len: int
    """Default sequence length of the zoo entry."""
    description: str


def _frozen(**fields: Any) -> Mapping[str, Any]:
    return MappingProxyType(fields)


_GPT2 = _frozen(vocab_size=50257, n_positions=1024, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
_BERT = _frozen(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                intermediate_size=3072, max_position_embeddings=512, hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0)
_LLAMA2 = _frozen(vocab_size=32000, max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0,
                  tie_word_embeddings=False, attention_dropout=0.0)
_LLAMA3 = _frozen(**{**_LLAMA2, "vocab_size": 128256, "max_position_embeddings": 8192, "rope_theta": 500000.0})


def _llama(base: Mapping[str, Any], hidden: int, layers: int, heads: int, kv_heads: int, ffn: int,
           description: str) -> HFModel:
    fields = _frozen(**base, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                     num_key_value_heads=kv_heads, intermediate_size=ffn)
    return HFModel("LlamaConfig", "LlamaForCausalLM", fields, "max_position_embeddings",
                   int(base["max_position_embeddings"]), description)


HF_MODELS: Mapping[str, HFModel] = MappingProxyType({
    "gpt2": HFModel("GPT2Config", "GPT2LMHeadModel", _frozen(**_GPT2, n_embd=768, n_layer=12, n_head=12),
                    "n_positions", DEFAULT_SEQ_LEN, "GPT-2 small (124M) LM head, tied wte/lm_head"),
    "gpt2-medium": HFModel("GPT2Config", "GPT2LMHeadModel", _frozen(**_GPT2, n_embd=1024, n_layer=24, n_head=16),
                           "n_positions", DEFAULT_SEQ_LEN, "GPT-2 medium (355M) LM head, tied wte/lm_head"),
    "bert-base": HFModel("BertConfig", "BertForMaskedLM", _BERT, "max_position_embeddings", DEFAULT_SEQ_LEN,
                         "BERT-base masked LM, tied word embeddings/decoder"),
    "llama-tiny": HFModel("LlamaConfig", "LlamaForCausalLM", _frozen(
        **{**_LLAMA2, "vocab_size": 256, "max_position_embeddings": DEFAULT_SEQ_LEN}, hidden_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128),
        "max_position_embeddings", DEFAULT_SEQ_LEN, "a tiny Llama (hidden 64, 2 blocks, 4 heads, 2 KV heads)"),
    "llama2-7b": _llama(_LLAMA2, 4096, 32, 32, 32, 11008, "Llama 2 7B (6.7B parameters)"),
    "llama2-13b": _llama(_LLAMA2, 5120, 40, 40, 40, 13824, "Llama 2 13B (13.0B parameters)"),
    "llama2-70b": _llama(_LLAMA2, 8192, 80, 64, 8, 28672, "Llama 2 70B (69.0B parameters, 8 KV heads)"),
    "llama3-8b": _llama(_LLAMA3, 4096, 32, 32, 8, 14336, "Llama 3 8B (8.0B parameters, 8 KV heads)"),
    "llama3-70b": _llama(_LLAMA3, 8192, 80, 64, 8, 28672, "Llama 3 70B (70.6B parameters, 8 KV heads)"),
})


def _config_class(name: str) -> Any:
    import transformers

    return getattr(transformers, HF_MODELS[name].config_class)


def config_keys(name: str) -> frozenset[str]:
    """The config fields ``--set`` may override for zoo transformer ``name``."""
    cls = _config_class(name)
    return frozenset(cls().to_dict()) | frozenset(getattr(cls, "attribute_map", {})) | frozenset(
        HF_MODELS[name].fields)


def check_overrides(name: str, overrides: Mapping[str, Any]) -> None:
    """A UsageError for the first key that is no field of ``name``'s config, naming the close ones."""
    keys = config_keys(name)
    for key in overrides:
        if key not in keys:
            close = difflib.get_close_matches(key, sorted(keys), n=4, cutoff=0.5)
            hint = f"did you mean {', '.join(close)}?" if close else f"the fields of {HF_MODELS[name].config_class}"
            raise UsageError(f"--set {key}: {name}'s {HF_MODELS[name].config_class} has no field {key!r}", hint)


def build(name: str, seq_len: int | None = None, overrides: Mapping[str, Any] | None = None) -> nn.Module:
    """Zoo transformer ``name`` with ``overrides``, its position range covering ``seq_len`` tokens."""
    import transformers

    spec = HF_MODELS[name]
    overrides = dict(overrides or {})
    check_overrides(name, overrides)
    fields = {**spec.fields, **overrides}
    if seq_len is not None and spec.positions_key not in overrides:
        fields[spec.positions_key] = max(int(fields[spec.positions_key]), seq_len)
    try:  # transformers validates configs with its own error classes: any failure here is the fields'
        config = _config_class(name)(**fields)
    except Exception as exc:
        cause = exc.__cause__ or exc
        raise UsageError(f"{name} rejects the config {overrides}: {str(cause).strip().splitlines()[0][:200]}",
                         "fix the --set values") from None
    config._attn_implementation = "sdpa"
    model: nn.Module = getattr(transformers, spec.model_class)(config)
    return model


def gpt2(size: str = "gpt2", dropout: float = 0.0, **config: Any) -> nn.Module:
    """``transformers.GPT2LMHeadModel`` of zoo size ``size`` (``config`` overrides GPT2Config fields)."""
    return build(size, overrides={"resid_pdrop": dropout, "embd_pdrop": dropout, "attn_pdrop": dropout, **config})


def bert(dropout: float = 0.0, **config: Any) -> nn.Module:
    """``transformers.BertForMaskedLM`` (BERT-base; ``config`` overrides BertConfig fields)."""
    return build("bert-base", overrides={"hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout,
                                         **config})


def llama(size: str = "llama-tiny", **config: Any) -> nn.Module:
    """``transformers.LlamaForCausalLM`` of zoo size ``size`` (``config`` overrides LlamaConfig fields)."""
    return build(size, overrides=config)

"""The zoo's transformers: GPT-2, BERT and Llama-family models built from ``transformers`` configs (no download).

Each named model is a config class, a model class and the published config fields:
GPT-2 small/medium (OpenAI's released sizes), GPT-J 6B, GPT-Neo 2.7B, BERT-base, Llama 2 7B/13B/70B, Llama 3
8B/70B, Mistral 7B (v0.1: a 4,096-token sliding window), Qwen2 7B (q/k/v biases), Qwen3 8B
(head size 128, q/k norms), Gemma 7B, Gemma 2 9B, Gemma 3 1B, OLMo 2 7B and the mixtures of experts Mixtral 8x7B,
OLMoE 1B-7B and Qwen3-30B-A3B (the models' published
``config.json``: hidden, layers, heads, KV heads, FFN, vocab, context, RMSNorm epsilon, rotary base; table in
``docs``/the shared facts file), and
``llama-tiny`` (hidden 64, 2 blocks, 4 heads, 2 KV heads) for tests. ``build`` makes the
model for a sequence length, raising the learned or rotary position range
(``n_positions``/``max_position_embeddings``) to it when it is longer, and applies
``overrides`` (``planner profile --set KEY=VALUE``): any field of the config class, an
unknown one being a UsageError that names the close ones; so is a value of another kind than
the field's, a size or count (``SIZE_BOUNDS``) outside 1 to the profile format's bound, a
position range shorter than the sequence, and a config or model the library refuses (its
message, with the overrides). Dropout is 0 so that the split
layers run one by one equal the whole model bit for bit; SDPA attention (eager for Gemma 2, whose
soft-capped scores SDPA refuses; the split blocks rebuild either's masks).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from torch import nn

from planner.errors import UsageError, is_whole
from planner.profiler.guards import is_out_of_memory, shown_overrides
from planner.profiler.hfchecks import heads_problem
from planner.schemas.build import MAX_DIM, MAX_ITEMS

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
    attention: str = "sdpa"
    """The attention implementation it is built with (Gemma 2's soft-capped scores run eager only)."""


def _frozen(**fields: Any) -> Mapping[str, Any]:
    return MappingProxyType(fields)


_GPT2 = _frozen(vocab_size=50257, n_positions=1024, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
_BERT = _frozen(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                intermediate_size=3072, max_position_embeddings=512, hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0)
_GPTJ = _frozen(vocab_size=50400, n_positions=2048, n_embd=4096, n_layer=28, n_head=16, rotary_dim=64,
               tie_word_embeddings=False, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
_GPT_NEO = _frozen(vocab_size=50257, max_position_embeddings=2048, hidden_size=2560, num_layers=32, num_heads=20,
                   window_size=256, attention_types=[[["global", "local"], 16]], embed_dropout=0.0,
                   attention_dropout=0.0, resid_dropout=0.0)
_LLAMA2 = _frozen(vocab_size=32000, max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0,
                  tie_word_embeddings=False, attention_dropout=0.0)
_LLAMA3 = _frozen(**{**_LLAMA2, "vocab_size": 128256, "max_position_embeddings": 8192, "rope_theta": 500000.0})


_MISTRAL = _frozen(**{**_LLAMA2, "max_position_embeddings": 32768}, sliding_window=4096)
_GEMMA = _frozen(vocab_size=256000, max_position_embeddings=8192, rms_norm_eps=1e-6, rope_theta=10000.0,
                 head_dim=256, hidden_act="gelu_pytorch_tanh", tie_word_embeddings=True, attention_dropout=0.0)
_GEMMA2 = _frozen(**_GEMMA, sliding_window=4096, query_pre_attn_scalar=256, attn_logit_softcapping=50.0,
                  final_logit_softcapping=30.0)
_GEMMA3 = _frozen(**{**_GEMMA, "vocab_size": 262144, "max_position_embeddings": 32768, "rope_theta": 1_000_000.0},
                  sliding_window=512, query_pre_attn_scalar=256)
"""Gemma 3's ``rope_theta`` is its global layers' rotary base (its local ones keep ``rope_local_base_freq``,
10,000), as gemma-3-1b's ``config.json`` sets them."""
_OLMO2 = _frozen(vocab_size=100352, max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=500000.0,
                 tie_word_embeddings=False, attention_dropout=0.0)
_QWEN2 = _frozen(**{**_LLAMA2, "vocab_size": 152064, "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
                    "rope_theta": 1000000.0}, use_sliding_window=False, sliding_window=131072, max_window_layers=28)
_QWEN3 = _frozen(**{**_LLAMA2, "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
                    "rope_theta": 1000000.0}, head_dim=128, attention_bias=False, use_sliding_window=False,
                 sliding_window=None)

_MIXTRAL = _frozen(**{**_LLAMA2, "max_position_embeddings": 32768, "rope_theta": 1000000.0}, sliding_window=None,
                   num_local_experts=8, num_experts_per_tok=2, output_router_logits=False, router_jitter_noise=0.0)
_OLMOE = _frozen(**{**_LLAMA2, "vocab_size": 50304}, num_experts=64, num_experts_per_tok=8, norm_topk_prob=False,
                 clip_qkv=None, output_router_logits=False)
_QWEN3_MOE = _frozen(**_QWEN3, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True,
                     decoder_sparse_step=1, mlp_only_layers=[], output_router_logits=False)
"""The mixtures of experts (``output_router_logits`` off: a split trains the language-model loss only,
``planner.profiler.hfchecks``): Mixtral 8x7B's, OLMoE 1B-7B's and Qwen3-30B-A3B's published ``config.json``."""


def _llama(base: Mapping[str, Any], hidden: int, layers: int, heads: int, kv_heads: int, ffn: int,
           description: str, family: str = "Llama", seq_len: int | None = None, attention: str = "sdpa") -> HFModel:
    """A Llama-family decoder: ``family`` names its config and causal-LM classes (``Gemma3Text``: Gemma 3's text
    config, its ``Gemma3ForCausalLM``); ``seq_len`` (default its position range) the tokens a profile takes by
    default."""
    fields = _frozen(**base, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                     num_key_value_heads=kv_heads, intermediate_size=ffn)
    return HFModel(f"{family}Config", f"{family.removesuffix('Text')}ForCausalLM", fields, "max_position_embeddings",
                   seq_len or int(base["max_position_embeddings"]), description, attention)


HF_MODELS: Mapping[str, HFModel] = MappingProxyType({
    "gpt2": HFModel("GPT2Config", "GPT2LMHeadModel", _frozen(**_GPT2, n_embd=768, n_layer=12, n_head=12),
                    "n_positions", DEFAULT_SEQ_LEN, "GPT-2 small (124M) LM head, tied wte/lm_head"),
    "gpt2-medium": HFModel("GPT2Config", "GPT2LMHeadModel", _frozen(**_GPT2, n_embd=1024, n_layer=24, n_head=16),
                           "n_positions", DEFAULT_SEQ_LEN, "GPT-2 medium (355M) LM head, tied wte/lm_head"),
    "gpt-j-6b": HFModel("GPTJConfig", "GPTJForCausalLM", _GPTJ, "n_positions", 2048,
                        "GPT-J 6B (6.05B parameters: attention beside the MLP, rotary over 64 of each head's 256 "
                        "channels; data and pipeline parallel only)"),
    "gpt-neo-2.7b": HFModel("GPTNeoConfig", "GPTNeoForCausalLM", _GPT_NEO, "max_position_embeddings", 2048,
                            "GPT-Neo 2.7B (2.65B parameters: global and local layers of a 256-token window "
                            "alternating, eager attention only; data and pipeline parallel only)", "eager"),
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
    "gemma-7b": _llama(_GEMMA, 3072, 28, 16, 16, 24576, "Gemma 7B (8.5B parameters: 16 heads of 256 on a width of "
                       "3072, GeGLU, a 256,000-token vocabulary tied to the head)", "Gemma", 8192),
    "gemma2-9b": _llama(_GEMMA2, 3584, 42, 16, 8, 14336, "Gemma 2 9B (9.2B parameters: 16 heads of 256, 8 KV heads; "
                        "local layers of a 4,096-token window alternating with global ones; scores and logits "
                        "soft-capped, so eager attention)", "Gemma2", 8192, "eager"),
    "gemma3-1b": _llama(_GEMMA3, 1152, 26, 4, 1, 6912, "Gemma 3 1B (1.0B parameters: 4 heads of 256, 1 KV head; five "
                        "local layers of a 512-token window to each global one)", "Gemma3Text", 4096),
    "olmo2-7b": _llama(_OLMO2, 4096, 32, 32, 32, 11008, "OLMo 2 7B (7.3B parameters; q/k norms over all heads: "
                       "data and pipeline parallel only)", "Olmo2", 4096),
    "mistral-7b": _llama(_MISTRAL, 4096, 32, 32, 8, 14336, "Mistral 7B v0.1 (7.2B parameters, 8 KV heads, "
                         "4,096-token sliding window)", "Mistral", 4096),
    "qwen2-7b": _llama(_QWEN2, 3584, 28, 28, 4, 18944, "Qwen2 7B (7.6B parameters, 4 KV heads, q/k/v biases)",
                       "Qwen2", 4096),
    "qwen3-8b": _llama(_QWEN3, 4096, 36, 32, 8, 12288, "Qwen3 8B (8.2B parameters, 8 KV heads, q/k norms)",
                       "Qwen3", 4096),
    "mixtral-8x7b": _llama(_MIXTRAL, 4096, 32, 32, 8, 14336, "Mixtral 8x7B (46.7B parameters, 12.9B active: 8 experts "
                           "a block, 2 a token; 8 KV heads)", "Mixtral", 4096),
    "olmoe-1b-7b": _llama(_OLMOE, 2048, 16, 16, 16, 1024, "OLMoE 1B-7B (6.9B parameters, 1.3B active: 64 experts a "
                          "block, 8 a token)", "Olmoe", 4096),
    "qwen3-30b-a3b": _llama(_QWEN3_MOE, 2048, 48, 32, 4, 6144, "Qwen3-30B-A3B (30.5B parameters, 3.3B active: 128 "
                            "experts of width 768 a block, 8 a token; 4 KV heads)", "Qwen3Moe", 4096),
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


def _canonical(name: str, key: str) -> str:
    """The config's own name of field ``key`` (GPT-2's ``num_hidden_layers`` is ``n_layer``)."""
    return str(getattr(_config_class(name), "attribute_map", {}).get(key, key))


def _defaults(name: str) -> dict[str, Any]:
    """Every field of ``name``'s config with its value in the zoo entry (else the config class's default)."""
    return {**_config_class(name)().to_dict(), **HF_MODELS[name].fields}


SIZE_BOUNDS: Mapping[str, int] = MappingProxyType({
    **dict.fromkeys(("n_layer", "num_hidden_layers", "num_layers", "n_head", "num_attention_heads", "num_heads",
                     "num_key_value_heads"), MAX_ITEMS),
    **dict.fromkeys(("vocab_size", "n_positions", "max_position_embeddings", "n_embd", "hidden_size",
                     "intermediate_size", "n_inner", "head_dim", "type_vocab_size", "sliding_window", "window_size",
                     "rotary_dim"), MAX_DIM),
})
"""Config fields that are sizes or counts: a whole number from 1 to the profile format's bound (a count of blocks or
heads, GPT-Neo's ``num_layers`` and ``num_heads`` too: its list items; a width or a number of tokens, as a sliding
window's: its dimensions; a window of 0 tokens would leave its layers' tokens nothing to attend to)."""

_KINDS: tuple[tuple[type, tuple[type, ...], str], ...] = (
    (bool, (bool,), "true or false"), (int, (int,), "a whole number"), (float, (int, float), "a number"),
    (str, (str,), "text"))
"""(type of a field's default, types of the values it takes, the kind in words); bool before int."""


def checked_values(name: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The overrides under the config's own field names, a whole number given for a float field as a float;
    a UsageError for the first value not of its field's kind (a size: a whole number, 1 or more)."""
    defaults = _defaults(name)
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        field = _canonical(name, key)
        if value is None:
            _check_unset(name, key, field, defaults.get(field))
        elif field in SIZE_BOUNDS:
            _check_size(key, value, SIZE_BOUNDS[field], defaults.get(field))
        else:
            _check_kind(name, key, value, defaults.get(field))
        is_float = isinstance(defaults.get(field), float) and isinstance(value, int) and not isinstance(value, bool)
        out[field] = float(value) if is_float else value
    return out


def _as_set(default: Any) -> Any:
    """A default as ``--set`` writes it (``true``/``false`` for a bool)."""
    return str(default).lower() if isinstance(default, bool) else default


def _check_unset(name: str, key: str, field: str, default: Any) -> None:
    """``--set KEY=null`` only for a field the config may leave unset: its default is None, or its type admits None
    (Gemma 2's ``final_logit_softcapping: float | None``, Mistral's ``sliding_window: int | None``)."""
    import inspect

    param = inspect.signature(_config_class(name).__init__).parameters.get(field)
    if default is None or (param is not None and "None" in str(param.annotation)):
        return
    raise UsageError(f"--set {key}=null: {name}'s {key} cannot be unset (default {default!r})",
                     f"give it a value, e.g. --set {key}={_as_set(default)}")


def _check_size(key: str, value: Any, bound: int, default: Any) -> None:
    if not is_whole(value, 1, bound):
        example = f"e.g. --set {key}={default}" if isinstance(default, int) else f"e.g. --set {key}=4"
        raise UsageError(f"--set {key}={value!r}: {key} is a size, a whole number from 1 to {bound:,}", example)


def _check_kind(name: str, key: str, value: Any, default: Any) -> None:
    for default_type, accepted, words in _KINDS:
        if isinstance(default, default_type):
            if isinstance(value, accepted) and (bool in accepted or not isinstance(value, bool)):
                return
            raise UsageError(f"--set {key}={value!r}: {name}'s {key} is {words} (default {_as_set(default)!r})",
                             f"e.g. --set {key}={_as_set(default)}")


def build(name: str, seq_len: int | None = None, overrides: Mapping[str, Any] | None = None) -> nn.Module:
    """Zoo transformer ``name`` with ``overrides``, its position range covering ``seq_len`` tokens.

    A bad override (unknown field, wrong kind of value, a size below 1, a position range shorter
    than ``seq_len``, a config or model the library refuses) is a UsageError naming it.
    """
    import transformers

    spec = HF_MODELS[name]
    given = dict(overrides or {})
    check_overrides(name, given)
    canonical = checked_values(name, given)
    fields = _neo_layers({**spec.fields, **canonical}, canonical) if spec.config_class == "GPTNeoConfig" else {
        **spec.fields, **canonical}
    if seq_len is not None and spec.positions_key not in canonical:
        fields[spec.positions_key] = max(int(fields[spec.positions_key]), seq_len)
    config = _config(name, fields, given)
    _check_positions(name, config, given, seq_len)
    if given and (problem := heads_problem(config)):
        raise UsageError(f"{name} cannot be built with --set {shown_overrides(given)}: {problem}",
                         "fix the --set values")
    config._attn_implementation = spec.attention
    try:
        model: nn.Module = getattr(transformers, spec.model_class)(config)
    except Exception as exc:  # the library checks some fields only when it builds the model
        if not given or is_out_of_memory(exc):
            raise
        raise UsageError(f"{name} cannot be built with --set {shown_overrides(given)}: {_first_line(exc)}",
                         "fix the --set values") from None
    return model


def _neo_layers(fields: dict[str, Any], canonical: Mapping[str, Any]) -> dict[str, Any]:
    """GPT-Neo's fields with its layer pattern (global and local layers alternating, ``attention_types``) over the
    ``num_layers`` set, where that was set without a pattern (``--set`` takes no lists; the config refuses a pattern
    of another length)."""
    layers = canonical.get("num_layers")
    if not isinstance(layers, int) or "attention_types" in canonical:
        return fields
    pattern: list[list[Any]] = [[["global", "local"], layers // 2]] if layers > 1 else []
    return {**fields, "attention_types": pattern + ([[["global"], 1]] if layers % 2 else [])}


def _config(name: str, fields: Mapping[str, Any], given: Mapping[str, Any]) -> Any:
    """The config of ``fields``; transformers validates it with its own error classes: any failure is the fields'."""
    try:
        return _config_class(name)(**fields)
    except Exception as exc:
        cause = exc.__cause__ or exc
        raise UsageError(f"{name} rejects the config --set {shown_overrides(given)}: {_first_line(cause)}",
                         "fix the --set values") from None


def _first_line(exc: BaseException) -> str:
    """The library's message, first line; a KeyError (an unknown name, e.g. an activation) says so."""
    if isinstance(exc, KeyError) and exc.args:
        return f"unknown name {exc.args[0]!r}"
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def _check_positions(name: str, config: Any, given: Mapping[str, Any], seq_len: int | None) -> None:
    """The position range the overrides set must hold the ``seq_len`` input tokens."""
    positions = int(getattr(config, HF_MODELS[name].positions_key))
    if seq_len is None or positions >= seq_len:
        return
    keys = [k for k in given if _canonical(name, k) == HF_MODELS[name].positions_key]
    key = keys[-1] if keys else HF_MODELS[name].positions_key
    raise UsageError(f"--set {key}={positions}: {name} then holds {positions} positions, fewer than the "
                     f"{seq_len} tokens of the input sequence",
                     f"set {key} to {seq_len} or more, or pass --input-shape {positions} or less")


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

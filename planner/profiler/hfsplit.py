"""Split a ``transformers`` model by its own structure: embeddings, each block, final norm and head.

HF transformers cannot be traced by ``torch.fx`` (their forward branches on caches and masks), and ``torch.export``
gives aten graphs specialised to one batch size, which a pipeline engine cannot run on micro-batches. So the classes of
:data:`_ARCHITECTURES` (``...ForCausalLM`` or LM head and the bare ``...Model``: GPT-2, the Llama family and the
decoders whose model and causal-LM forwards run Llama's steps, in transformers 5.24, some with scales, dropouts or soft
caps of their own kept in the first and last layers; GPT-NeoX, GPT-BigCode, GPT-Neo, GPT-J, CodeGen, OPT, BLOOM, Falcon
and MPT under their own names; the mixtures of experts of :data:`MIXTURES`) and any decoder whose forwards are, as
code, one of those Llama-family classes' (``planner.profiler.hfcode``) are split at the only one-tensor cuts they have:
after the embeddings, after each block, and the final norm with the head. Each block rebuilds what its model's forward
hands it (``planner.profiler.hfmodules``): rotary embeddings, ALiBi biases (BLOOM, Falcon, MPT), and the attention mask
(``planner.profiler.hfmasks``: causal, within a sliding window where its layer slides, for SDPA or eager attention, per
layer type where the forward reads them); what a split cannot keep is refused (``planner.profiler.hfchecks``).
``planner.profiler.verify.verify_cuts`` checks the cuts against the model's exported data flow (tests). The encoders
(BERT, RoBERTa, XLM-RoBERTa, CamemBERT, ELECTRA, DistilBERT, ModernBERT, ViT, DeiT: ``planner.profiler.hfencoders``)
are split the same way, their blocks attending both ways; the pieces of every split are ``planner.profiler.hfparts``'.

Each block records the ``planner.ir.BlockShape`` tensor parallelism needs, read off its config
(``planner.profiler.hfshape``: widths, heads, KV heads, FFN, gating, head size, ``seq_len`` the example's), marked not
shardable where the engines' tensor parallelism cannot shard it as Megatron does (``hfshape.UNSHARDED``; a projection
that is not a plain ``nn.Linear``, in any block). An embedding that scales its output in its own forward (Gemma's) is
not offered the vocabulary split (no weight shape).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from planner.profiler.hfchecks import check_model
from planner.profiler.hfcode import Match, blocks_of, family_of
from planner.profiler.hfencoders import distilbert_parts, encoder_parts, modernbert_parts, vit_parts, vit_tokens
from planner.profiler.hfmasks import block_masks, sliding_of
from planner.profiler.hfmodules import (
    AlibiBlock,
    Chain,
    FalconBlock,
    GPT2Embedding,
    MaskedBlock,
    MptBlock,
    OPTEmbedding,
    OwnedDropout,
    RotaryBlock,
    Scale,
    SoftCap,
    TokenEmbedding,
    TransformerBlock,
)
from planner.profiler.hfparts import Part, block_parts, is_causal_lm, layer_type, stack, unwrap
from planner.profiler.hfshape import UNSHARDED, block_shape, plain_shape
from planner.profiler.layered import LayeredModel, param_accounting, weight_features


def _gpt2_parts(model: nn.Module) -> list[Part]:
    """GPT-2's layers: token and position embeddings with their dropout, blocks each handed the causal mask its
    model's forward gives it (``hfmodules.MaskedBlock``: none under SDPA, an additive one under eager attention),
    final norm with the LM head (or after the last block). GPT-BigCode's (StarCoder's, SantaCoder's; multi-query
    attention where the model has it) and GPT-Neo's (local layers attending within ``window_size`` tokens by their own
    buffer, eager attention only) are the same."""
    tr, pre, head = unwrap(model, "transformer")
    first = Part(f"{pre}wte", "Embedding", GPT2Embedding(tr.wte, tr.wpe, tr.drop), tr.wte,
                 (f"{pre}wte", f"{pre}wpe", f"{pre}drop"))
    masks = iter(block_masks(tr.config, len(tr.h), "none"))
    return stack(first, list(tr.h), f"{pre}h", lambda block, post: MaskedBlock(block, next(masks), post),
                 (f"{pre}ln_f", tr.ln_f), head)


def _gptj_parts(model: nn.Module) -> list[Part]:
    """GPT-J's and CodeGen's layers: the token embedding with its dropout, blocks (attention beside the MLP, rotary
    over each head's first ``rotary_dim`` channels) rebuilding their sinusoidal positions and causal masks
    (``hfmodules.RotaryBlock``), the final LayerNorm with the LM head."""
    tr, pre, head = unwrap(model, "transformer")
    first = Part(f"{pre}wte", "Embedding", Chain(tr.wte, tr.drop), tr.wte, (f"{pre}wte", f"{pre}drop"))
    masks = iter(block_masks(tr.config, len(tr.h), "none"))
    return stack(first, list(tr.h), f"{pre}h",
                  lambda block, post: RotaryBlock(block, tr.rotary_emb, post, next(masks)),
                  (f"{pre}ln_f", tr.ln_f), head)


def _llama_parts(model: nn.Module, norm: str = "norm") -> list[Part]:
    """A Llama-family model's layers: token embedding, decoder blocks, final RMSNorm (``norm``) with the LM head.

    The blocks are those its forward runs, ``layers[: config.num_hidden_layers]``; the weights of any after them
    are in no layer (as BERT's pooler: nothing trains them)."""
    base, pre, head = unwrap(model, "model")
    plain = type(base.embed_tokens) is nn.Embedding  # Gemma's scales its output in its own forward
    first = Part(f"{pre}embed_tokens", "Embedding", TokenEmbedding(base.embed_tokens),
                  base.embed_tokens if plain else None, (f"{pre}embed_tokens",))
    blocks = list(base.layers)[: base.config.num_hidden_layers]
    typed = "layer_type" in inspect.signature(base.rotary_emb.forward).parameters  # Gemma 3's rotary per type
    types = iter(base.config.layer_types if typed else [None] * len(blocks))
    masks = iter(block_masks(base.config, len(blocks), sliding_of(type(base).forward)))

    def wrap(block: nn.Module, post: nn.Module | None) -> nn.Module:  # called once per block, in order
        return RotaryBlock(block, base.rotary_emb, post, next(masks), next(types))

    return stack(first, blocks, f"{pre}layers", wrap, (f"{pre}{norm}", getattr(base, norm)), head)


def _gemma_parts(model: nn.Module) -> list[Part]:
    """Gemma 2's and 3's layers: Llama's (each block masked and, in Gemma 3, rotated as its layer type), the logits
    soft-capped where the config caps them (``final_logit_softcapping``)."""
    parts = _llama_parts(model)
    cap = getattr(model.config, "final_logit_softcapping", None)
    if is_causal_lm(model) and cap is not None:
        last = parts[-1]
        parts[-1] = Part(last.name, last.type, Chain(last.module, SoftCap(float(cap))), last.weight, last.scope)
    return parts


def _dropout_llama_parts(model: nn.Module) -> list[Part]:
    """Phi's and Starcoder2's layers: Llama's with the embeddings' dropout their model's forward adds (Phi's
    ``embed_dropout`` module, Starcoder2's functional dropout at ``embedding_dropout``, the same operation as a
    module, ``OwnedDropout``) in the first layer; Phi's final norm is its ``final_layernorm``."""
    base = unwrap(model, "model")[0]
    phi = hasattr(base, "embed_dropout")
    parts = _llama_parts(model, "final_layernorm" if phi else "norm")
    drop = base.embed_dropout if phi else OwnedDropout(float(base.embedding_dropout), base)
    first = parts[0]
    scope = (*first.scope, first.name.replace("embed_tokens", "embed_dropout")) if phi else first.scope
    parts[0] = Part(first.name, first.type, Chain(first.module, drop), first.weight, scope)
    return parts


def _scaled_llama_parts(model: nn.Module) -> list[Part]:
    """Granite's and Cohere's layers: Llama's, with the scales their forwards add (Granite multiplies the embeddings
    by ``embedding_multiplier`` and divides the logits by ``logits_scaling``, Cohere multiplies the logits by
    ``logit_scale``). A scaled embedding is not offered the vocabulary split (no weight shape), as Gemma's."""
    parts = _llama_parts(model)
    base, _, head = unwrap(model, "model")
    multiplier = getattr(base, "embedding_multiplier", None)
    if multiplier is not None:
        first = parts[0]
        parts[0] = Part(first.name, first.type, Chain(first.module, Scale(float(multiplier))), None, first.scope)
    if head is not None:
        cohere = getattr(model, "logit_scale", None)
        scale = Scale(float(cohere)) if cohere is not None else Scale(float(model.config.logits_scaling), divide=True)
        last = parts[-1]
        parts[-1] = Part(last.name, last.type, Chain(last.module, scale), last.weight, last.scope)
    return parts


def _gpt_neox_parts(model: nn.Module) -> list[Part]:
    """GPT-NeoX's layers (Pythia): token embedding with its dropout, rotary decoder blocks, final LayerNorm with the
    LM head."""
    base, pre, head = unwrap(model, "gpt_neox")
    first = Part(f"{pre}embed_in", "Embedding", Chain(base.embed_in, base.emb_dropout), base.embed_in,
                  (f"{pre}embed_in", f"{pre}emb_dropout"))
    return stack(first, list(base.layers), f"{pre}layers",
                  lambda block, post: RotaryBlock(block, base.rotary_emb, post),
                  (f"{pre}final_layer_norm", base.final_layer_norm), head)


def _alibi_of(base: nn.Module, name: str) -> Callable[..., torch.Tensor]:
    """The function ``name`` of ``base``'s own module (its ALiBi biases, as its forward builds them)."""
    return getattr(inspect.getmodule(type(base)), name)  # type: ignore[no-any-return]


def _bloom_parts(model: nn.Module) -> list[Part]:
    """BLOOM's layers: the word embedding with its LayerNorm, ALiBi blocks (each rebuilding its biases and its
    additive causal mask: ``hfmodules.AlibiBlock``), the final LayerNorm with the LM head (tied to the embedding)."""
    base, pre, head = unwrap(model, "transformer")
    first = Part(f"{pre}word_embeddings", "Embedding", Chain(base.word_embeddings, base.word_embeddings_layernorm),
                  base.word_embeddings, (f"{pre}word_embeddings", f"{pre}word_embeddings_layernorm"))
    build_alibi = _alibi_of(base, "build_alibi_tensor")
    masks = iter(block_masks(base.config, len(base.h), "none"))
    return stack(first, list(base.h), f"{pre}h",
                  lambda block, post: AlibiBlock(block, build_alibi, int(base.num_heads), post, next(masks)),
                  (f"{pre}ln_f", base.ln_f), head)


def _falcon_parts(model: nn.Module) -> list[Part]:
    """Falcon's layers: the word embedding, blocks rebuilding their rotary embeddings, explicit causal masks and,
    where the model uses them, ALiBi biases (``hfmodules.FalconBlock``), the final LayerNorm with the LM head."""
    base, pre, head = unwrap(model, "transformer")
    first = Part(f"{pre}word_embeddings", "Embedding", TokenEmbedding(base.word_embeddings), base.word_embeddings,
                  (f"{pre}word_embeddings",))
    build_alibi = _alibi_of(base, "build_alibi_tensor") if base.use_alibi else None
    masks = iter(dataclasses.replace(m, explicit=True) for m in block_masks(base.config, len(base.h), "none"))
    heads = int(base.num_heads)
    head_dim = int(base.config.hidden_size) // heads

    def wrap(block: nn.Module, post: nn.Module | None) -> nn.Module:  # called once per block, in order
        return FalconBlock(block, base.rotary_emb, next(masks), heads, head_dim, build_alibi, post)

    return stack(first, list(base.h), f"{pre}h", wrap, (f"{pre}ln_f", base.ln_f), head)


def _mpt_parts(model: nn.Module) -> list[Part]:
    """MPT's layers: the token embedding, ALiBi blocks (``hfmodules.MptBlock``), the final norm with the LM head (tied
    to the embedding)."""
    base, pre, head = unwrap(model, "transformer")
    first = Part(f"{pre}wte", "Embedding", TokenEmbedding(base.wte), base.wte, (f"{pre}wte",))
    build_alibi = _alibi_of(base, "build_mpt_alibi_tensor")
    return stack(first, list(base.blocks), f"{pre}blocks",
                  lambda block, post: MptBlock(block, build_alibi, int(base.num_heads), int(base.config.max_seq_len),
                                               post),
                  (f"{pre}norm_f", base.norm_f), head)


def _opt_parts(model: nn.Module) -> list[Part]:
    """OPT's layers: token and learned position embeddings, decoder blocks, the final LayerNorm and ``project_out``
    (where the model has them) with the LM head."""
    head = is_causal_lm(model)
    dec: Any = model.model.decoder if head else model.decoder
    pre = "model.decoder." if head else "decoder."
    ends = [(f"{pre}{name}", m) for name in ("final_layer_norm", "project_out")
            if (m := getattr(dec, name)) is not None]
    embed = OPTEmbedding(dec.embed_tokens, dec.embed_positions, dec.project_in)
    scope = [f"{pre}{name}" for name in ("embed_tokens", "embed_positions", "project_in")
             if getattr(dec, name) is not None]
    parts = [Part(f"{pre}embed_tokens", "Embedding", embed, None, tuple(scope))]
    parts += block_parts(list(dec.layers), f"{pre}layers", TransformerBlock, [] if head else ends)
    if head:
        parts.append(Part("lm_head", "Linear", Chain(*(m for _, m in ends), model.lm_head), model.lm_head,
                           (*(name for name, _ in ends), "lm_head")))
    return parts


_LLAMA_FAMILY = ("Llama", "Mistral", "Qwen2", "Qwen3", "Gemma", "Olmo", "Olmo2", "Phi3", "Glm", "Arcee")
"""The decoders whose ``...Model`` and ``...ForCausalLM`` forwards are Llama's (module doc)."""


MIXTURES = (("Mixtral", "mixtral"), ("Qwen2Moe", "qwen2_moe"), ("Qwen3Moe", "qwen3_moe"), ("Olmoe", "olmoe"),
            ("Phimoe", "phimoe"), ("DeepseekV2", "deepseek_v2"), ("DeepseekV3", "deepseek_v3"), ("GptOss", "gpt_oss"),
            ("Ernie4_5_Moe", "ernie4_5_moe"), ("Glm4Moe", "glm4_moe"))
"""The mixtures of experts split as Llama (class prefix, architecture): their models' and causal LMs' forwards run
Llama's steps, their blocks route each token to its router's experts (an analytic profile counts them evenly routed,
``planner.profiler.experts``); their blocks are not sharded."""


_ARCHITECTURES: dict[str, tuple[str, Callable[[nn.Module], list[Part]]]] = {
    "GPT2LMHeadModel": ("gpt2", _gpt2_parts), "GPT2Model": ("gpt2", _gpt2_parts),
    **{f"{family}{kind}": (arch, encoder_parts) for family, arch in (("Bert", "bert"), ("Roberta", "roberta"),
                                                                      ("XLMRoberta", "xlm-roberta"),
                                                                      ("Camembert", "camembert"),
                                                                      ("Electra", "electra"))
       for kind in ("ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "Model")},
    **{f"DistilBert{kind}": ("distilbert", distilbert_parts)
       for kind in ("ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "Model")},
    **{f"ModernBert{kind}": ("modernbert", modernbert_parts)
       for kind in ("ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "Model")},
    "ViTForImageClassification": ("vit", vit_parts), "ViTModel": ("vit", vit_parts),
    "DeiTForImageClassification": ("deit", vit_parts), "DeiTModel": ("deit", vit_parts),
    **{f"{family}{kind}": (family.lower(), _llama_parts)
       for family in _LLAMA_FAMILY for kind in ("ForCausalLM", "Model")},
    "GPTNeoXForCausalLM": ("gpt_neox", _gpt_neox_parts), "GPTNeoXModel": ("gpt_neox", _gpt_neox_parts),
    "OPTForCausalLM": ("opt", _opt_parts), "OPTModel": ("opt", _opt_parts),
    "BloomForCausalLM": ("bloom", _bloom_parts), "BloomModel": ("bloom", _bloom_parts),
    "MptForCausalLM": ("mpt", _mpt_parts), "MptModel": ("mpt", _mpt_parts),
    **{f"GPTBigCode{kind}": ("gpt_bigcode", _gpt2_parts) for kind in ("ForCausalLM", "Model")},
    **{f"GPTNeo{kind}": ("gpt_neo", _gpt2_parts) for kind in ("ForCausalLM", "Model")},
    **{f"{family}{kind}": (arch, _gptj_parts) for family, arch in (("GPTJ", "gptj"), ("CodeGen", "codegen"))
       for kind in ("ForCausalLM", "Model")},
    **{f"{family}{kind}": (family.lower(), _llama_parts) for family in ("StableLm", "Nemotron")
       for kind in ("ForCausalLM", "Model")},
    "FalconForCausalLM": ("falcon", _falcon_parts), "FalconModel": ("falcon", _falcon_parts),
    **{f"{family}{kind}": (family.lower(), _scaled_llama_parts)
       for family in ("Granite", "Cohere") for kind in ("ForCausalLM", "Model")},
    **{f"{family}{kind}": (family.lower(), _dropout_llama_parts)
       for family in ("Phi", "Starcoder2") for kind in ("ForCausalLM", "Model")},
    **{f"{family}{kind}": (family.lower(), _llama_parts)
       for family in ("Olmo3", "Exaone4", "Ministral") for kind in ("ForCausalLM", "Model")},
    "Cohere2ForCausalLM": ("cohere2", _scaled_llama_parts), "Cohere2Model": ("cohere2", _scaled_llama_parts),
    **{f"{prefix}{kind}": (arch, _llama_parts) for prefix, arch in MIXTURES for kind in ("ForCausalLM", "Model")},
    "Gemma2ForCausalLM": ("gemma2", _gemma_parts), "Gemma2Model": ("gemma2", _gemma_parts),
    "Gemma3ForCausalLM": ("gemma3_text", _gemma_parts), "Gemma3TextModel": ("gemma3_text", _gemma_parts),
}
"""The transformers classes split by structure: class name -> (architecture, its parts)."""

_MASKED = frozenset({_llama_parts, _gemma_parts, _scaled_llama_parts, _dropout_llama_parts, _bloom_parts,
                     _falcon_parts, _gpt2_parts, _gptj_parts, _mpt_parts, encoder_parts, distilbert_parts,
                     modernbert_parts, vit_parts})
"""The parts whose blocks rebuild their attention masks (planner.profiler.hfmasks), or attend both ways with none,
so run eager attention too."""

_KINDS = ("ForCausalLM", "LMHeadModel", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification",
          "ForImageClassification", "TextModel", "Model")
"""The class-name endings of :data:`_ARCHITECTURES` (a family's prefix, then one of these)."""


def _grouped(names: Sequence[str]) -> str:
    """Class ``names`` grouped by the endings each family has: ``...ForCausalLM/...Model: Llama, Mistral, ...``."""
    kinds: dict[str, list[str]] = {}
    for name in names:
        end = next(k for k in _KINDS if name.endswith(k))
        kinds.setdefault(name.removesuffix(end), []).append(end)
    groups: dict[tuple[str, ...], list[str]] = {}
    for family, ends in kinds.items():
        groups.setdefault(tuple(ends), []).append(family)
    return "; ".join(f"{'/'.join(f'...{e}' for e in ends)}: {', '.join(fams)}" for ends, fams in groups.items())


STRUCTURED = (_grouped(list(_ARCHITECTURES)) + "; and other decoders whose model and causal-LM forwards are, as code, "
              "one of those Llama-family classes'")
"""The classes split by structure, for messages, grouped by family."""


def _recognise(model: nn.Module) -> tuple[str, Callable[[nn.Module], list[Part]], Match | None] | None:
    """(architecture, its parts, what its code says where it was recognised by it) for a transformers class named
    here or running a named Llama-family decoder's forwards (``planner.profiler.hfcode``); None otherwise."""
    if not type(model).__module__.startswith("transformers."):
        return None
    known = _ARCHITECTURES.get(type(model).__name__)
    if known is not None:
        return known[0], known[1], None
    if not type(model).__name__.endswith(("ForCausalLM", "Model")):
        return None
    family = family_of(model, _LLAMA_FAMILY)
    if family is None:
        return None
    shardable = [f for f in _LLAMA_FAMILY if f.lower() not in UNSHARDED]
    arch = str(getattr(getattr(model, "config", None), "model_type", "") or family.lower())
    return arch, _llama_parts, blocks_of(model, family, shardable)


def split_hf(model: nn.Module, example_input: torch.Tensor) -> LayeredModel | None:
    """``model`` split by its structure, or None when it is no transformers class known here."""
    recognised = _recognise(model)
    if recognised is None:
        return None
    arch, parts_of, match = recognised
    seq_len = vit_tokens(model, example_input) if parts_of is vit_parts else int(example_input.shape[1])
    check_model(model, arch, seq_len, parts_of in _MASKED)
    parts = parts_of(model)
    layer_params = [[(f"{p.name}.{k}", q) for k, q in p.module.named_parameters(remove_duplicate=False)]
                    for p in parts]
    counts, nbytes, ties = param_accounting(model, layer_params)
    feats = [weight_features(p.weight) if p.weight is not None else (None, None) for p in parts]
    shape = plain_shape(block_shape(model.config, seq_len, match), [p.module.block for p in parts if p.is_block])
    return LayeredModel(tuple(p.module for p in parts), tuple(p.name for p in parts),
                        tuple(layer_type(p) for p in parts), tuple(f[0] for f in feats), tuple(f[1] for f in feats),
                        counts, nbytes, ties, f"structure:{arch}", tuple(p.scope for p in parts),
                        tuple(shape if p.is_block else None for p in parts))

"""Encoders split by structure (``planner.profiler.hfsplit``): BERT, RoBERTa (XLM-RoBERTa and CamemBERT are its code),
ELECTRA, DistilBERT and ModernBERT (masked LM, sequence or token classifier, bare model) and ViT and DeiT (image
classifier, bare model), whose blocks attend both ways: with no mask, or ModernBERT's by layer type (full, or a window
both ways).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from planner.profiler.hfmodules import (
    BertEmbedding,
    Chain,
    EncoderRotaryBlock,
    FirstToken,
    MeanTokens,
    PatchEmbedding,
    TransformerBlock,
)
from planner.profiler.hfparts import Part, block_parts


def _inner(model: nn.Module, names: tuple[str, ...]) -> tuple[Any, str, str]:
    """(the bare encoder, the path prefix of its modules, the attribute holding it, or "" for a bare model) of
    ``model``, a model with a head holding its encoder at one of ``names``, or the bare encoder itself."""
    inner = next((a for a in names if isinstance(getattr(model, a, None), nn.Module)), "")
    return (getattr(model, inner), f"{inner}.", inner) if inner else (model, "", "")


def encoder_parts(model: nn.Module) -> list[Part]:
    """BERT's and RoBERTa's layers (XLM-RoBERTa's are RoBERTa's): the embeddings (word, position, token type, norm,
    dropout; RoBERTa's positions counted from the token ids), encoder blocks attending both ways, and the head: the
    masked-LM head, or the sequence classifier (BERT's pooler over the first token, dropout and classifier;
    RoBERTa's and ELECTRA's classification heads, which take the first token themselves), or the token classifier
    (dropout and classifier on every token); a bare model ends with its last block. ELECTRA's embeddings, narrower
    than its blocks, are projected up in the first layer, and its masked-LM head is its generator's."""
    base, pre, inner = _inner(model, ("bert", "roberta", "electra"))
    embed: nn.Module = BertEmbedding(base.embeddings)
    scope = [f"{pre}embeddings"]
    if isinstance(getattr(base, "embeddings_project", None), nn.Module):  # ELECTRA's narrower embeddings
        embed, scope = Chain(embed, base.embeddings_project), [*scope, f"{pre}embeddings_project"]
    parts = [Part(f"{pre}embeddings", type(base.embeddings).__name__, embed, base.embeddings.word_embeddings,
                  tuple(scope))]
    parts += block_parts(list(base.encoder.layer), f"{pre}encoder.layer", TransformerBlock)
    kind = type(model).__name__
    if kind.endswith("ForMaskedLM") and inner == "electra":
        parts.append(Part("generator_lm_head", "Linear", Chain(model.generator_predictions, model.generator_lm_head),
                          model.generator_lm_head, ("generator_predictions", "generator_lm_head")))
    elif kind.endswith("ForMaskedLM"):
        name = "cls" if inner == "bert" else "lm_head"
        head = getattr(model, name)
        decoder = head.predictions.decoder if inner == "bert" else head.decoder
        parts.append(Part(name, type(head).__name__, head, decoder, (name,)))
    elif kind.endswith("ForSequenceClassification") and inner == "bert":
        parts.append(Part("classifier", "Linear", Chain(base.pooler, model.dropout, model.classifier),
                          model.classifier, (f"{pre}pooler", "dropout", "classifier")))
    elif kind.endswith("ForTokenClassification"):
        parts.append(Part("classifier", "Linear", Chain(model.dropout, model.classifier), model.classifier,
                          ("dropout", "classifier")))
    elif kind.endswith("ForSequenceClassification"):
        parts.append(Part("classifier", type(model.classifier).__name__, model.classifier,
                          model.classifier.out_proj, ("classifier",)))
    return parts


def distilbert_parts(model: nn.Module) -> list[Part]:
    """DistilBERT's layers: the embeddings (word, position, norm, dropout), its blocks, and the head: the masked-LM
    head (transform, activation, norm, the projector tied to the word embedding), the sequence classifier over the
    first token (pre-classifier, ReLU, dropout, classifier) or the token classifier; a bare model ends with its last
    block."""
    base, pre, _ = _inner(model, ("distilbert",))
    parts = [Part(f"{pre}embeddings", type(base.embeddings).__name__, BertEmbedding(base.embeddings),
                  base.embeddings.word_embeddings, (f"{pre}embeddings",))]
    parts += block_parts(list(base.transformer.layer), f"{pre}transformer.layer", TransformerBlock)
    kind = type(model).__name__
    if kind.endswith("ForMaskedLM"):
        names = ("vocab_transform", "activation", "vocab_layer_norm", "vocab_projector")
        parts.append(Part("vocab_projector", "Linear", Chain(*(getattr(model, n) for n in names)),
                          model.vocab_projector, names))
    elif kind.endswith("ForSequenceClassification"):
        parts.append(Part("classifier", "Linear", Chain(FirstToken(), model.pre_classifier, nn.ReLU(), model.dropout,
                                                        model.classifier),
                          model.classifier, ("pre_classifier", "dropout", "classifier")))
    elif kind.endswith("ForTokenClassification"):
        parts.append(Part("classifier", "Linear", Chain(model.dropout, model.classifier), model.classifier,
                          ("dropout", "classifier")))
    return parts


def modernbert_parts(model: nn.Module) -> list[Part]:
    """ModernBERT's layers: the embeddings (tokens, norm, dropout), blocks rebuilding their rotary embeddings and
    masks per layer type (full or sliding, both ways: ``hfmodules.EncoderRotaryBlock``), and the final norm with the
    head: the masked-LM head with the decoder tied to the token embedding, the sequence classifier over the first
    token or the mean of them (``classifier_pooling``), or the token classifier; after the last block of a bare
    model."""
    base, pre, head = _inner(model, ("model",))
    module = inspect.getmodule(type(base))
    makers = {"full_attention": module.create_bidirectional_mask,  # type: ignore[union-attr]
              "sliding_attention": module.create_bidirectional_sliding_window_mask}  # type: ignore[union-attr]
    first = Part(f"{pre}embeddings", type(base.embeddings).__name__, BertEmbedding(base.embeddings),
                 base.embeddings.tok_embeddings, (f"{pre}embeddings",))
    norm = (f"{pre}final_norm", base.final_norm)

    def wrap(block: nn.Module, post: nn.Module | None) -> nn.Module:
        kind = str(block.attention_type)
        return EncoderRotaryBlock(block, base.rotary_emb, base.config, kind, makers[kind], post)

    parts = [first, *block_parts(list(base.layers), f"{pre}layers", wrap, [] if head else [norm])]
    if not head:
        return parts
    kind = type(model).__name__
    if kind.endswith("ForMaskedLM"):
        mods, last = [base.final_norm, model.head, model.decoder], model.decoder
    else:
        pool = [] if kind.endswith("ForTokenClassification") else [
            FirstToken() if model.config.classifier_pooling == "cls" else MeanTokens()]
        mods, last = [base.final_norm, *pool, model.head, model.drop, model.classifier], model.classifier
    names = ("head", "decoder") if kind.endswith("ForMaskedLM") else ("head", "drop", "classifier")
    parts.append(Part(names[-1], "Linear", Chain(*mods), last, (norm[0], *names)))
    return parts


def vit_parts(model: nn.Module) -> list[Part]:
    """ViT's and DeiT's layers: the patch embeddings with the class token (and DeiT's distillation token) and
    positions (``hfmodules.PatchEmbedding``), the blocks attending both ways, the final LayerNorm with the classifier
    over the class token (``ForImageClassification``), or after the last block of the bare model."""
    base, pre, inner = _inner(model, ("vit", "deit"))
    first = Part(f"{pre}embeddings", type(base.embeddings).__name__, PatchEmbedding(base.embeddings),
                 base.embeddings.patch_embeddings.projection, (f"{pre}embeddings",))
    norm = (f"{pre}layernorm", base.layernorm)
    parts = [first, *block_parts(list(base.layers), f"{pre}layers", TransformerBlock, [] if inner else [norm])]
    if inner:
        parts.append(Part("classifier", type(model.classifier).__name__,
                          Chain(base.layernorm, FirstToken(), model.classifier), model.classifier,
                          (norm[0], "classifier")))
    return parts


def vit_tokens(model: nn.Module, pixels: torch.Tensor) -> int:
    """The tokens a ViT's (DeiT's) blocks see for images ``pixels`` (batch, channels, height, width): a patch each
    ``patch_size`` square, the class token, and DeiT's distillation token."""
    patch = int(model.config.patch_size)
    extra = 2 if getattr(model.config, "model_type", "") == "deit" else 1
    return (int(pixels.shape[-2]) // patch) * (int(pixels.shape[-1]) // patch) + extra

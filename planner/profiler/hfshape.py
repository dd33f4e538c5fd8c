"""What the planner's tensor parallelism needs of a transformers model's blocks: :func:`block_shape` (widths, heads,
KV heads, FFN, gating, head size, whether the planner's tensor parallelism shards it), read off its config;
:data:`GATED` and :data:`UNSHARDED` by architecture (``config.model_type``); :func:`plain_shape`, not shardable where
a block's projections are not plain ``nn.Linear`` s. ``planner.profiler.hfsplit`` records one per block.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from torch import nn

from planner import ir
from planner.profiler.hfcode import Match, plain_linears

GATED = frozenset({"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "olmo", "olmo2", "olmo3",
                   "phi3", "glm", "granite", "cohere", "cohere2", "exaone4", "ministral", "stablelm", "modernbert"})
"""The architectures whose MLP is gated (SwiGLU or GeGLU: gate, up and down matrices, Phi-3's and GLM's gate and up
fused)."""

UNSHARDED = frozenset({"phi3", "glm", "olmo2", "olmo3", "gpt_neox", "opt", "cohere", "cohere2", "phi", "starcoder2",
                       "bloom", "falcon", "mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "phimoe", "deepseek_v2",
                       "deepseek_v3", "gpt_oss", "ernie4_5_moe", "glm4_moe", "gpt_bigcode", "stablelm", "nemotron",
                       "mpt", "gpt_neo", "gptj", "codegen", "vit", "deit", "distilbert", "modernbert"})
"""The architectures whose blocks the planner's tensor parallelism does not shard: Phi-3 fuses q/k/v (``qkv_proj``) and
gate/up (``gate_up_proj``), GLM gate/up, GPT-NeoX q/k/v per head (``query_key_value``); OLMo 2 normalises q and k
over all heads together, as OLMo 3 does; OPT names its projections ``out_proj``, ``fc1`` and ``fc2``, which the torch
export's tensor parallelism does not know; Cohere's blocks are not Llama's code (parallel attention and MLP, per-head
q/k LayerNorms; Cohere 2's alike), which the export was not checked on (Granite's are Llama's attention and MLP with
scaled residuals: a tp 2 grid with sequence parallelism trains like one process, tests/test_export_grids); Phi names
its output projection ``dense`` and its MLP ``fc1``/``fc2``, Starcoder2 its MLP ``c_fc``/``c_proj``; BLOOM fuses
q/k/v per head (``query_key_value``) and names its MLP ``dense_h_to_4h``/``dense_4h_to_h``, as Falcon does; the
mixtures of experts (``hfsplit.MIXTURES``) hold their experts' weights as 3-D parameters the engines' tensor
parallelism does not split (no expert parallelism either); GPT-BigCode fuses q with k/v (``c_attn``), MPT q, k and v
(``Wqkv``); StableLM's and Nemotron's blocks (StableLM's optional parallel residual and per-head q/k norms,
Nemotron's LayerNorm1P and squared-ReLU MLP) were not checked under the export's tensor parallelism; GPT-Neo names
its MLP ``c_fc``/``c_proj``, GPT-J ``fc_in``/``fc_out`` (attention beside it, rotary over part of each head), and
CodeGen fuses q/k/v (``qkv_proj``); ViT's, DistilBERT's and ModernBERT's (q/k/v fused, ``Wqkv``) blocks hold their
attention and MLP under names the export does not know (BERT's, RoBERTa's and XLM-RoBERTa's it shards)."""


def block_shape(config: Any, seq_len: int, match: Match | None = None) -> ir.BlockShape | None:
    """A GPT-2, BERT or Llama-family config's block shape at ``seq_len`` tokens, with its ``head_dim`` where that is
    not ``hidden / heads`` (Qwen3 sets it apart: 16 heads of 128 on a width of 1024 in Qwen3-0.6B); None (the
    blocks run ``dp`` only, as layers without shape facts do) where the KV heads do not divide the heads or the
    config lacks a width. ``match``: a decoder recognised by its code (``planner.profiler.hfcode``), whose gating and
    sharding were read off its blocks rather than its ``model_type``."""
    if hasattr(config, "n_embd"):  # GPT-2, GPT-J, CodeGen; GPT-BigCode, with one KV head where it is multi-query
        kv_heads = 1 if getattr(config, "multi_query", False) else config.n_head
        return ir.BlockShape(config.n_embd, config.n_head, kv_heads, config.n_inner or 4 * config.n_embd,
                             seq_len, gated=False, shardable=_shardable(config))
    heads = getattr(config, "num_attention_heads", None)
    ffn = getattr(config, "intermediate_size", None) or getattr(config, "ffn_dim", None)  # OPT: ffn_dim
    if getattr(config, "model_type", "") == "bloom":  # 4h, not in its config
        ffn = 4 * int(config.hidden_size)
    if getattr(config, "model_type", "") == "falcon":
        ffn = config.ffn_hidden_size
    if getattr(config, "model_type", "") == "mpt":
        ffn = int(config.expansion_ratio * config.d_model)
    if getattr(config, "model_type", "") == "gpt_neo":  # intermediate_size None: 4h
        ffn = ffn or 4 * int(config.hidden_size)
    if getattr(config, "model_type", "") == "distilbert":
        ffn = config.hidden_dim
    if not heads or not ffn or not getattr(config, "hidden_size", None):
        return None
    kv_heads = getattr(config, "num_key_value_heads", None) or _falcon_kv_heads(config) or heads
    if heads % kv_heads:
        return None
    gated = match.gated if match else getattr(config, "model_type", "") in GATED
    head_dim = getattr(config, "head_dim", None)
    own = int(head_dim) if head_dim and int(head_dim) * heads != config.hidden_size else None
    if own is None and config.hidden_size % heads:
        return None
    shardable = _shardable(config) and (match is None or match.shardable)
    return ir.BlockShape(config.hidden_size, heads, kv_heads, ffn, seq_len, gated=gated,
                         head_dim=own, shardable=shardable)


def _falcon_kv_heads(config: Any) -> int | None:
    """Falcon's KV heads: ``num_kv_heads`` in its new decoder architecture (40B, 180B), one where it is multi-query
    (7B), else one per head; None for another model."""
    if getattr(config, "model_type", "") != "falcon":
        return None
    if config.new_decoder_architecture:
        return int(config.num_kv_heads)
    return 1 if config.multi_query else int(config.num_attention_heads)


def _shardable(config: Any) -> bool:
    """Whether the planner's tensor parallelism can shard the config's blocks (:data:`UNSHARDED`; OLMo with
    ``clip_qkv`` clamps q/k/v in place, on views torch's tensor-parallel Linears return, which autograd refuses)."""
    return getattr(config, "model_type", "") not in UNSHARDED and getattr(config, "clip_qkv", None) is None


def plain_shape(shape: ir.BlockShape | None, blocks: Sequence[nn.Module]) -> ir.BlockShape | None:
    """``shape``, not shardable where a Llama-style block (``self_attn``, ``mlp``) holds a projection the export
    shards that is not a plain ``nn.Linear`` (an adapter wrapped around one, say): torch's parallel styles take
    only Linears."""
    llama_style = [b for b in blocks if hasattr(b, "self_attn") and hasattr(b, "mlp")]
    if shape is None or not shape.shardable or all(plain_linears(b) for b in llama_style):
        return shape
    return dataclasses.replace(shape, shardable=False)

"""profiler.hfsplit (and the hfmodules it runs): GPT-2, BERT and the Llama family split by structure, exact, with
block shapes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from planner import ir
from planner.errors import TraceError
from planner.profiler.hfshape import block_shape
from planner.profiler.hfsplit import split_hf
from planner.profiler.hfzoo import bert, build, gpt2, llama
from planner.profiler.layered import LayeredModel, primary_output
from planner.profiler.loader import load_model
from tests.test_profiler_fxsplit import check_exact


def _split(model: nn.Module, x: torch.Tensor) -> LayeredModel:
    lm = split_hf(model, x)
    assert lm is not None
    for layer, kind in zip(lm.layers, lm.types, strict=True):  # "Linear": one the torch export's split forms shard
        assert kind != "Linear" or sum(isinstance(m, nn.Linear) for m in layer.modules()) == 1
    return lm


def test_gpt2_split_is_exact_ties_wte_and_lm_head_and_records_blocks() -> None:
    torch.manual_seed(0)
    model = gpt2(n_layer=2, n_embd=64, n_head=4, vocab_size=101)
    x = torch.randint(0, 101, (2, 12))
    lm = _split(model, x)
    check_exact(model, x, lm.layers, lm.param_counts)
    assert lm.names[0] == "transformer.wte" and lm.names[-1] == "lm_head" and len(lm) == 4
    assert lm.ties == (ir.Tie("transformer.wte.weight", (0, 3), 101 * 64, 101 * 64 * 4),)
    assert lm.param_counts[-1] == 64 * 2  # ln_f only: lm_head.weight counted in layer 0
    assert [lm.block(i) for i in (0, 3)] == [None, None]
    assert lm.block(1) == ir.BlockShape(hidden=64, heads=4, kv_heads=4, ffn=256, seq_len=12, gated=False)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("upcast", [False, True])
def test_gpt2_splits_exactly_under_eager_attention_too(attention: str, upcast: bool) -> None:
    """GPT-2 built with eager attention (its forward then hands each block an additive causal mask, which the
    split blocks rebuild), with or without reorder_and_upcast_attn: bit for bit as LM and bare model (eager was
    refused: the blocks got no mask)."""
    import transformers

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=101, reorder_and_upcast_attn=upcast, attn_implementation=attention))
    x = torch.randint(0, 101, (2, 12))
    for m in (model, model.transformer):
        lm = _split(m, x)
        check_exact(m, x, lm.layers, lm.param_counts)


def test_bert_split_is_exact_with_its_blocks() -> None:
    torch.manual_seed(0)
    model = bert(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=99)
    x = torch.randint(0, 99, (2, 10))
    lm = _split(model, x)
    check_exact(model, x, lm.layers, lm.param_counts)
    assert lm.block(2) == ir.BlockShape(64, 4, 4, 128, 10, gated=False)


@pytest.mark.parametrize("tied", [False, True])
def test_llama_split_is_exact_with_gqa_blocks_and_ties(tied: bool) -> None:
    torch.manual_seed(0)
    model = llama(tie_word_embeddings=tied)
    x = torch.randint(0, 256, (2, 16))
    lm = _split(model, x)
    check_exact(model, x, lm.layers, lm.param_counts)
    assert lm.names == ("model.embed_tokens", "model.layers.0", "model.layers.1", "lm_head")
    assert lm.types[1] == "LlamaDecoderLayer" and lm.method == "structure:llama"
    assert [n for n, _ in lm.layers[0].named_parameters()] == ["embed_tokens.weight"]  # the tie's name in export
    assert lm.block(1) == lm.block(2) == ir.BlockShape(hidden=64, heads=4, kv_heads=2, ffn=128, seq_len=16, gated=True)
    assert lm.ties == ((ir.Tie("model.embed_tokens.weight", (0, 3), 256 * 64, 256 * 64 * 4),) if tied else ())


def test_llama_base_model_ends_with_the_norm_after_its_last_block() -> None:
    torch.manual_seed(0)
    model = llama().model  # LlamaModel: no LM head
    x = torch.randint(0, 256, (2, 8))
    lm = _split(model, x)
    check_exact(model, x, lm.layers, lm.param_counts)
    assert lm.names == ("embed_tokens", "layers.0", "layers.1") and lm.scopes[-1] == ("layers.1", "norm")


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_layers_run_on_micro_batches_and_shorter_sequences(name: str) -> None:
    """Pipeline engines run the layers on micro-batches: nothing is specialised to the split's example."""
    torch.manual_seed(0)
    model = gpt2(n_layer=1, n_embd=32, n_head=2, vocab_size=50) if name == "gpt2" else llama(vocab_size=50)
    lm = _split(model, torch.randint(0, 50, (4, 8)))
    model.eval()
    micro = torch.randint(0, 50, (1, 6))
    with torch.no_grad():
        assert torch.equal(lm.run(micro), primary_output(model(micro)))


@pytest.mark.parametrize(("name", "fields"), [
    ("mistral-7b", {}), ("qwen2-7b", {}), ("qwen3-8b", {"head_dim": 32}),
    ("mistral-7b", {"sliding_window": 16}),  # a window as long as the sequence masks as causal does
])
def test_llama_family_decoders_split_exactly_like_llama(name: str, fields: dict[str, object]) -> None:
    """Mistral, Qwen2 (q/k/v biases) and Qwen3 (q/k norms, a head size other than hidden / heads) run
    Llama's forward: the same split, bit for bit, with gated blocks, the causal LM head or the bare model."""
    torch.manual_seed(0)
    model = build(name, 16, {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                             "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 96, **fields})
    x = torch.randint(0, 96, (2, 16))
    for m in (model, model.model):
        lm = _split(m, x)
        check_exact(m, x, lm.layers, lm.param_counts)
        assert lm.method == f"structure:{name.split('-')[0]}" and len(lm) == 4 - (m is model.model)
        head_dim = fields.get("head_dim")  # Qwen3's 4 heads of 32 on a width of 64: the shape says so
        assert lm.block(1) == ir.BlockShape(64, 4, 2, 128, 16, gated=True,
                                            head_dim=int(head_dim) if isinstance(head_dim, int) else None)


_FAMILIES = {  # family: (config fields beyond the shared ones, gated, shardable by the planner's tensor parallelism)
    "Gemma": ({"head_dim": 16}, True, True),  # GeGLU; its embedding scales by sqrt(hidden) in its own forward
    "Olmo": ({}, True, True),
    "Olmo2": ({}, True, False),  # q/k norms over all heads together
    "Phi3": ({}, True, False),  # fused qkv_proj and gate_up_proj
    "Glm": ({"head_dim": 16}, True, False),  # fused gate_up_proj
    "Arcee": ({}, False, True),  # ReLU^2 MLP: up and down only
    "StableLm": ({"use_qkv_bias": True, "qk_layernorm": True}, True, False),  # per-head q/k LayerNorms
    "Nemotron": ({}, False, False),  # LayerNorm1P, a squared-ReLU MLP (up and down)
}


_MLA = {"kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
        "num_key_value_heads": 4}
_MIXTURE_FIELDS: dict[str, dict[str, object]] = {  # 4 experts, 2 a token, and what each family needs beside
    "Mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "Qwen2Moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                 "shared_expert_intermediate_size": 64},
    "Qwen3Moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
    "Olmoe": {"num_experts": 4, "num_experts_per_tok": 2},
    "Phimoe": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "DeepseekV2": {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                   "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, **_MLA},
    "DeepseekV3": {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                   "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, **_MLA},
    "GptOss": {"num_local_experts": 4, "num_experts_per_tok": 2, "head_dim": 16},
    "Ernie4_5_Moe": {"moe_num_experts": 4, "moe_k": 2, "moe_intermediate_size": 32},
    "Glm4Moe": {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1},
}
"""The mixtures of experts split as Llama (``hfsplit.MIXTURES``), each as a tiny config."""


def family_model(family: str, vocab: int = 96, **fields: object) -> nn.Module:
    """transformers' ``<family>ForCausalLM`` at hidden 64, 2 blocks, 4 heads (2 KV heads where the family has them),
    FFN 128, 64 positions, ``vocab`` tokens (the export tests' models too)."""
    import transformers

    own: dict[str, object] = {"GPTNeoX": {"intermediate_size": 128}, "OPT": {"ffn_dim": 128, "dropout": 0.0},
                              "Bloom": {}, "Falcon": {}, "GPTBigCode": {"n_inner": 128}, "GPTJ": {"rotary_dim": 8},
                              "CodeGen": {"rotary_dim": 8},
                              "GPTNeo": {"attention_types": [[["global", "local"], 1]], "window_size": 5}}.get(
        family, {"intermediate_size": 128, "num_key_value_heads": 2, **_FAMILIES.get(family, ({}, 0, 0))[0],
                 **_MIXTURE_FIELDS.get(family, {})})
    config = getattr(transformers, f"{family}Config")(**{
        "vocab_size": vocab, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "max_position_embeddings": 64, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0, **own, **fields})
    return getattr(transformers, f"{family.removesuffix('Text')}ForCausalLM")(config)  # Gemma3TextConfig: Gemma3's


@pytest.mark.parametrize("family", sorted(_FAMILIES))
def test_decoders_with_llamas_forward_split_exactly_like_llama(family: str) -> None:
    """Gemma, OLMo, OLMo 2, Phi-3, GLM, Arcee, StableLM and Nemotron run Llama's model and causal-LM forward
    (transformers 5.24, StableLM's and Nemotron's looping over every layer, as many as the config's): the
    same split, bit for bit, for the causal LM and the bare model; blocks the planner's tensor parallelism cannot
    shard say so in their shape, and Gemma's scaled embedding is not offered the vocabulary split."""
    torch.manual_seed(0)
    model = family_model(family)
    x = torch.randint(0, 96, (2, 16))
    _, gated, shardable = _FAMILIES[family]
    lm = _exact_both(model, model.model, x, family.lower())
    shape = lm.block(1)
    assert shape is not None and (shape.gated, shape.shardable, shape.kv_heads) == (gated, shardable, 2)
    assert shape.splits_over(2) is shardable and shape.splits_over(1)
    assert (lm.in_features[0] is None) is (family == "Gemma")


def _exact_both(model: nn.Module, bare: nn.Module, x: torch.Tensor, arch: str) -> LayeredModel:
    """The causal LM and its bare model each split exactly (the bare one ends with its last block), one tensor
    crossing each cut of torch.export's data flow (planner.profiler.verify); the LM's split."""
    from planner.profiler.verify import verify_cuts

    for m in (model, bare):
        lm = _split(m, x)
        check_exact(m, x, lm.layers, lm.param_counts)
        assert lm.method == f"structure:{arch}" and len(lm) == 4 - (m is bare)
        assert verify_cuts(m, x, lm) == [1] * (len(lm) - 1)
    return _split(model, x)


def _check_dropout(dropped: nn.Module) -> None:
    """``dropped`` (a causal LM with dropout) training: its split draws the same dropout masks, so the same logits;
    the dropout was on (evaluation gives others)."""
    dropped.train()
    x = torch.randint(0, 96, (2, 16))
    torch.manual_seed(1)
    want = dropped(x).logits
    torch.manual_seed(1)
    assert torch.equal(_split(dropped, x).run(x), want)
    assert not torch.equal(dropped.eval()(x).logits, want)


def test_gpt_neox_splits_exactly_with_its_own_names_and_unsharded_blocks() -> None:
    """GPT-NeoX (Pythia): embed_in and its dropout, rotary blocks with q/k/v fused per head (not sharded), the final
    LayerNorm with the LM head; bit for bit, as a causal LM and a bare model."""
    torch.manual_seed(0)
    model = family_model("GPTNeoX")
    lm = _exact_both(model, model.gpt_neox, torch.randint(0, 96, (2, 16)), "gpt_neox")
    assert lm.names == ("gpt_neox.embed_in", "gpt_neox.layers.0", "gpt_neox.layers.1", "lm_head")
    assert lm.block(1) == ir.BlockShape(64, 4, 4, 128, 16, gated=False, shardable=False)
    assert lm.in_features[0] == 96  # a plain embedding: its vocabulary may be split


@pytest.mark.parametrize("fields", [{}, {"num_attention_heads": 6, "hidden_size": 96},
                                    {"apply_residual_connection_post_layernorm": True}])
def test_bloom_splits_exactly_with_alibi_masks_and_its_tied_head(fields: dict[str, object]) -> None:
    """BLOOM: each block rebuilds its ALiBi biases (6 heads, not a power of two, take the interleaved extra slopes)
    and its additive causal mask; the embedding's LayerNorm is in the first layer, the head tied to the embedding;
    bit for bit as a causal LM and a bare model, on micro-batches and shorter sequences, and in training with
    dropout; its blocks (q/k/v fused per head) not sharded."""
    torch.manual_seed(0)
    model = family_model("Bloom", **fields)
    lm = _exact_both(model, model.transformer, torch.randint(0, 96, (2, 16)), "bloom")
    assert lm.names == ("transformer.word_embeddings", "transformer.h.0", "transformer.h.1", "lm_head")
    hidden, heads = model.config.hidden_size, model.config.n_head
    assert lm.block(1) == ir.BlockShape(hidden, heads, heads, 4 * hidden, 16, gated=False, shardable=False)
    assert [t.layers for t in lm.ties] == [(0, 3)] and lm.in_features[0] == 96
    check_exact(model, torch.randint(0, 96, (1, 6)), lm.layers, lm.param_counts)
    _check_dropout(family_model("Bloom", hidden_dropout=0.2, attention_dropout=0.2, **fields))


@pytest.mark.parametrize(("fields", "kv_heads"), [
    ({}, 1),  # Falcon 7B: multi-query, parallel attention and MLP, rotary
    ({"new_decoder_architecture": True, "num_kv_heads": 2}, 2),  # 40B and 180B: grouped KV heads, two norms
    ({"multi_query": False, "parallel_attn": False, "bias": True}, 4),
    ({"alibi": True}, 1),  # RW's ALiBi variant: biases passed to the blocks and folded into the mask
    ({"alibi": True, "attn_implementation": "eager"}, 1),
    ({"attn_implementation": "eager"}, 1),
])
def test_falcon_splits_exactly_in_each_of_its_variants(fields: dict[str, object], kv_heads: int) -> None:
    """Falcon: each block rebuilds its rotary embeddings, the causal mask its forward always builds (for SDPA or
    eager) and, with ``alibi``, the biases, folded into the mask as the forward does; bit for bit as a causal LM and
    a bare model, and on a shorter micro-batch; its KV heads as the variant has them, its blocks (q/k/v fused) not
    sharded."""
    torch.manual_seed(0)
    model = family_model("Falcon", **fields)
    lm = _exact_both(model, model.transformer, torch.randint(0, 96, (2, 16)), "falcon")
    assert lm.names == ("transformer.word_embeddings", "transformer.h.0", "transformer.h.1", "lm_head")
    assert lm.block(1) == ir.BlockShape(64, 4, kv_heads, 256, 16, gated=False, shardable=False)
    assert [t.layers for t in lm.ties] == [(0, 3)]
    check_exact(model, torch.randint(0, 96, (1, 6)), lm.layers, lm.param_counts)


@pytest.mark.parametrize("family", sorted(_MIXTURE_FIELDS))
def test_mixtures_of_experts_split_exactly_like_llama_unsharded(family: str) -> None:
    """Mixtral, Qwen2-MoE (a shared expert), Qwen3-MoE, OLMoE, PhiMoE, DeepSeek V2 and V3 (latent attention, a dense
    first block), gpt-oss (attention sinks, sliding layers), ERNIE 4.5 MoE and GLM-4 MoE run Llama's steps with their
    routed blocks: the same split, bit for bit, as causal LM and bare model; their blocks are not sharded."""
    torch.manual_seed(0)
    model = family_model(family)
    arch = str(model.config.model_type)
    lm = _exact_both(model, model.model, torch.randint(0, 96, (2, 16)), arch)
    shape = lm.block(2)
    assert shape is not None and not shape.shardable and not shape.splits_over(2)


def test_a_mixture_with_its_load_balancing_loss_is_refused() -> None:
    """output_router_logits adds a loss over every block's router logits, which no cut passes: refused with the fix."""
    with pytest.raises(TraceError, match=r"output_router_logits=True.*router_aux_loss_coef=0\.02") as err:
        split_hf(family_model("Mixtral", output_router_logits=True, router_aux_loss_coef=0.02),
                 torch.randint(0, 96, (1, 8)))
    assert "output_router_logits=False" in err.value.hint


def test_a_bare_mixture_returning_its_router_logits_splits_exactly() -> None:
    """A bare model (MixtralModel) has no loss to add the load-balancing one to: its hidden states are the split's,
    bit for bit, whatever router logits it also returns (it was refused as though it trained that loss)."""
    torch.manual_seed(0)
    bare = family_model("Mixtral", output_router_logits=True).model
    x = torch.randint(0, 96, (2, 16))
    lm = _split(bare, x)
    check_exact(bare, x, lm.layers, lm.param_counts)


@pytest.mark.parametrize(("multi_query", "attention"), [(True, "sdpa"), (False, "sdpa"), (True, "eager")])
def test_gpt_bigcode_splits_exactly_as_gpt2_with_its_masks(multi_query: bool, attention: str) -> None:
    """GPT-BigCode (StarCoder, SantaCoder): GPT-2's layers, multi-query attention or not, SDPA or eager attention
    (each block handed the additive causal mask its forward builds); bit for bit as causal LM and bare model; one KV
    head where multi-query; its blocks (q fused with k and v) not sharded."""
    torch.manual_seed(0)
    model = family_model("GPTBigCode", multi_query=multi_query, attn_implementation=attention)
    assert model.config._attn_implementation == attention
    lm = _exact_both(model, model.transformer, torch.randint(0, 96, (2, 16)), "gpt_bigcode")
    assert lm.names == ("transformer.wte", "transformer.h.0", "transformer.h.1", "lm_head")
    assert lm.block(1) == ir.BlockShape(64, 4, 1 if multi_query else 4, 128, 16, gated=False, shardable=False)
    assert [t.layers for t in lm.ties] == [(0, 3)]
    with pytest.raises(TraceError, match=r"64 learned positions \(n_positions\)"):
        split_hf(model, torch.randint(0, 96, (1, 80)))


_DROPOUTS = {"GPTJ": ("resid_pdrop", "embd_pdrop", "attn_pdrop"),
             "CodeGen": ("resid_pdrop", "embd_pdrop", "attn_pdrop"),
             "GPTNeo": ("resid_dropout", "embed_dropout", "attention_dropout")}
"""Each family's dropout fields (residual, embedding, attention)."""


@pytest.mark.parametrize(("family", "fields"), [
    ("GPTJ", {}),  # rotary over the first 8 of each head's 16 channels
    ("GPTJ", {"rotary_dim": 16, "attn_implementation": "eager"}),  # over all of them; eager attention, masked
    ("CodeGen", {}), ("CodeGen", {"attn_implementation": "eager"}),  # q/k/v fused in groups
    ("GPTNeo", {}),  # global and local layers (a window of 5 of the 16 tokens), eager attention only
])
def test_gpt_j_codegen_and_gpt_neo_split_exactly(family: str, fields: dict[str, object]) -> None:
    """GPT-J and CodeGen (the embedding's dropout in the first layer, blocks rebuilding their sinusoidal rotary
    positions and masks) and GPT-Neo (GPT-2's layers, its local layers masking within their window themselves): bit
    for bit as causal LM and bare model, on a shorter micro-batch, and in training with dropout; their blocks not
    sharded; a sequence past the position table refused."""
    torch.manual_seed(0)
    model = family_model(family, **fields)
    arch = str(model.config.model_type)
    lm = _exact_both(model, model.transformer, torch.randint(0, 96, (2, 16)), arch)
    assert lm.names == ("transformer.wte", "transformer.h.0", "transformer.h.1", "lm_head")
    assert lm.block(1) == ir.BlockShape(64, 4, 4, 256, 16, gated=False, shardable=False)
    assert [t.layers for t in lm.ties] == ([(0, 3)] if family == "GPTNeo" else [])
    check_exact(model, torch.randint(0, 96, (1, 6)), lm.layers, lm.param_counts)
    _check_dropout(family_model(family, **fields, **dict.fromkeys(_DROPOUTS[family], 0.2)))
    field = "max_position_embeddings" if family == "GPTNeo" else "n_positions"
    with pytest.raises(TraceError, match=rf"64 (learned|rotary) positions \({field}\).*80-token"):
        split_hf(model, torch.randint(0, 96, (1, 80)))


@pytest.mark.parametrize("fields", [{}, {"n_heads": 6, "d_model": 96}, {"no_bias": False},
                                    {"attn_config": {"clip_qkv": 2.0, "softmax_scale": 0.3}}])
def test_mpt_splits_exactly_with_its_alibi_biases_and_positions(fields: dict[str, object]) -> None:
    """MPT: each block handed its ALiBi biases over max_seq_len positions (6 heads, not a power of two, interleave
    the slopes) and the boolean causal mask its forward makes; bit for bit as causal LM and bare model, at the
    sequence's length and at max_seq_len; a longer sequence is refused (its biases cover max_seq_len positions);
    its blocks (q, k and v fused) not sharded."""
    import transformers

    torch.manual_seed(0)
    config = {"vocab_size": 96, "d_model": 64, "n_layers": 2, "n_heads": 4, "max_seq_len": 32, **fields}
    model = transformers.MptForCausalLM(transformers.MptConfig(**config))
    lm = _exact_both(model, model.transformer, torch.randint(0, 96, (2, 16)), "mpt")
    hidden, heads = model.config.d_model, model.config.n_heads
    assert lm.block(1) == ir.BlockShape(hidden, heads, heads, 4 * hidden, 16, gated=False, shardable=False)
    assert [t.layers for t in lm.ties] == [(0, 3)]
    check_exact(model, torch.randint(0, 96, (1, 32)), lm.layers, lm.param_counts)
    with pytest.raises(TraceError, match=r"32 positions of ALiBi biases \(max_seq_len\).*40-token") as err:
        split_hf(model, torch.randint(0, 96, (1, 40)))
    assert "max_seq_len=40" in err.value.hint


@pytest.mark.parametrize("fields", [{}, {"word_embed_proj_dim": 32}, {"do_layer_norm_before": False}])
def test_opt_splits_exactly_with_its_positions_projections_and_tied_head(fields: dict[str, object]) -> None:
    """OPT: token plus learned positions (offset by 2), project_in/project_out where its embedding is narrower
    (OPT-350m), post-LN blocks without a final norm; bit for bit, as a causal LM and a bare model, the head tied."""
    torch.manual_seed(0)
    model = family_model("OPT", **fields)
    lm = _exact_both(model, model.model, torch.randint(0, 96, (2, 16)), "opt")
    bare = _split(model.model, torch.randint(0, 96, (2, 16)))
    assert bare.scopes[-1] == ("decoder.layers.1", *(f"decoder.{m}" for m in ("final_layer_norm", "project_out")
                                                       if getattr(model.model.decoder, m) is not None))
    assert lm.block(1) == ir.BlockShape(64, 4, 4, 128, 16, gated=False, shardable=False)  # out_proj, fc1, fc2
    assert [t.layers for t in lm.ties] == [(0, 3)]


def test_opt_refuses_layerdrop_and_sequences_past_its_positions() -> None:
    with pytest.raises(TraceError, match=r"layerdrop=0\.1") as err:
        split_hf(family_model("OPT", layerdrop=0.1), torch.randint(0, 96, (1, 8)))
    assert "layerdrop=0.0" in err.value.hint
    with pytest.raises(TraceError, match=r"64 learned positions \(max_position_embeddings\)"):
        split_hf(family_model("OPT"), torch.randint(0, 96, (1, 80)))


def test_olmo_clipping_q_k_v_in_place_is_not_sharded() -> None:
    """OLMo's clip_qkv clamps q, k and v in place; torch's tensor-parallel Linears return views autograd then
    refuses to let it modify (a two-process run failed), so those blocks run data and pipeline parallel only."""
    x = torch.randint(0, 96, (1, 8))
    clipped = _split(family_model("Olmo", clip_qkv=8.0), x).block(1)
    assert clipped is not None and not clipped.shardable and not clipped.splits_over(2)


def test_block_shape_reads_gpt2_bert_and_llama_configs() -> None:
    assert block_shape(gpt2(n_layer=1, n_embd=32, n_head=2, n_inner=48).config, 7) == ir.BlockShape(32, 2, 2, 48, 7)
    cfg = load_model("llama2-70b", 1, (4,), device="meta").module.config
    assert block_shape(cfg, 4096) == ir.BlockShape(8192, 64, 8, 28672, 4096, gated=True)


def test_other_models_are_not_split_by_structure_and_flash_attention_is_refused() -> None:
    """Eager attention runs where the blocks rebuild their masks (tests/test_profiler_hfmasks.py); an attention
    whose mask the blocks do not build is refused with the implementations that run."""
    assert split_hf(nn.Linear(2, 2), torch.zeros(1, 2)) is None
    model = llama()
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(TraceError, match="attn_implementation='flash_attention_2'") as err:
        split_hf(model, torch.randint(0, 256, (1, 4)))
    assert "attn_implementation='sdpa' or 'eager'" in err.value.hint


def own_llama() -> nn.Module:
    """A user's factory returning a transformers Llama (planner recognises the class)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                        num_attention_heads=4, num_key_value_heads=1))


def test_a_factory_built_llama_is_split_by_structure_with_token_inputs() -> None:
    loaded = load_model("tests.test_profiler_hfsplit:own_llama", 2, (9,))
    assert loaded.example_input.dtype == torch.long and int(loaded.example_input.max()) < 64
    lm = _split(loaded.module, loaded.example_input)
    check_exact(loaded.module, loaded.example_input, lm.layers, lm.param_counts)
    assert len(lm) == 5 and lm.block(3) == ir.BlockShape(32, 4, 1, 64, 9, gated=True)


def test_a_gpt2_shorter_than_the_sequence_is_refused() -> None:
    """GPT-2's learned positions end at n_positions; on the meta device the lookup past them is not checked, so an
    analytic profile was written for a model that cannot run at that length (measured: index out of range)."""
    model = gpt2(n_layer=1, n_embd=32, n_head=2, vocab_size=50, n_positions=8)
    with pytest.raises(TraceError, match=r"8 learned positions .*fewer than the 16-token sequence") as err:
        split_hf(model, torch.randint(0, 50, (1, 16), device="meta"))
    assert "--input-shape 8 or less" in err.value.hint
    assert split_hf(model, torch.randint(0, 50, (1, 8))) is not None


def test_a_qwen3_whose_heads_do_not_divide_its_hidden_size_records_its_head_dim() -> None:
    """Qwen3 sets head_dim apart from the hidden size, so 3 heads of 16 over a hidden size of 40 is a model it
    builds and runs; a block shape that split the hidden size by heads was refused when the profile was written
    ("out of what a profile file holds"): the shape records the head width."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=32, hidden_size=40, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=3, num_key_value_heads=1, head_dim=16))
    shape = block_shape(model.config, 8)
    assert shape is not None and shape.head_dim == 16 and shape.attention_width == 48
    assert ir.BlockShape.from_dict(shape.to_dict()) == shape
    x = torch.randint(0, 32, (2, 8))
    lm = _split(model, x)
    check_exact(model, x, lm.layers, lm.param_counts)
    assert [lm.block(i) for i in range(len(lm))] == [None, shape, shape, None]
    usual = block_shape(Qwen3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16), 8)
    assert usual is not None and usual.head_dim is None and "head_dim" not in usual.to_dict()


@pytest.mark.parametrize("family", ["Llama", "GPT2", "GPTNeoX", "Helium"])
def test_a_decoder_built_to_attend_both_ways_is_refused(family: str) -> None:
    """transformers' ``is_causal=False`` makes a decoder's forward mask bidirectionally; the split blocks get no mask
    and SDPA masks them causally (Llama's logits were 0.64 apart): refused, named and recognised classes alike."""
    model = gpt2(n_layer=1, n_embd=32, n_head=2, vocab_size=96) if family == "GPT2" else family_model(family)
    model.config.is_causal = False
    with pytest.raises(TraceError, match="is_causal=False: its forward lets every token attend") as err:
        split_hf(model, torch.randint(0, 96, (1, 8)))
    assert "is_causal=True" in err.value.hint


def test_a_llama_running_fewer_layers_than_it_holds_is_split_as_it_runs() -> None:
    """Llama's forward runs ``layers[: config.num_hidden_layers]``: a model whose config was cut to 2 of its 3 layers
    (to profile it smaller) runs 2, and so do its split layers; the third's weights are in none (was: 3 blocks)."""
    torch.manual_seed(0)
    for model in (family_model("Llama", num_hidden_layers=3), family_model("Helium", num_hidden_layers=3, head_dim=16)):
        model.config.num_hidden_layers = 2
        x = torch.randint(0, 96, (2, 16))
        lm = _split(model, x)
        model.eval()
        with torch.no_grad():
            assert torch.equal(lm.run(x), model(x).logits)
        assert len(lm) == 4 and lm.names[2] == "model.layers.1"
        unused = sum(p.numel() for p in model.model.layers[2].parameters())
        assert sum(lm.param_counts) == sum(p.numel() for p in model.parameters()) - unused


class _Adapter(nn.Module):
    """A low-rank adapter around a projection (as a user's own LoRA wraps one): not an nn.Linear itself."""

    def __init__(self, base: nn.Linear) -> None:
        super().__init__()
        self.base, self.down, self.up = base, nn.Linear(base.in_features, 4), nn.Linear(4, base.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.up(self.down(x))  # type: ignore[no-any-return]


@pytest.mark.parametrize("family", ["Llama", "Granite", "Helium"])
def test_blocks_with_a_projection_other_than_a_linear_are_not_sharded(family: str) -> None:
    """torch's column and row parallel styles take only nn.Linear (a tp 2 run of a Llama whose q_proj an adapter
    wraps failed: "ColwiseParallel currently only support nn.Linear"); a named family's blocks, as a recognised
    one's, are sharded only where every projection the export shards is one, in every block."""
    torch.manual_seed(0)
    model = family_model(family, head_dim=16)
    x = torch.randint(0, 96, (2, 8))
    before = _split(model, x).block(1)
    assert before is not None and before.shardable
    model.model.layers[1].self_attn.q_proj = _Adapter(model.model.layers[1].self_attn.q_proj)
    lm = _split(model, x)
    check_exact(model, x, lm.layers, lm.param_counts)
    shapes = [lm.block(i) for i in (1, 2)]
    assert all(s is not None and not s.shardable and not s.splits_over(2) for s in shapes)


def test_a_mixture_routing_tokens_to_more_experts_than_it_has_is_refused() -> None:
    """Mixtral with 2 experts a token of 1 (its router's top-k would fail on the first forward, reported as an input
    the model rejects): refused naming the fields."""
    with pytest.raises(TraceError, match=r"num_experts_per_tok=2 experts, more than the 1 a block has") as err:
        split_hf(family_model("Mixtral", num_local_experts=1), torch.randint(0, 96, (1, 8)))
    assert "num_experts_per_tok at most 1" in err.value.hint


def test_a_model_whose_kv_heads_do_not_divide_its_heads_is_refused() -> None:
    """Llama with 4 heads over 3 KV heads cannot run (its first forward fails on the CPU), but on the meta device,
    where analytic profiles run, attention let it through and the profile of a model no engine can train was
    written: refused naming both fields and the KV head counts that work."""
    with torch.device("meta"):
        model = family_model("Llama", num_key_value_heads=3)
    with pytest.raises(TraceError) as err:
        split_hf(model, torch.randint(0, 96, (1, 8), device="meta"))
    assert "num_attention_heads=4 is not a multiple of num_key_value_heads=3" in err.value.cause
    assert "must be one of 1, 2, 4" in err.value.cause

"""profiler.verify: structural splits checked against torch.export's data flow (one tensor crosses each cut)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from planner.errors import TraceError
from planner.profiler.hfzoo import bert, gpt2, llama
from planner.profiler.layers import split_model
from planner.profiler.verify import verify_cuts


def test_structural_splits_match_the_exported_data_flow() -> None:
    """torch.export (non-strict) + networkx: exactly one input-derived tensor crosses every cut."""
    torch.manual_seed(0)
    for model in (gpt2(n_layer=2, n_embd=32, n_head=2, vocab_size=50, bos_token_id=0, eos_token_id=0),
                  bert(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                       vocab_size=50),
                  llama(vocab_size=50, tie_word_embeddings=True)):
        x = torch.randint(0, 50, (2, 8))
        lm = split_model(model, x)
        assert verify_cuts(model, x, lm) == [1] * (len(lm) - 1)


def test_verify_cuts_catches_a_cut_inside_a_residual_block() -> None:
    model = gpt2(n_layer=1, n_embd=32, n_head=2, vocab_size=50, bos_token_id=0, eos_token_id=0)
    x = torch.randint(0, 50, (2, 8))
    lm = split_model(model, x)
    bad = dataclasses.replace(
        lm, layers=(*lm.layers, lm.layers[-1]), names=("emb", "ln_1", "rest", "head"),
        scopes=(lm.scopes[0], ("transformer.h.0.ln_1",), ("transformer.h.0",), lm.scopes[-1]))
    with pytest.raises(TraceError, match="2 tensors cross the cut after layer 1"):
        verify_cuts(model, x, bad)


def test_a_cut_inside_a_llama_block_is_caught_too() -> None:
    model = llama(num_hidden_layers=1, vocab_size=50)
    x = torch.randint(0, 50, (2, 8))
    lm = split_model(model, x)
    bad = dataclasses.replace(
        lm, layers=(*lm.layers, lm.layers[-1]), names=("emb", "attn", "rest", "head"),
        scopes=(lm.scopes[0], ("model.layers.0.input_layernorm", "model.layers.0.self_attn"), ("model.layers.0",),
                lm.scopes[-1]))
    with pytest.raises(TraceError, match="cross the cut after layer 1"):
        verify_cuts(model, x, bad)


def test_fx_splits_need_no_verification() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    x = torch.zeros(1, 2)
    with pytest.raises(TraceError, match="structural split"):
        verify_cuts(model, x, split_model(model, x))

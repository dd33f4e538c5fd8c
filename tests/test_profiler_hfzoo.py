"""profiler.hfzoo: GPT-2, BERT and Llama from published configs, any sequence length, config overrides."""

from __future__ import annotations

import pytest
import torch

from planner.errors import UsageError
from planner.profiler.hfzoo import HF_MODELS, build, check_overrides, config_keys, llama
from planner.profiler.loader import load_model


@pytest.mark.parametrize(("name", "params"), [
    ("llama2-7b", 6_738_415_616), ("llama2-13b", 13_015_864_320), ("llama2-70b", 68_976_648_192),
    ("llama3-8b", 8_030_261_248), ("llama3-70b", 70_553_706_496),
])
def test_llama_sizes_have_the_published_parameter_counts(name: str, params: int) -> None:
    with torch.device("meta"):
        model = build(name)
    assert sum(p.numel() for p in model.parameters()) == params
    assert model.config._attn_implementation == "sdpa" and not model.config.tie_word_embeddings


def test_llama3_70b_config_matches_the_published_table() -> None:
    fields = HF_MODELS["llama3-70b"].fields
    assert (fields["hidden_size"], fields["num_hidden_layers"], fields["num_attention_heads"],
            fields["num_key_value_heads"], fields["intermediate_size"], fields["vocab_size"],
            fields["max_position_embeddings"]) == (8192, 80, 64, 8, 28672, 128256, 8192)
    assert HF_MODELS["llama3-70b"].seq_len == 8192 and HF_MODELS["llama2-7b"].seq_len == 4096


def test_sequence_length_raises_the_position_range_only_when_longer() -> None:
    with torch.device("meta"):
        assert build("gpt2", seq_len=4096).config.n_positions == 4096
        assert build("gpt2", seq_len=64).config.n_positions == 1024
        assert build("bert-base", seq_len=2048).config.max_position_embeddings == 2048
        assert build("llama2-7b", seq_len=16384).config.max_position_embeddings == 16384


def test_overrides_set_config_fields() -> None:
    model = llama("llama-tiny", num_hidden_layers=3, rms_norm_eps=1e-6, tie_word_embeddings=True)
    assert len(model.model.layers) == 3 and model.config.rms_norm_eps == 1e-6
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert {"n_layer", "hidden_size", "n_positions"} <= config_keys("gpt2")  # attribute_map names too


def test_an_unknown_field_names_the_close_ones() -> None:
    with pytest.raises(UsageError) as err:
        check_overrides("llama2-7b", {"num_hiden_layers": 2})
    assert "no field 'num_hiden_layers'" in err.value.cause and "num_hidden_layers" in err.value.hint
    with pytest.raises(UsageError, match="rejects the config"):
        build("llama-tiny", overrides={"num_attention_heads": 3, "num_key_value_heads": 2})


def test_load_model_applies_overrides_to_zoo_transformers_only() -> None:
    loaded = load_model("llama2-70b", 1, (32,), device="meta", overrides={"num_hidden_layers": 2})
    assert len(loaded.module.model.layers) == 2 and tuple(loaded.example_input.shape) == (1, 32)
    with pytest.raises(UsageError, match="no transformer"):
        load_model("mlp", 2, overrides={"depth": 2})
    with pytest.raises(UsageError, match="your own model"):
        load_model("tests.test_profiler_zoo:_pair_factory", 2, overrides={"n_layer": 2})

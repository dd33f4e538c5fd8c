"""profiler.hfzoo: GPT-2, BERT and Llama from published configs, any sequence length, config overrides."""

from __future__ import annotations

import pytest
import torch

from planner.errors import TraceError, UsageError
from planner.profiler.hfzoo import HF_MODELS, build, check_overrides, checked_values, config_keys, llama
from planner.profiler.layers import split_model
from planner.profiler.loader import load_model
from planner.schemas.build import MAX_DIM, MAX_ITEMS


@pytest.mark.parametrize(("name", "params"), [
    ("llama2-7b", 6_738_415_616), ("llama2-13b", 13_015_864_320), ("llama2-70b", 68_976_648_192),
    ("llama3-8b", 8_030_261_248), ("llama3-70b", 70_553_706_496), ("mistral-7b", 7_241_732_096),
    ("qwen2-7b", 7_615_616_512), ("qwen3-8b", 8_190_735_360),
    ("gemma-7b", 8_537_680_896),  # its model card's 8.54B; the vocabulary's embedding tied to the head
    ("olmo2-7b", 7_298_617_344),  # OLMo-2-1124-7B's 7.30B
    ("gemma2-9b", 9_241_705_984),  # gemma-2-9b's 9.24B, eager attention (its scores soft-capped)
    ("gemma3-1b", 999_885_952),  # gemma-3-1b-pt's 1.0B
    ("mixtral-8x7b", 46_702_792_704), ("olmoe-1b-7b", 6_919_161_856),  # mixtures of experts: every expert's weights
    ("qwen3-30b-a3b", 30_532_122_624),
])
def test_llama_sizes_have_the_published_parameter_counts(name: str, params: int) -> None:
    with torch.device("meta"):
        model = build(name)
    assert sum(p.numel() for p in model.parameters()) == params
    assert model.config._attn_implementation == ("eager" if name == "gemma2-9b" else "sdpa")
    assert model.config.tie_word_embeddings is name.startswith("gemma")


@pytest.mark.parametrize(("name", "params", "attention", "tied"), [
    ("gpt-j-6b", 6_050_882_784, "sdpa", False),  # EleutherAI/gpt-j-6b: 6.05B (its README's 6,053,381,344 counts
    # mesh-transformer-jax's weights)
    ("gpt-neo-2.7b", 2_651_307_520, "eager", True),  # EleutherAI/gpt-neo-2.7B: 2.65B; eager attention only
])
def test_gpt_j_and_gpt_neo_have_their_published_sizes_and_split_by_structure(name: str, params: int, attention: str,
                                                                             tied: bool) -> None:
    with torch.device("meta"):
        model = build(name)
    assert sum(p.numel() for p in model.parameters()) == params
    assert model.config._attn_implementation == attention and model.config.tie_word_embeddings is tied
    loaded = load_model(name, 1, (64,), device="meta")
    assert split_model(loaded.module, loaded.example_input).method == f"structure:{model.config.model_type}"


@pytest.mark.parametrize(("layers", "kinds"), [(1, ["global"]), (4, ["global", "local"] * 2),
                                              (5, ["global", "local"] * 2 + ["global"])])
def test_gpt_neo_with_fewer_layers_keeps_its_alternating_pattern(layers: int, kinds: list[str]) -> None:
    """--set num_layers (or num_hidden_layers) on GPT-Neo lays its global and local layers over that many (the
    config refuses a pattern of another length, and --set takes no list to give one)."""
    for key in ("num_layers", "num_hidden_layers"):
        with torch.device("meta"):
            model = build("gpt-neo-2.7b", 64, {key: layers})
        assert model.config.attention_layers == kinds and len(model.transformer.h) == layers


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


@pytest.mark.parametrize(("overrides", "needle"), [
    ({"num_hidden_layers": "abc"}, "--set num_hidden_layers='abc': num_hidden_layers is a size"),
    ({"num_hidden_layers": "2=3"}, "num_hidden_layers='2=3'"),
    ({"num_hidden_layers": -1}, f"a whole number from 1 to {MAX_ITEMS:,}"),
    ({"n_layer": 0}, "n_layer=0"),
    ({"vocab_size": 0}, "vocab_size=0"),
    ({"n_embd": MAX_DIM + 1}, f"from 1 to {MAX_DIM:,}"),
    ({"n_inner": 2.5}, "n_inner=2.5"),
    ({"tie_word_embeddings": 1}, "tie_word_embeddings is true or false (default 'true')"),
    ({"layer_norm_epsilon": "small"}, "layer_norm_epsilon is a number"),
    ({"activation_function": 3}, "activation_function is text"),
])
def test_an_override_of_the_wrong_kind_or_a_size_below_one_is_refused(overrides: dict[str, object],
                                                                        needle: str) -> None:
    with pytest.raises(UsageError) as err:
        checked_values("gpt2", overrides)
    assert needle in err.value.cause and err.value.hint.startswith("e.g. --set ")


@pytest.mark.parametrize(("name", "overrides", "needle"), [
    ("gpt-neo-2.7b", {"num_layers": 0}, "num_layers=0"),  # GPT-Neo's own names for blocks and heads
    ("gpt-neo-2.7b", {"num_hidden_layers": MAX_ITEMS + 1}, f"from 1 to {MAX_ITEMS:,}"),
    ("gpt-neo-2.7b", {"num_heads": 0}, "num_heads=0"),
    ("gpt-neo-2.7b", {"window_size": 0}, "window_size=0"),
    ("gpt-j-6b", {"rotary_dim": 0}, "rotary_dim=0"),
])
def test_gpt_neo_and_gpt_j_sizes_are_bounded_too(name: str, overrides: dict[str, object], needle: str) -> None:
    """Their fields of other names are sizes as GPT-2's are: num_layers=10**8 tried to build 10**8 blocks."""
    with pytest.raises(UsageError) as err:
        checked_values(name, overrides)
    assert needle in err.value.cause


def test_overrides_take_the_configs_own_names_and_floats_for_float_fields() -> None:
    got = checked_values("gpt2", {"num_hidden_layers": 2, "layer_norm_epsilon": 1, "n_inner": 64})
    assert got == {"n_layer": 2, "layer_norm_epsilon": 1.0, "n_inner": 64}
    assert isinstance(got["layer_norm_epsilon"], float)
    with torch.device("meta"):
        assert build("gpt2", overrides={"layer_norm_epsilon": 1}).config.layer_norm_epsilon == 1.0


@pytest.mark.parametrize(("overrides", "needle"), [
    ({"n_head": 5}, "gpt2 cannot be built with --set n_head=5: `embed_dim` must be divisible by num_heads"),
    ({"n_embd": 7}, "--set n_embd=7: `embed_dim` must be divisible"),
    ({"activation_function": "evil"}, "--set activation_function=evil: unknown name 'evil'"),
])
def test_a_model_the_library_cannot_build_names_the_overrides_and_its_message(overrides: dict[str, object],
                                                                              needle: str) -> None:
    with torch.device("meta"), pytest.raises(UsageError) as err:
        build("gpt2", overrides=overrides)
    assert needle in err.value.cause and err.value.hint == "fix the --set values"


def test_a_position_range_shorter_than_the_sequence_is_refused() -> None:
    for key in ("n_positions", "max_position_embeddings"):  # the config's name and its alias
        with torch.device("meta"), pytest.raises(UsageError) as err:
            build("gpt2", seq_len=128, overrides={key: 4})
        assert err.value.cause == (f"--set {key}=4: gpt2 then holds 4 positions, fewer than the 128 tokens of the "
                                   "input sequence")
        assert "--input-shape 4 or less" in err.value.hint
    with torch.device("meta"), pytest.raises(UsageError, match="fewer than the 64 tokens"):
        build("llama-tiny", seq_len=64, overrides={"max_position_embeddings": 32})
    with torch.device("meta"):
        assert build("gpt2", seq_len=128, overrides={"n_positions": 128}).config.n_positions == 128
        assert build("gpt2", overrides={"n_positions": 4}).config.n_positions == 4  # no sequence given


@pytest.mark.parametrize(("name", "window"), [("gemma3-1b", 0), ("gemma2-9b", -1), ("mistral-7b", 0)])
def test_a_sliding_window_below_one_token_is_refused(name: str, window: int) -> None:
    """A window of 0 tokens leaves its layers' tokens nothing to attend to (the split blocks' masks hide every key;
    transformers fails): a size, refused as one."""
    with pytest.raises(UsageError) as err:
        build(name, 16, {"num_hidden_layers": 1, "sliding_window": window})
    assert f"sliding_window={window}" in err.value.cause and "from 1 to" in err.value.cause


@pytest.mark.parametrize("name", ["gemma3-1b", "gemma2-9b"])
def test_no_window_for_layers_typed_sliding_is_refused(name: str) -> None:
    """Gemma 2 and 3 mark layers ``sliding_attention``; unset, their window leaves transformers' forward refusing the
    model ("Could not find a `sliding_window` argument"), which the split blocks would train attending fully: the
    split refuses it (planner.profiler.hfmasks, for any factory's model). Where no layer slides (Mistral's forward
    slides by the window alone, Qwen2's types none without one) null builds and splits."""
    small = {"num_hidden_layers": 3, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2,
             "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 100, "sliding_window": None}
    with pytest.raises(TraceError) as err:
        split_model(build(name, 16, small), torch.zeros(1, 16, dtype=torch.long))
    assert "layer 0 is a sliding_attention layer and its sliding_window is None" in err.value.cause
    assert "give it a sliding_window" in err.value.hint
    for other in ("mistral-7b", "qwen2-7b"):
        config = {k: v for k, v in small.items() if other == "mistral-7b" or k != "head_dim"}
        model = build(other, 16, config)
        assert model.config.sliding_window is None
        assert len(split_model(model, torch.zeros(1, 16, dtype=torch.long))) == 5
        model(torch.randint(0, 100, (1, 16)), use_cache=False)  # transformers runs it


def test_gemma3_rotates_its_global_layers_at_its_published_base() -> None:
    """gemma-3-1b's config.json: ``rope_theta`` 1,000,000 for the global (full-attention) layers,
    ``rope_local_base_freq`` 10,000 for the local ones."""
    with torch.device("meta"):
        rope = build("gemma3-1b", 16, {"num_hidden_layers": 1}).config.rope_parameters
    assert (rope["full_attention"]["rope_theta"], rope["sliding_attention"]["rope_theta"]) == (1_000_000.0, 10_000.0)


@pytest.mark.parametrize("kv_heads", [3, 8])
def test_kv_heads_that_do_not_divide_the_heads_are_refused(kv_heads: int) -> None:
    """transformers builds llama-tiny (4 heads) with 3 or 8 KV heads, which then cannot run; analytic mode (meta)
    profiled it: a usage error naming the --set value and the KV head counts that work."""
    with torch.device("meta"), pytest.raises(UsageError) as err:
        build("llama-tiny", overrides={"num_key_value_heads": kv_heads})
    assert err.value.cause == (f"llama-tiny cannot be built with --set num_key_value_heads={kv_heads}: "
                               f"num_attention_heads=4 is not a multiple of num_key_value_heads={kv_heads} (each KV "
                               "head serves a whole group of query heads); num_key_value_heads must be one of 1, 2, 4")
    with torch.device("meta"):
        assert build("llama-tiny", overrides={"num_key_value_heads": 1}).config.num_key_value_heads == 1

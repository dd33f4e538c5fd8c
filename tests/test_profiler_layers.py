"""profiler.layers: split_model picks the structural split for known transformers, torch.fx otherwise."""

from __future__ import annotations

import pytest
import torch

from planner.errors import ProfileError, TraceError
from planner.profiler.hfzoo import gpt2, llama
from planner.profiler.layers import split_model
from planner.profiler.loader import load_model


def test_transformers_are_split_by_structure_and_other_models_by_fx() -> None:
    mlp = load_model("mlp", 2)
    assert split_model(mlp.module, mlp.example_input).method == "fx"
    x = torch.randint(0, 50, (2, 8))
    assert split_model(gpt2(n_layer=1, n_embd=32, n_head=2, vocab_size=50), x).method == "structure:gpt2"
    assert split_model(llama(vocab_size=50), x).method == "structure:llama"


@pytest.mark.parametrize(("name", "count"), [("vgg16", 16), ("gpt2", 14), ("bert-base", 14), ("llama2-7b", 34)])
def test_layer_counts(name: str, count: int) -> None:
    loaded = load_model(name, 1, (8,) if name != "vgg16" else None, device="meta")
    assert len(split_model(loaded.module, loaded.example_input)) == count


@pytest.mark.parametrize("model", [torch.nn.Sequential(), torch.nn.Identity()])
def test_a_model_that_computes_nothing_is_refused_with_what_to_do(model: torch.nn.Module) -> None:
    with pytest.raises(ProfileError, match="computes nothing") as info:
        split_model(model, torch.zeros(4, 8))
    assert "at least one layer" in info.value.hint


def test_another_transformers_class_gets_a_hint_naming_the_classes_split_by_structure() -> None:
    """fx cannot trace transformers' models; one not split by structure is refused with the ones that are."""
    from transformers import OpenAIGPTConfig, OpenAIGPTLMHeadModel

    model = OpenAIGPTLMHeadModel(OpenAIGPTConfig(n_embd=32, n_layer=1, n_head=2, vocab_size=64))
    with pytest.raises(TraceError, match="OpenAIGPTLMHeadModel is a transformers class planner does not split") as err:
        split_model(model, torch.randint(0, 64, (1, 8)))
    assert "...ForCausalLM/...Model: Llama, Mistral" in err.value.hint and "GPTNeoX" in err.value.hint
    assert "...ForImageClassification/...Model: ViT" in err.value.hint and len(err.value.hint) < 1000


def test_a_users_subclass_of_a_transformers_model_is_told_to_return_the_class_itself() -> None:
    """A subclass outside transformers is not split by structure (it may change what the class computes); it was
    refused with torch.fx's own error and advice to rewrite it as an nn.Sequential, now with its transformers class
    to return instead."""
    from transformers import LlamaForCausalLM

    class OwnLlama(LlamaForCausalLM):  # type: ignore[misc]
        def describe(self) -> str:  # changes nothing it computes
            return "mine"

    model = OwnLlama(llama(vocab_size=50).config)
    with pytest.raises(TraceError, match="OwnLlama subclasses transformers' LlamaForCausalLM") as err:
        split_model(model, torch.randint(0, 50, (1, 8)))
    assert err.value.hint.startswith("have the factory return the LlamaForCausalLM itself")
    assert "Llama, Mistral" in err.value.hint


def test_a_mixture_of_experts_not_split_by_structure_is_refused_with_why() -> None:
    """GraniteMoE routes each token to experts, and is not among the mixtures split by structure: refused as such,
    naming those, not as a model torch.fx cannot trace."""
    from transformers import GraniteMoeConfig, GraniteMoeForCausalLM

    model = GraniteMoeForCausalLM(GraniteMoeConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                   num_attention_heads=2, num_key_value_heads=2, num_local_experts=4,
                                                   vocab_size=64))
    with pytest.raises(TraceError, match=r"mixture of experts \(num_local_experts=4\).*Mixtral, Qwen2Moe") as err:
        split_model(model, torch.randint(0, 64, (1, 8)))
    assert "build the model as one of those" in err.value.hint


def test_a_users_subclass_of_a_mixture_of_experts_is_refused_as_one() -> None:
    from transformers import MixtralConfig, MixtralForCausalLM

    class Mine(MixtralForCausalLM):  # type: ignore[misc]
        pass

    model = Mine(MixtralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                               num_key_value_heads=2, num_local_experts=4, vocab_size=64))
    with pytest.raises(TraceError, match="mixture of experts"):
        split_model(model, torch.randint(0, 64, (1, 8)))

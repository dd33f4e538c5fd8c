"""profiler.loader: the ``--set`` overrides a profile records, and when a run builds its model with them.

(load_model itself is tested with the zoo in tests/test_profiler_zoo.py.)
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from planner.errors import ModelLoadError
from planner.profiler.loader import load_model, overrides_for, overrides_note, recorded_overrides

META = {"tool": "planner profile", "overrides": {"n_layer": 2, "n_embd": 32, "tie_word_embeddings": False}}


def test_recorded_overrides_are_the_profiles_meta_and_none_without_them() -> None:
    assert recorded_overrides(META) == {"n_layer": 2, "n_embd": 32, "tie_word_embeddings": False}
    assert recorded_overrides({"tool": "planner profile"}) == {} and recorded_overrides({"overrides": None}) == {}
    for bad in ([["n_layer", 2]], "n_layer=2", {1: 2}):
        with pytest.raises(ModelLoadError, match=r"meta\.overrides .* is not a mapping") as err:
            recorded_overrides({"overrides": bad})
        assert "planner profile --set" in err.value.hint


def test_overrides_apply_to_the_profiled_zoo_model_only() -> None:
    assert overrides_for("gpt2", "gpt2", META) == META["overrides"]
    assert overrides_for("gpt2-medium", "gpt2", META) == {}  # another model: built as it is
    assert overrides_for("pkg.mod:factory", "pkg.mod:factory", META) == {}  # a factory sets its own fields
    assert overrides_for("gpt2", "gpt2", {}) == {}


def test_the_note_lists_the_overrides() -> None:
    assert overrides_note("gpt2", META) == (" (the profile was made from gpt2 with --set n_layer=2 n_embd=32 "
                                            "tie_word_embeddings=false)")
    assert overrides_note("gpt2", {}) == "" and overrides_note("gpt2", {"overrides": 3}) == ""


def lazy_cnn() -> tuple[nn.Module, torch.Tensor]:
    """A factory whose last layer learns its input size at its first call (nn.LazyLinear)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.LazyLinear(10)), torch.randn(2, 3, 8, 8)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_lazy_modules_get_their_weights_from_one_call_of_the_example(device: str) -> None:
    """Profiled, and on the meta device for an analytic profile, a lazy layer is sized by the example (it used to
    fail as 'the model rejects input ... Cannot copy out of meta tensor')."""
    loaded = load_model("tests.test_profiler_loader:lazy_cnn", 2, device=device)
    head = loaded.module[2]
    assert isinstance(head, nn.Linear) and head.weight.shape == (10, 4 * 6 * 6)
    assert loaded.module(loaded.example_input).shape == (2, 10)
    again = load_model("tests.test_profiler_loader:lazy_cnn", 2)
    assert device == "meta" or torch.equal(again.module[2].weight, head.weight)  # the same model every time


def validated_factory() -> nn.Module:
    """A factory whose config check raises with a heading line and the cause on the next (as transformers' strict
    config validation does: 'Class validation error for validator ...:' then 'ValueError: The hidden size ...')."""
    raise ValueError("Class validation error for validator 'validate_architecture':\n"
                     "    ValueError: The hidden size (100) is not a multiple of the number of attention heads (8).")


def test_a_factory_error_keeps_its_cause_on_one_line() -> None:
    with pytest.raises(ModelLoadError) as err:
        load_model("tests.test_profiler_loader:validated_factory", 1, device="meta")
    assert "\n" not in err.value.cause
    assert "The hidden size (100) is not a multiple of the number of attention heads (8)." in err.value.cause


def half_factory() -> tuple[nn.Module, torch.Tensor]:
    """A factory returning a float16 model and a float16 example."""
    return nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)).half(), torch.randn(2, 16, dtype=torch.half)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_a_float16_factory_model_is_cast_to_the_profiles_dtype_with_its_input(device: str) -> None:
    """Before, float32 (the default) cast the input and left the float16 weights: measured mode failed with 'mat1
    and mat2 must have the same dtype', and analytic mode (the meta device checks no dtype) wrote a float32
    profile with float16 weights' bytes, whose plan `planner run` could not train."""
    loaded = load_model("tests.test_profiler_loader:half_factory", 4, device=device)
    assert loaded.example_input.dtype == torch.float32
    assert {p.dtype for p in loaded.module.parameters()} == {torch.float32}
    if device == "cpu":
        assert loaded.module(loaded.example_input).dtype == torch.float32
    half = load_model("tests.test_profiler_loader:half_factory", 4, dtype="float16", device=device)
    assert {p.dtype for p in half.module.parameters()} == {torch.float16} and half.example_input.dtype == torch.half

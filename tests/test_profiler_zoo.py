"""profiler.zoo and profiler.loader: the built-in models and how a model spec is loaded."""

from __future__ import annotations

import dataclasses
import re
import types

import pytest
import torch

from planner.errors import ModelLoadError, ProfileError, UsageError
from planner.profiler.loader import check_input_bytes, load_model, random_input, token_ids
from planner.profiler.zoo import ZOO, ZOO_NAMES
from planner.schemas.build import MAX_BATCH, MAX_BYTES, MAX_DIM


def test_zoo_names_cover_the_contract() -> None:
    for name in ("mlp", "vgg11", "vgg13", "vgg16", "vgg19", "vgg11_bn", "vgg19_bn", "resnet18", "resnet34",
                 "resnet50", "resnet101", "resnet152", "gpt2", "gpt2-medium", "bert-base", "llama-tiny", "llama2-7b",
                 "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b"):
        assert name in ZOO_NAMES


@pytest.mark.parametrize(("name", "params"), [
    ("vgg16", 138_357_544), ("vgg19", 143_667_240), ("vgg16_bn", 138_365_992), ("resnet18", 11_689_512),
    ("resnet50", 25_557_032), ("resnet152", 60_192_808), ("gpt2", 124_439_808), ("bert-base", 109_514_298),
])
def test_parameter_counts_match_the_reference_models(name: str, params: int) -> None:
    loaded = load_model(name, 2, device="meta")
    assert sum(p.numel() for p in loaded.module.parameters()) == params


def test_example_input_shapes_and_kinds() -> None:
    cnn = load_model("resnet18", 3, (3, 32, 32), device="meta")
    assert tuple(cnn.example_input.shape) == (3, 3, 32, 32) and cnn.input_shape == (3, 32, 32)
    lm = load_model("gpt2", 2, (16,), device="meta")
    assert tuple(lm.example_input.shape) == (2, 16) and lm.example_input.dtype == torch.long
    long = load_model("gpt2", 1, (2048,), device="meta")  # any sequence length: the positions grow to it
    assert tuple(long.example_input.shape) == (1, 2048) and long.module.config.n_positions == 2048
    with pytest.raises(UsageError, match="sequence length"):
        load_model("llama-tiny", 1, (4, 4), device="meta")
    half = load_model("mlp", 4, dtype="bfloat16", device="meta")
    assert half.example_input.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in half.module.parameters())


def test_unknown_zoo_name_lists_the_names() -> None:
    with pytest.raises(ModelLoadError) as err:
        load_model("vgg17", 2)
    assert "vgg16" in err.value.cause and "resnet50" in err.value.cause


def test_bad_import_path() -> None:
    with pytest.raises(ModelLoadError, match="cannot import"):
        load_model("no_such_pkg.models:build", 2, (4,))
    with pytest.raises(ModelLoadError, match="no attribute"):
        load_model("tests.test_profiler_zoo:nothing_here", 2, (4,))


def _raising_factory() -> torch.nn.Module:
    raise ValueError("hidden size must be even")


def _pair_factory() -> tuple[torch.nn.Module, torch.Tensor]:
    return torch.nn.Linear(6, 3), torch.randn(5, 6)


def test_factory_that_raises_shows_its_message() -> None:
    with pytest.raises(ModelLoadError, match="hidden size must be even"):
        load_model("tests.test_profiler_zoo:_raising_factory", 2, (4,))


def test_factory_returning_module_and_example_input() -> None:
    loaded = load_model("tests.test_profiler_zoo:_pair_factory", 7)
    assert tuple(loaded.example_input.shape) == (7, 6) and loaded.input_shape == (6,)


def test_batch_size_zero_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        load_model("mlp", 0)


def test_batch_and_input_sizes_are_bounded_by_the_profile_format() -> None:
    with pytest.raises(UsageError, match=f"from 1 to {MAX_BATCH:,}"):
        load_model("mlp", MAX_BATCH + 1, device="meta")
    with pytest.raises(UsageError, match=f"sizes from 1 to {MAX_DIM:,}"):
        load_model("vgg11", 2, (3, MAX_DIM + 1, 8), device="meta")
    with pytest.raises(UsageError, match=re.escape(f"the input batch (2, 3, {MAX_DIM}, {MAX_DIM}) of float32 is")):
        load_model("vgg11", 2, (3, MAX_DIM, MAX_DIM), device="meta")
    assert check_input_bytes((2, 3, 224, 224), torch.float32) == 2 * 3 * 224 * 224 * 4
    with pytest.raises(UsageError, match=re.escape(f"above the {MAX_BYTES:.0e} bytes a profile holds")):
        check_input_bytes((MAX_BYTES,), torch.int64)


CPU_OOM = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
           "allocate 240000000000 bytes. Error code 12 (Cannot allocate memory)")


def _no_memory(*_args: object, **_kwargs: object) -> torch.Tensor:
    raise RuntimeError(CPU_OOM)


def test_an_input_or_model_that_does_not_fit_in_memory_is_a_profile_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as patch:
        patch.setattr(torch, "randn", _no_memory)
        with pytest.raises(ProfileError) as err:
            random_input((2, 3, 100_000, 100_000), torch.device("cpu"), torch.float32)
    assert err.value.cause == ("out of memory making the input batch (2, 3, 100000, 100000) (2.4e+11 bytes) on cpu "
                               "(torch asked for 2.4e+11 bytes)")
    assert "--batch-size" in err.value.hint
    monkeypatch.setitem(ZOO, "mlp", dataclasses.replace(ZOO["mlp"], factory=_no_memory))
    with pytest.raises(ProfileError, match=r"out of memory building mlp for input shape \(100000,\) on cpu"):
        load_model("mlp", 2, (100_000,))


def test_other_failures_making_the_input_still_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: object, **_kwargs: object) -> torch.Tensor:
        raise RuntimeError("something else")

    monkeypatch.setattr(torch, "randn", broken)
    with pytest.raises(RuntimeError, match="something else"):
        random_input((2, 4), torch.device("cpu"), torch.float32)


class _NoVocab(torch.nn.Module):
    config = types.SimpleNamespace(vocab_size=0)


def test_a_model_without_a_vocabulary_has_no_token_ids() -> None:
    with pytest.raises(ModelLoadError, match=r"config\.vocab_size is 0"):
        token_ids(_NoVocab(), (2, 8), torch.device("meta"))


def test_the_loaded_model_keeps_its_overrides() -> None:
    loaded = load_model("llama-tiny", 1, (8,), device="meta", overrides={"num_hidden_layers": 1})
    assert loaded.overrides == {"num_hidden_layers": 1}
    assert load_model("mlp", 1, device="meta").overrides == {}


def test_a_patched_torch_randn_leaves_later_device_contexts_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests above patch ``torch.randn``; torch caches its device context's factories at their first use, and a
    first use under the patch made every later ``torch.randn`` under ``torch.device("meta")`` a CPU tensor (three
    profiler tests failed in some worker orders). conftest computes the cache before any test: run alone, this test
    fails without it."""
    real = torch.randn
    monkeypatch.setattr(torch, "randn", lambda *a, **k: real(*a, **k))
    with torch.device("meta"):
        torch.zeros(1)
    monkeypatch.undo()
    with torch.device("meta"):
        assert torch.randn(1).device.type == "meta"

"""profiler.guards: nothing to train, no gradient, out of memory, and a profile the reader would refuse."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from planner.errors import ProfileError, TraceError, UsageError
from planner.ir import ModelProfile
from planner.profiler.guards import (
    check_loadable,
    check_output,
    check_trainable,
    is_out_of_memory,
    out_of_memory,
    shown_overrides,
    with_overrides,
)
from planner.schemas.build import MAX_TIME_S
from tests.conftest import make_profile_dict

CPU_OOM = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
           "allocate 240000000000 bytes. Error code 12 (Cannot allocate memory)")


def test_a_model_without_trainable_weights_is_refused() -> None:
    with pytest.raises(ProfileError, match="has no parameters"):
        check_trainable([], "m")
    frozen = list(nn.Linear(4, 4).requires_grad_(False).parameters())
    with pytest.raises(ProfileError, match="none of m's 2 parameter tensors requires grad") as err:
        check_trainable(frozen, "m")
    assert "requires_grad_(True)" in err.value.hint
    check_trainable([*frozen, nn.Parameter(torch.ones(1))], "m")  # one trainable tensor is enough


def test_an_output_without_a_gradient_is_refused() -> None:
    with pytest.raises(ProfileError, match="is a tensor of int64, not floating point"):
        check_output(torch.int64, False, "m's output", (2,))
    with pytest.raises(ProfileError, match="does not require grad"):
        check_output(torch.float32, False, "m's output", (2, 4))
    with pytest.raises(ProfileError, match="is a scalar, with no batch dimension"):
        check_output(torch.float32, True, "m's output", ())
    check_output(torch.bfloat16, True, "m's output", (2, 4))
    check_output(torch.float32, True, "m's output")  # shape unknown: not checked


def test_out_of_memory_is_recognised_and_reports_the_request() -> None:
    assert is_out_of_memory(RuntimeError(CPU_OOM)) and is_out_of_memory(MemoryError())
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"))
    assert not is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_out_of_memory(ValueError("out of memory"))  # not torch's
    err = out_of_memory("making the input", "cpu", RuntimeError(CPU_OOM))
    assert err.cause == "out of memory making the input on cpu (torch asked for 2.4e+11 bytes)"
    assert "--batch-size" in err.hint and "--mode analytic" in err.hint
    cuda = out_of_memory("running m", "cuda:0", RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB"))
    assert cuda.cause.endswith("(torch asked for 20.00 GiB)")
    assert out_of_memory("x", "cpu", MemoryError()).cause == "out of memory x on cpu"


def test_a_profile_beyond_the_schemas_bounds_is_refused() -> None:
    check_loadable(ModelProfile.from_dict(make_profile_dict()))
    doc = make_profile_dict()
    doc["layers"][1]["forward_s"] = MAX_TIME_S * 2.0
    with pytest.raises(ProfileError, match=r"toy: layers\[1\]\.forward_s is .*above the maximum") as err:
        check_loadable(ModelProfile.from_dict(doc))
    assert "none is written" in err.value.cause and "--device-flops" in err.value.hint


def test_overrides_are_named_in_an_error() -> None:
    base = TraceError("the model rejects input of shape (8,) (batch 2): index out of range", "pass --input-shape")
    assert with_overrides(base, {}) is base
    named = with_overrides(base, {"n_positions": 4, "tie_word_embeddings": False})
    assert isinstance(named, TraceError)
    assert named.cause.endswith("(with --set n_positions=4 tie_word_embeddings=false)")
    assert named.hint == "pass --input-shape; or fix the --set values"
    assert with_overrides(UsageError("bad"), {"a": 1}).hint == "fix the --set values"
    assert shown_overrides({"a": 1.5, "b": "gelu"}) == "a=1.5 b=gelu"

"""profiler.measure and profile_model: saved bytes, output bytes, measured profiles."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from planner.heap import keep_freed_memory
from planner.ir import ModelProfile
from planner.profiler import load_model, profile_model, split_model
from planner.profiler.loader import LoadedModel
from planner.profiler.measure import curve_batches_of, fit_fixed, instrumented_pass, small_batch_of, timed_pass


def test_saved_bytes_count_each_storage_once_and_exclude_parameters() -> None:
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 5))
    x = torch.randn(4, 10)
    lm = split_model(model, x)
    facts = instrumented_pass(lm.layers, x, list(model.parameters()))
    # layer 0 (Linear+ReLU) keeps its input (4x10) and the ReLU result (4x20); the weight is excluded.
    assert facts[0].saved_bytes == 4 * 10 * 4 + 4 * 20 * 4
    # layer 1's Linear keeps its input: the same storage as the ReLU result, counted once already.
    assert facts[1].saved_bytes == 0
    assert [f.output_bytes for f in facts] == [4 * 20 * 4, 4 * 5 * 4]


def test_measured_profile_of_a_small_model() -> None:
    loaded = load_model("mlp", 16)
    calls: list[tuple[int, int]] = []
    prof = profile_model(loaded, mode="measured", threads=1, repeats=2,
                         progress=lambda done, total, what: calls.append((done, total)))
    assert prof.mode == "measured" and prof.device == "cpu" and prof.batch_size == 16
    assert prof.param_count == sum(p.numel() for p in loaded.module.parameters())
    assert all(layer.forward_s > 0 and layer.backward_s > 0 for layer in prof.layers)
    assert prof.device_flops > 0 and prof.meta["device_flops_source"] == "achieved"
    assert prof.meta["threads"] == 1 and prof.meta["repeats"] == 2 and prof.meta["whole_model_fwd_bwd_s"] > 0
    assert prof.meta["freed_memory_kept"] is keep_freed_memory()  # timed with freed tensors reused (planner.heap)
    assert calls and calls[-1][0] == calls[-1][1]
    with torch.no_grad():
        out = loaded.module(loaded.example_input)
    assert prof.layers[-1].output_bytes == out.numel() * out.element_size()
    assert prof.layers[-1].output_shape == tuple(out.shape)
    again = ModelProfile.from_dict(prof.to_dict())
    assert again == prof
    assert prof.meta["fixed_cost_fit_batch"] == 4
    assert prof.loss_s is not None and prof.loss_s > 0
    assert prof.loss_fixed_s is not None and 0 <= prof.loss_fixed_s <= prof.loss_s
    for layer in prof.layers:
        assert layer.forward_fixed_s is not None and 0 <= layer.forward_fixed_s <= layer.forward_s
        assert layer.backward_fixed_s is not None and 0 <= layer.backward_fixed_s <= layer.backward_s
        assert [p.batch for p in layer.batch_times] == [8, 4, 2, 1]
        assert all(p.forward_s > 0 and p.backward_s > 0 for p in layer.batch_times)


def test_the_smaller_batches_are_halvings_down_to_a_sixteenth_and_hold_the_fit_batch() -> None:
    assert curve_batches_of(64) == (32, 16, 8, 4)
    assert curve_batches_of(6) == (3, 1) and curve_batches_of(2) == (1,) and curve_batches_of(1) == ()
    assert all(small_batch_of(b) in curve_batches_of(b) for b in range(2, 300))


def test_fixed_part_fit_through_two_batch_sizes() -> None:
    assert fit_fixed(1.0 + 64 * 0.5, 1.0 + 16 * 0.5, 64, 16) == pytest.approx(1.0)
    assert fit_fixed(2.0, 0.1, 64, 16) == 0.0  # super-linear noise: no negative fixed part
    assert fit_fixed(2.0, 3.0, 64, 16) == 2.0  # slower at the small batch: all of it is fixed
    assert small_batch_of(64) == 16 and small_batch_of(3) == 1 and small_batch_of(1) is None
    with pytest.raises(ValueError):
        fit_fixed(1.0, 1.0, 4, 4)


def test_batch_one_and_flat_analytic_profiles_have_no_fixed_part() -> None:
    one = profile_model(load_model("mlp", 1), mode="measured", threads=1, repeats=1)
    assert all(layer.forward_fixed_s is None and not layer.batch_times for layer in one.layers)
    assert one.meta["fixed_cost_fit_batch"] is None
    analytic = profile_model(load_model("mlp", 8), mode="analytic", efficiency=0.5)  # the roofline fits one
    assert all(layer.backward_fixed_s is None for layer in analytic.layers)
    assert analytic.loss_fixed_s is None and one.loss_fixed_s is None


def test_output_bytes_are_real_sizes_in_half_precision() -> None:
    prof = profile_model(load_model("vgg11", 2, (3, 32, 32), dtype="float16", device="meta"), mode="analytic")
    assert prof.dtype == "float16"
    assert prof.layers[0].output_bytes == 2 * 64 * 16 * 16 * 2  # conv + relu + 2x2 max-pool
    assert prof.layers[0].param_bytes == (64 * 3 * 9 + 64) * 2
    assert prof.input_bytes == 2 * 3 * 32 * 32 * 2


def test_gpt2_profile_records_the_tie_once() -> None:
    prof = profile_model(load_model("gpt2", 1, (8,), device="meta"), mode="analytic")
    assert prof.param_count == 124_439_808
    assert [t.name for t in prof.ties] == ["transformer.wte.weight"]
    assert prof.ties[0].layers == (0, len(prof.layers) - 1)
    assert all(layer.forward_flops > 0 for layer in prof.layers[1:])


def test_model_that_rejects_the_input_shape_shows_its_message() -> None:
    from planner.errors import ProfileError

    model = nn.Sequential(nn.Linear(10, 4))
    with pytest.raises(ProfileError, match="rejects input of shape"):
        profile_model(LoadedModel("m", model, torch.randn(2, 7), (7,)), mode="measured")


def test_measured_llama_profile_records_block_shapes() -> None:
    from planner.ir import BlockShape

    prof = profile_model(load_model("llama-tiny", 2, (16,)), mode="measured", threads=1, repeats=1)
    assert prof.meta["split_method"] == "structure:llama" and len(prof.layers) == 4
    assert prof.layers[0].block is None and prof.layers[-1].block is None
    # SDPA ran its fused CPU kernel: the saved bytes hold no attention weights
    assert prof.layers[1].block == prof.layers[2].block == BlockShape(64, 4, 2, 128, 16, gated=True,
                                                                      attention_saved=False)
    assert ModelProfile.from_dict(prof.to_dict()) == prof
    assert prof.meta["whole_model_fwd_bwd_s"] > 0 and all(layer.forward_s > 0 for layer in prof.layers)


def test_speed_probe_times_whole_passes_after_an_untimed_one() -> None:
    from planner.profiler.measure import speed_s

    calls = []

    class Counted(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            calls.append(1)
            return self.lin(x)

    model = Counted()
    t = speed_s(model, torch.randn(8, 4), repeats=3)
    assert len(calls) == 4  # one untimed pass, then the three timed
    assert t > 0
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())  # gradients left at zero


class _Frozen(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)
        self.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


class _ArgMax(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x)).argmax(-1)


class _Detached(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x).detach()


@pytest.mark.parametrize("mode", ["measured", "analytic"])
@pytest.mark.parametrize(("make", "needle"), [
    (lambda: nn.Sequential(nn.ReLU(), nn.Tanh()), "m has no parameters, so training it has nothing to update"),
    (_Frozen, "none of m's 4 parameter tensors requires grad"),
    (_ArgMax, "m's output (its last layer 'b') is a tensor of int64, not floating point"),
    (_Detached, "m's output (its last layer 'a') does not require grad"),
])
def test_a_model_that_cannot_be_trained_is_refused(make: Callable[[], nn.Module], needle: str, mode: str) -> None:
    from planner.errors import ProfileError

    x = torch.randn(2, 4, device="meta" if mode == "analytic" else "cpu")
    with pytest.raises(ProfileError) as err:
        profile_model(LoadedModel("m", make().to(x.device), x, (4,)), mode=mode, threads=1, repeats=1)
    assert needle in err.value.cause


def test_instrumented_pass_records_the_output_kind() -> None:
    x = torch.randn(2, 4)
    facts = instrumented_pass([nn.Linear(4, 4)], x, [])
    assert facts[0].output_dtype == torch.float32 and facts[0].output_requires_grad


def test_the_whole_model_pass_refuses_an_output_without_a_gradient() -> None:
    from planner.errors import ProfileError
    from planner.profiler.measure import whole_model_pass

    model = _Detached()
    with pytest.raises(ProfileError, match="the output of the whole _Detached does not require grad"):
        whole_model_pass(model, torch.randn(2, 4), list(model.parameters()), lambda: None)


def test_an_error_running_an_overridden_model_names_the_overrides() -> None:
    from planner.errors import ProfileError

    loaded = LoadedModel("m", nn.Sequential(nn.Linear(10, 4)), torch.randn(2, 7), (7,), overrides={"n_layer": 2})
    with pytest.raises(ProfileError) as err:
        profile_model(loaded, mode="measured")
    assert "rejects input of shape (7,)" in err.value.cause and err.value.cause.endswith("(with --set n_layer=2)")
    assert err.value.hint.endswith("or fix the --set values")


def test_running_out_of_memory_while_timing_is_a_profile_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from planner.errors import ProfileError
    from planner.profiler import core

    def no_memory(*_args: object, **_kwargs: object) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(core, "measure_passes", no_memory)
    with pytest.raises(ProfileError) as err:
        profile_model(load_model("mlp", 4), mode="measured", threads=1, repeats=1)
    assert err.value.cause == "out of memory timing mlp at batch 4 on cpu (torch asked for 2.00 GiB)"
    assert "--mode analytic" in err.value.hint


def test_layers_behind_frozen_weights_run_no_backward_as_in_the_whole_model() -> None:
    """Fine-tuning with a frozen prefix: autograd runs no backward through it (nothing before it trains), so the
    profile times and counts none there; the first trainable layer computes its weight gradient only."""
    torch.manual_seed(0)
    layers = [nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 4)]
    for layer in layers[:2]:
        layer.requires_grad_(False)
    params = [p for layer in layers for p in layer.parameters()]
    facts = instrumented_pass(layers, torch.randn(4, 8), params)
    assert [f.backward_flops for f in facts[:2]] == [0.0, 0.0]
    assert [f.input_requires_grad for f in facts] == [False, False, False]
    assert facts[2].backward_flops == 2 * 4 * 8 * 4  # dW = x^T dy only: no input gradient
    _, bwd = timed_pass(layers, torch.randn(4, 8), params, lambda: None)
    assert bwd[:2] == [0.0, 0.0] and bwd[2] > 0


class _AddsIntoItsInput(nn.Module):
    """``x += lin(x)``: Linear saved x for its weight's gradient, and the in-place add changed it."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 4)
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        x += self.lin(x)
        return x


def test_a_model_whose_own_backward_fails_is_a_profile_error_not_an_internal_one() -> None:
    """planner profile said "internal error: RuntimeError: one of the variables needed for gradient computation
    has been modified by an inplace operation ... report it" of a model that cannot train anywhere."""
    from planner.errors import ProfileError
    from planner.profiler.measure import whole_model_pass

    model = _AddsIntoItsInput()
    with pytest.raises(ProfileError, match=r"the whole _AddsIntoItsInput fails its own forward.backward.*inplace"):
        whole_model_pass(model, torch.randn(2, 4), list(model.parameters()), lambda: None)

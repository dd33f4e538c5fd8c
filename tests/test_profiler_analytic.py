"""profiler.analytic: --device-flops names and numbers, the peak for the profile's dtype, analytic times."""

from __future__ import annotations

import re

import pytest

from planner import gpus
from planner.errors import ProfileError, UsageError
from planner.profiler import load_model, profile_model
from planner.profiler.analytic import (
    DEVICE_FLOPS_NAMES,
    GPU_PEAK_FLOPS,
    analytic_time,
    check_flat_rate,
    resolve_device_flops,
)
from planner.schemas.build import MAX_FLOPS, MAX_TIME_S


def test_device_flops_names_and_numbers() -> None:
    assert resolve_device_flops("rtx2080ti") == (13.4e12, "rtx2080ti")
    assert resolve_device_flops("2e12") == (2e12, "2e+12 FLOP/s")
    assert resolve_device_flops(None)[0] == 13.4e12
    assert resolve_device_flops(None, default=None) == (None, "")
    for bad in ("tpu9", "-1", "0"):
        with pytest.raises(UsageError):
            resolve_device_flops(bad)


def test_todays_names_keep_their_fp32_and_tf32_peaks() -> None:
    assert {"rtx2080ti", "v100", "a100", "a100-tf32", "h100", "h100-tf32"} <= set(DEVICE_FLOPS_NAMES)
    assert GPU_PEAK_FLOPS["a100"] == 19.5e12 and GPU_PEAK_FLOPS["a100-tf32"] == 156e12
    assert GPU_PEAK_FLOPS["h100-tf32"] == pytest.approx(494.7e12) and GPU_PEAK_FLOPS["v100"] == 15.7e12
    assert "v100-tf32" not in DEVICE_FLOPS_NAMES  # Volta has no TF32


def test_the_peak_follows_the_profiles_dtype() -> None:
    assert resolve_device_flops("a100", dtype="bfloat16") == (312e12, "a100")
    assert resolve_device_flops("a100", dtype="float16")[0] == 312e12
    assert resolve_device_flops("a100", dtype="float32")[0] == 19.5e12
    assert resolve_device_flops("rtx2080ti", dtype="float16")[0] == 53.8e12
    assert resolve_device_flops("3e12", dtype="bfloat16")[0] == 3e12  # a number is taken as given
    with pytest.raises(UsageError, match="a100-tf32 is the TF32 peak"):
        resolve_device_flops("a100-tf32", dtype="bfloat16")
    with pytest.raises(UsageError, match="no bf16 peak"):
        resolve_device_flops("v100", dtype="bfloat16")


def test_analytic_times_follow_flops_and_device() -> None:
    prof = profile_model(load_model("resnet18", 4, device="meta"), mode="analytic", device_flops="v100",
                         efficiency=0.25)
    assert prof.device_flops == 15.7e12 and prof.device == "v100"
    for layer in prof.layers:
        assert layer.forward_s == pytest.approx(analytic_time(layer.forward_flops, 15.7e12, 0.25))
        assert layer.backward_s == pytest.approx(layer.backward_flops / (15.7e12 * 0.25))
    assert prof.meta["efficiency"] == 0.25


def test_a_bfloat16_profile_uses_the_bf16_peak() -> None:
    loaded = load_model("llama-tiny", 2, (16,), dtype="bfloat16", device="meta")
    flat = profile_model(loaded, mode="analytic", device_flops="a100", efficiency=0.5)
    assert flat.dtype == "bfloat16" and flat.device_flops == 312e12
    layer = flat.layers[1]
    assert layer.forward_s == pytest.approx(layer.forward_flops / (312e12 * 0.5))
    roof = profile_model(loaded, mode="analytic", device_flops="a100").meta["roofline"]
    assert roof["number_format"] == "bf16" and roof["peak_flops"] == 312e12
    assert roof["gemm_share"] == pytest.approx(267.9 / 312 * gpus.SUSTAINED)  # MAMF, as training sustains it


def test_the_default_is_the_roofline_with_fixed_parts_and_efficiency_overrides_it() -> None:
    loaded = load_model("gpt2", 8, (64,), dtype="bfloat16", device="meta", overrides={"n_layer": 2})
    prof = profile_model(loaded, mode="analytic", device_flops="h100")
    assert prof.meta["efficiency"] is None and prof.meta["fixed_cost_fit_batch"] == 2
    roof = prof.meta["roofline"]
    assert roof["gpu"] == "h100" and roof["bandwidth_Bps"] == 3.35e12 and roof["launch_s"] == 4e-6
    assert roof["host_s"] == 35e-6 and roof["unaligned_share"] == 0.17
    assert 0 < roof["memory_bound_share"] < 1 and len(roof["layer_memory_bound_share"]) == len(prof.layers)
    for layer in prof.layers:
        assert layer.forward_fixed_s is not None and 0 <= layer.forward_fixed_s <= layer.forward_s
        assert layer.backward_fixed_s is not None and 0 <= layer.backward_fixed_s <= layer.backward_s
    flat = profile_model(loaded, mode="analytic", device_flops="h100", efficiency=0.3)
    assert flat.meta["efficiency"] == 0.3 and "roofline" not in flat.meta
    assert all(layer.forward_fixed_s is None for layer in flat.layers)
    number = profile_model(loaded, mode="analytic", device_flops="1e15")  # no GPU: no bandwidth, flat 0.5
    assert number.meta["efficiency"] == 0.5
    # the loss: by the roofline, as measured profiles time it; at a flat rate by its element-wise count
    assert prof.loss_s is not None and prof.loss_fixed_s is not None and 0 <= prof.loss_fixed_s < prof.loss_s
    assert flat.loss_fixed_s is None and number.loss_fixed_s is None
    assert flat.loss_s is not None and number.loss_s is not None
    assert flat.loss_s * flat.device_flops * 0.3 == pytest.approx(number.loss_s * 1e15 * 0.5)


def test_a_device_flops_number_above_what_a_profile_holds_is_refused() -> None:
    assert resolve_device_flops(str(MAX_FLOPS))[0] == MAX_FLOPS
    for bad in ("1e30", str(MAX_FLOPS * 10), "inf", "nan"):
        with pytest.raises(UsageError, match=re.escape(f"at most {MAX_FLOPS:.0e}")) as err:
            resolve_device_flops(bad)
        assert bad in err.value.cause and "13.4e12" in err.value.hint


def test_a_flat_rate_that_cannot_time_one_flop_within_the_bound_is_refused() -> None:
    check_flat_rate(None, None)  # measured mode without --device-flops
    check_flat_rate(13.4e12, 1e-10)
    check_flat_rate(2.0 / MAX_TIME_S, None)  # at 0.5: exactly one FLOP in the longest time
    for flops, efficiency in ((1e-300, None), (13.4e12, 1e-300), (5e-324, 5e-324)):
        with pytest.raises(UsageError, match="one FLOP would take longer than") as err:
            check_flat_rate(flops, efficiency)
        assert "0.5" in err.value.hint


def test_analytic_profiles_refuse_the_rate_and_times_beyond_the_bounds() -> None:
    loaded = load_model("vgg11", 8, device="meta")
    with pytest.raises(UsageError, match="one FLOP would take longer"):
        profile_model(loaded, mode="analytic", efficiency=1e-300)
    with pytest.raises(ProfileError, match=r"the profile of vgg11: layers\[\d+\]\.forward_s is .*above the maximum"):
        profile_model(loaded, mode="analytic", device_flops=1e9, efficiency=1e-5)


def test_a_flat_profile_times_its_loss_so_the_cost_model_counts_its_memory() -> None:
    """It had no loss (``loss_s`` None), and the cost model then counted no logits' workspace: a plan over a
    256k vocabulary at 8192 tokens fitted with ``--efficiency`` and not without (22 GiB apart)."""
    from planner.costmodel.layers import LOSS_BYTES_PER_LOGIT, loss_workspace
    from planner.profiler.analytic import LOSS_FLOPS_PER_LOGIT

    loaded = load_model("llama-tiny", 2, (16,), dtype="bfloat16", device="meta")
    flat = profile_model(loaded, mode="analytic", device_flops="a100", efficiency=0.5)
    logits = 2 * 16 * flat.layers[-1].out_features  # type: ignore[operator]
    assert flat.loss_s == pytest.approx(LOSS_FLOPS_PER_LOGIT * logits / (312e12 * 0.5)) and flat.loss_fixed_s is None
    assert loss_workspace(flat, logits, 1)[-1, 0] == pytest.approx(logits * LOSS_BYTES_PER_LOGIT)
    vision = profile_model(load_model("resnet18", 4, device="meta"), mode="analytic", device_flops="v100",
                           efficiency=0.25)
    assert vision.loss_s is not None  # 1000 classes: logits too

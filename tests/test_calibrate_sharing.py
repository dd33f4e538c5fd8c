"""calibrate_sharing: what processes keep of their share of the cores while others compute beside them."""

from __future__ import annotations

import pytest

from planner import ir
from planner.calibrate import calibrate
from planner.calibrate_sharing import SharingModel, measure_sharing, model_kernel, sharing_efficiency, sharing_model
from tests.conftest import make_profile_dict


def test_sharing_efficiency_is_the_measured_share_over_the_fair_one_at_most_1() -> None:
    assert sharing_efficiency(0.45, 0.5) == pytest.approx(0.9)
    assert sharing_efficiency(0.88, 1.0) == pytest.approx(0.88)  # a core each, still sharing caches and memory
    assert sharing_efficiency(0.51, 0.5) == 1.0  # noise above the fair share: no loss
    assert sharing_efficiency(0.0, 0.5) is None and sharing_efficiency(float("nan"), 0.5) is None
    assert sharing_efficiency(0.5, 0.0) is None


def test_model_kernel_trains_the_whole_model_once_per_call() -> None:
    kernel = model_kernel(SharingModel("mlp", 4))
    kernel()  # a forward and backward: no error, any model planner profile builds


def test_the_profiles_own_model_only_when_measured_on_a_cpu_and_it_builds_as_profiled() -> None:
    from planner.profiler.zoo import mlp

    params = sum(p.numel() for p in mlp().parameters())
    doc = make_profile_dict(model="mlp", batch_size=8, mode="measured", device="cpu")
    doc["layers"] = [{**doc["layers"][0], "param_count": params}] + [{**x, "param_count": 0} for x in doc["layers"][1:]]
    profile = ir.ModelProfile.from_dict(doc)
    assert sharing_model(profile) == SharingModel("mlp", 8, profile.input_shape or None)
    analytic = {**doc, "mode": "analytic"}  # timed for a GPU: building it here may not even fit
    assert sharing_model(ir.ModelProfile.from_dict(analytic)) is None
    other = {**doc, "layers": [{**x, "param_count": 1} for x in doc["layers"]]}  # made with --set, say
    assert sharing_model(ir.ModelProfile.from_dict(other)) is None
    assert sharing_model(ir.ModelProfile.from_dict({**doc, "model": "toy"})) is None and sharing_model(None) is None


@pytest.mark.slow
@pytest.mark.parametrize("model", [None, SharingModel("mlp", 8)])
def test_two_processes_keep_a_plausible_share_of_their_speed_alone(model: SharingModel | None) -> None:
    share = measure_sharing(2, 1, model)
    assert 0.2 < share < 1.3  # with one core each and nothing else running, near 1 (0.85-1.0 here)


@pytest.mark.slow
def test_calibrate_measures_the_sharing_with_the_profiles_model_when_it_builds() -> None:
    from planner.api import profile_model

    mlp = profile_model("mlp", batch_size=8, repeats=1)
    _, meta = calibrate(2, 1, profile=mlp)
    assert meta["sharing_kernel"] == "mlp"
    toy = ir.ModelProfile.from_dict(make_profile_dict())  # "toy" is no model planner can build
    _, meta = calibrate(2, 1, profile=toy)
    assert meta["sharing_kernel"] == "matmul+conv"

"""calibrate_sharing: what processes keep of their share of the cores while others compute beside them."""

from __future__ import annotations

import pytest

from planner import ir
from planner.calibrate import calibrate
from planner.calibrate_sharing import measure_sharing, model_kernel, sharing_efficiency
from tests.conftest import make_profile_dict


def test_sharing_efficiency_is_the_measured_share_over_the_fair_one_at_most_1() -> None:
    assert sharing_efficiency(0.45, 0.5) == pytest.approx(0.9)
    assert sharing_efficiency(0.88, 1.0) == pytest.approx(0.88)  # a core each, still sharing caches and memory
    assert sharing_efficiency(0.51, 0.5) == 1.0  # noise above the fair share: no loss
    assert sharing_efficiency(0.0, 0.5) is None and sharing_efficiency(float("nan"), 0.5) is None
    assert sharing_efficiency(0.5, 0.0) is None


def test_model_kernel_trains_the_whole_model_once_per_call() -> None:
    kernel = model_kernel("mlp", 4)
    kernel()  # a forward and backward: no error, any model planner profile builds


@pytest.mark.slow
@pytest.mark.parametrize("model", [None, ("mlp", 8)])
def test_two_processes_keep_a_plausible_share_of_their_speed_alone(model: tuple[str, int] | None) -> None:
    share = measure_sharing(2, 1, model)
    assert 0.2 < share < 1.3  # with one core each and nothing else running, near 1 (0.85-1.0 here)


@pytest.mark.slow
def test_calibrate_measures_the_sharing_with_the_profiles_model_when_it_builds() -> None:
    mlp = ir.ModelProfile.from_dict(make_profile_dict(model="mlp", batch_size=8))
    _, meta = calibrate(2, 1, profile=mlp)
    assert meta["sharing_kernel"] == "mlp"
    toy = ir.ModelProfile.from_dict(make_profile_dict())  # "toy" is no model planner can build
    _, meta = calibrate(2, 1, profile=toy)
    assert meta["sharing_kernel"] == "matmul+conv"

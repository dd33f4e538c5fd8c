"""planner.costmodel.batch: a layer's time at a micro-batch, off its measured batches or the two-point law."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner import costmodel as cm
from planner import ir
from planner.cluster import cluster_from_dict
from planner.costmodel.batch import local_line, times_at
from tests.conftest import make_cluster_dict, make_profile_dict

# one layer at 16 samples: 0.064 s forward, measured at 8, 4 and 2 as well (cheaper per sample at 8)
POINTS = [(8, 0.028, 0.060), (4, 0.016, 0.034), (2, 0.010, 0.021)]


def _profile(points: list[tuple[int, float, float]] = POINTS, **layer: Any) -> ir.ModelProfile:
    doc = make_profile_dict(1, batch_size=16)
    doc["layers"][0].update(forward_s=0.064, backward_s=0.130, **layer)
    doc["layers"][0]["batch_times"] = [{"batch": b, "forward_s": f, "backward_s": w} for b, f, w in points]
    return ir.ModelProfile.from_dict(doc)


def _total(at: cm.batch.AtBatch) -> tuple[float, float]:
    return float(at.fwd_fixed[0] + at.fwd_var[0]), float(at.bwd_fixed[0] + at.bwd_var[0])


@pytest.mark.parametrize(("b", "fwd", "bwd"), [(16, 0.064, 0.130), *POINTS])
def test_at_a_measured_batch_the_time_is_the_measured_one(b: int, fwd: float, bwd: float) -> None:
    assert _total(times_at(_profile(), b)) == pytest.approx((fwd, bwd))


def test_between_two_measured_batches_the_time_lies_on_their_line() -> None:
    at = times_at(_profile(), 6)
    assert _total(at) == pytest.approx(((0.016 + 0.028) / 2, (0.034 + 0.060) / 2))
    assert at.fwd_fixed[0] == pytest.approx(0.016 - 4 * (0.012 / 4))  # the line's intercept: 4 ms
    at = times_at(_profile(), 12)  # 8 -> 16 is steeper than proportional: no fixed part
    assert at.fwd_fixed[0] == 0.0 and _total(at)[0] == pytest.approx(0.046)


def test_below_the_smallest_batch_the_line_is_anchored_there() -> None:
    at = times_at(_profile(), 1)
    fixed = 0.010 - 2 * (0.006 / 2)  # the 2 -> 4 line's intercept
    assert at.fwd_fixed[0] == pytest.approx(fixed)
    assert _total(at)[0] == pytest.approx(fixed + (0.010 - fixed) / 2)


def test_without_batch_times_it_is_the_two_point_law() -> None:
    doc = make_profile_dict(1, batch_size=16)
    doc["layers"][0].update(forward_fixed_s=0.004, backward_fixed_s=0.0)
    at = times_at(ir.ModelProfile.from_dict(doc), 4)
    assert (at.fwd_fixed[0], at.fwd_var[0]) == pytest.approx((0.004, 0.006 / 4))
    assert (at.bwd_fixed[0], at.bwd_var[0]) == pytest.approx((0.0, 0.02 / 4))


@given(times=st.lists(st.floats(1e-4, 1.0), min_size=3, max_size=6), b=st.floats(0.25, 32.0))
def test_the_time_stays_between_its_neighbours_and_the_fixed_part_inside_it(times: list[float], b: float) -> None:
    batches = np.array([2.0 ** k for k in range(len(times))])
    fixed, var = local_line(batches, np.array([times]), min(b, batches[-1]))
    total = fixed[0] + var[0]
    assert 0 <= fixed[0] <= total + 1e-15
    i = int(np.clip(np.searchsorted(batches, b) - 1, 0, len(batches) - 2))
    if b >= batches[0]:  # interpolated: between the two measured times around it
        lo, hi = sorted(times[i:i + 2])
        assert lo - 1e-12 <= total <= hi + 1e-12
    else:  # below the smallest: no more than the smallest, no less than its share of it
        assert times[0] * b / batches[0] - 1e-12 <= total <= times[0] + 1e-12


def test_a_stage_on_one_device_pays_the_measured_time_of_its_micro_batch() -> None:
    cluster = cluster_from_dict(make_cluster_dict(1, 2))
    stage = ir.Stage((0, 1), ("n0.g0",), ("dp",), 0)
    cost = cm.stage_cost_values(_profile(), cluster, stage, 4, "sgd", None)  # 4 samples a micro-batch
    assert (cost.forward_s, cost.backward_s) == pytest.approx((0.016, 0.034))
    # data parallel over 2 devices at M=2: each replica runs 16 / (2 x 2) = 4 samples a micro-batch
    two = cm.stage_cost_values(_profile(), cluster, ir.Stage((0, 1), ("n0.g0", "n0.g1"), ("dp",), 0), 2, "sgd",
                               None)
    assert (two.forward_s, two.backward_s) == pytest.approx((0.016, 0.034))


def test_each_profile_is_read_off_its_own_times_however_many_are_asked_in_turn() -> None:
    profiles = [_profile([(8, 0.028 + k * 1e-3, 0.060), (4, 0.016, 0.034), (2, 0.010, 0.021)]) for k in range(12)]
    for _ in range(2):
        for k, prof in enumerate(profiles):
            assert _total(times_at(prof, 8))[0] == pytest.approx(0.028 + k * 1e-3)

"""calibrate_cores: the capacity of a node whose processes outnumber its cores, fitted from a real pipeline."""

from __future__ import annotations

import os

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from planner import ir
from planner.calibrate_cores import fit_capacity, measure_capacity, with_capacity
from tests.conftest import make_cluster_dict


def _cluster(nproc: int, concurrent: float) -> ir.Cluster:
    doc = make_cluster_dict(1, nproc)
    doc["nodes"][0]["concurrent_devices"] = concurrent
    for g in doc["nodes"][0]["gpus"]:
        g["memory_bandwidth_Bps"] = 1e10
    return ir.Cluster.from_dict(doc)


def test_with_capacity_sets_the_nodes_concurrency_and_each_devices_share() -> None:
    got = with_capacity(_cluster(4, 2.0), 1.5, 8e9)
    node = got.nodes[0]
    assert node.concurrent_devices == 1.5
    assert {g.flops for g in node.gpus} == {8e9 * 1.5 / 4}
    assert [g.memory_bandwidth_Bps for g in node.gpus] == pytest.approx([1e10 * 1.5 / 2] * 4)  # was held at 2 of 4
    assert {g.flops for g in with_capacity(_cluster(2, 2.0), 2.0, 8e9).gpus} == {8e9}  # no sharing: full speed


@given(work=st.floats(0.1, 10.0), fixed=st.floats(0.0, 1.0), measured=st.floats(0.05, 50.0), cores=st.floats(1, 16))
def test_fit_capacity_meets_the_measurement_or_stops_at_its_bounds(work: float, fixed: float, measured: float,
                                                                   cores: float) -> None:
    def predict(capacity: float) -> float:  # falls as the capacity rises
        return fixed + work / capacity

    got = fit_capacity(predict, measured, cores)
    assert cores / 4 <= got <= cores
    if predict(cores) >= measured:
        assert got == cores  # never more than the cores, even when the model is already slower
    elif predict(cores / 4) <= measured:
        assert got == cores / 4
    else:
        assert predict(got) == pytest.approx(measured, rel=1e-6)


@given(measured=st.floats(0.5, 2.0))
def test_a_slower_measurement_fits_no_more_capacity(measured: float) -> None:
    assume(measured * 1.1 < 2.0)
    def predict(capacity: float) -> float:
        return 2.0 / capacity

    assert fit_capacity(predict, measured * 1.1, 2.0) <= fit_capacity(predict, measured, 2.0)


@pytest.mark.slow
def test_capacity_is_fitted_from_a_real_four_process_pipeline() -> None:
    cores = float(len(os.sched_getaffinity(0)))
    capacity, run = measure_capacity(_cluster(4, min(cores, 4.0)), 1, min(cores, 4.0))
    assert min(cores, 4.0) / 4 <= capacity <= min(cores, 4.0) and run["capacity"] == capacity
    assert run["processes"] == 4 and run["microbatches"] == 8 and run["measured_s"] > 0
    assert run["predicted_at_cores_s"] > 0

"""costmodel.precision: bytes per value, and a profile's times moved to a cluster's GPUs (the rescale note)."""

from __future__ import annotations

import dataclasses

import pytest

from planner import ir
from planner.costmodel.precision import MATCH_TOLERANCE, rescale_note
from tests.conftest import make_cluster_dict, make_profile_dict


def _cpu_cluster(flops: float, concurrent: float | None = 1.0) -> ir.Cluster:
    """Two CPU processes on one node of ``concurrent`` cores (None: a node that shares nothing)."""
    gpus = tuple(ir.GPU(f"cpu{i}", flops, 2**30) for i in range(2))
    node = ir.Node("cpu", gpus, concurrent, 0.8 if concurrent else None)
    link = ir.Link(1e9, 1e-5)
    return ir.Cluster("calibrated-cpu", (node,), (("intra_node", link), ("inter_node", link)))


def _profile(device: str, flops: float) -> ir.ModelProfile:
    return dataclasses.replace(ir.ModelProfile.from_dict(make_profile_dict(4)), device=device, device_flops=flops)


def test_no_note_when_the_peaks_agree_and_the_factor_otherwise() -> None:
    cluster = ir.Cluster.from_dict(make_cluster_dict(1, 2))
    peak = min(g.flops for g in cluster.gpus)
    assert rescale_note(_profile("rtx2080ti", peak * 1.005), cluster, "fp32") is None
    note = rescale_note(_profile("rtx2080ti", peak * 2), cluster, "fp32")
    assert note is not None and note.factor == pytest.approx(2.0) and note.matched_factor is None
    assert note.warning is None and note.to_dict()["warning"] is None


def test_a_cpu_profile_on_a_cluster_matched_to_it_has_the_core_shares_factor_and_no_warning() -> None:
    # 2 processes on 1 core at 0.8 efficiency: the cluster's flops are 0.4 of one process alone
    cluster = _cpu_cluster(0.4e10)
    note = rescale_note(_profile("cpu", 1e10), cluster, "fp32")
    assert note is not None and note.factor == pytest.approx(2.5) and note.matched_factor == pytest.approx(2.5)
    assert note.warning is None


@pytest.mark.parametrize("off", [MATCH_TOLERANCE * 1.01, 1 / (MATCH_TOLERANCE * 1.01), 90.0])
def test_a_cpu_profile_far_from_the_clusters_speed_is_warned_with_what_to_do(off: float) -> None:
    note = rescale_note(_profile("cpu", 1e10 * off), _cpu_cluster(0.4e10), "fp32")
    assert note is not None and note.warning is not None
    assert f"{off:.3g} times" in note.warning and "--match-profile" in note.warning
    assert note.to_dict()["warning"] == note.warning


def test_inside_the_tolerance_or_off_a_calibrated_cpu_cluster_nothing_is_warned() -> None:
    assert rescale_note(_profile("cpu", 1e10 * 1.4), _cpu_cluster(0.4e10), "fp32").warning is None  # type: ignore[union-attr]
    gpu_profile = rescale_note(_profile("h100", 1e15), _cpu_cluster(0.4e10), "fp32")
    assert gpu_profile is not None and gpu_profile.warning is None  # an analytic GPU profile: rescaled on purpose
    unshared = rescale_note(_profile("cpu", 1e12), _cpu_cluster(1e10, concurrent=None), "fp32")
    assert unshared is not None and unshared.warning is None  # a hand-written cluster: nothing to compare with

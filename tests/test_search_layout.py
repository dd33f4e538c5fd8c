"""planner.search.layout: a baseline's layout as a plan the judge takes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from planner import ir
from planner.search.layout import Layout, NotFitting, divisors
from tests.conftest import make_cluster_dict, make_profile_dict


def _two_stages(**fields: object) -> tuple[Layout, ir.ModelProfile, ir.Cluster]:
    profile = ir.ModelProfile.from_dict(make_profile_dict(4, batch_size=8))
    cluster = ir.Cluster.from_dict(make_cluster_dict(2, 2))
    first, second = ("n0.g0", "n0.g1"), ("n1.g0",)
    stages = (((0, 2), first, ("dp", "dp")), ((2, 4), second, ("dp", "dp")))
    return Layout("test", stages, "1f1b", (1, 2), **fields), profile, cluster  # type: ignore[arg-type]


def test_a_layout_becomes_an_unjudged_plan_with_its_settings() -> None:
    layout, profile, cluster = _two_stages(zero=1, recompute="selective")
    assert layout.config == "2-1" and layout.data_parallel and layout.flags == ""
    plan = layout.plan(profile, cluster, 2, "adam", recompute=[False, True])
    assert [s.layers for s in plan.stages] == [(0, 2), (2, 4)] and plan.microbatches == 2
    assert [s.zero for s in plan.stages] == [1, 0]  # a stage of one rank has nothing to shard
    assert [s.recompute for s in plan.stages] == ["selective", "full"]  # the judge's overflowing stage: full
    assert (plan.solver, plan.engine, plan.precision, plan.predicted.iteration_s) == ("test", "any", "fp32", 0.0)


def test_an_interleaved_layouts_config_is_per_device_group() -> None:
    profile = ir.ModelProfile.from_dict(make_profile_dict(4, batch_size=8))
    cluster = ir.Cluster.from_dict(make_cluster_dict(1, 2))
    stages = tuple(((c, c + 1), (f"n0.g{c % 2}",), ("dp",)) for c in range(4))
    layout = Layout("test", stages, "interleaved", (2,), virtual_stages=2, flags="--some-option 1")
    assert layout.config == "1-1" and not layout.data_parallel and layout.flags == "--some-option 1"
    plan = layout.plan(profile, cluster, 2, "sgd")
    assert (plan.virtual_stages, plan.pipeline_stages, len(plan.stages)) == (2, 2, 4)


def test_divisors_and_not_fitting() -> None:
    assert divisors(12) == (1, 2, 3, 4, 6, 12) and divisors(1) == (1,)
    assert NotFitting("x", "why").reason == "why"


@given(st.integers(1, 5000))
def test_divisors_are_every_divisor_ascending(n: int) -> None:
    assert divisors(n) == tuple(d for d in range(1, n + 1) if n % d == 0)

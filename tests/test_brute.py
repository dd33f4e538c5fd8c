"""Brute force: refuses big inputs clearly, and agrees with the DP on a fixed small case."""

from __future__ import annotations

import pytest

from planner import ir
from planner.cluster import cluster_from_dict
from planner.errors import UsageError
from planner.search import search
from planner.search.brute import count_plans
from planner.search.sp import build_problem
from tests.conftest import make_cluster_dict, make_profile_dict


def test_brute_refuses_big_inputs() -> None:
    profile = ir.ModelProfile.from_dict(make_profile_dict(40, batch_size=8))
    cluster = cluster_from_dict(make_cluster_dict(4, 4))
    with pytest.raises(UsageError, match="brute"):
        search(profile, cluster, microbatches=2, solver="brute")


def test_brute_matches_dp_plan_time() -> None:
    profile = ir.ModelProfile.from_dict(make_profile_dict(5, batch_size=8))
    cluster = cluster_from_dict(make_cluster_dict(2, 2))
    a = search(profile, cluster, microbatches=4, solver="dp", candidates=0)
    b = search(profile, cluster, microbatches=4, solver="brute", candidates=0)
    assert a.predicted.iteration_s == pytest.approx(b.predicted.iteration_s, rel=1e-9)
    assert b.solver == "brute"


def test_brute_runs_the_same_rerank_pipeline() -> None:
    # brute's enumerated plans are re-ranked by the simulator as the DP's are: never worse than
    # its analytic optimum judged by the simulator, and the prediction is the simulator's
    from planner.simulate import SimOptions, simulate

    profile = ir.ModelProfile.from_dict(make_profile_dict(5, batch_size=8))
    cluster = cluster_from_dict(make_cluster_dict(2, 2))
    exact = search(profile, cluster, microbatches=4, solver="brute", candidates=0)
    plan = search(profile, cluster, microbatches=4, solver="brute")
    options = SimOptions(record_events=False)
    assert plan.solver == "brute"
    assert plan.predicted.iteration_s == simulate(plan, options).iteration_s
    assert plan.predicted.iteration_s <= simulate(exact, options).iteration_s


def test_count_plans_small() -> None:
    profile = ir.ModelProfile.from_dict(make_profile_dict(2, batch_size=8))
    cluster = cluster_from_dict(make_cluster_dict(1, 1))
    prob = build_problem(profile, cluster, microbatches=1, schedule="1f1b", optimizer="sgd")
    assert count_plans(prob) == 1  # one device: one stage over both layers

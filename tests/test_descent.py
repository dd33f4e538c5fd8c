"""The descent over the max term (planner.search.descent): exact against brute force, whatever the
stages-left relaxation, the incumbent or the opening solve made ahead."""

from __future__ import annotations

import math
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from planner.search import descent
from planner.search.brute import brute
from planner.search.descent import open_problem, solve
from planner.search.sp import build_problem
from planner.search.tables import build_candidates
from tests.test_sp import instances, spaces


@settings(max_examples=150, suppress_health_check=[HealthCheck.filter_too_much])
@given(instances(max_layers=5, max_gpus=3), spaces(), st.floats(-1.5, 0.5),
       st.sampled_from(["1f1b", "zb-h1", "interleaved", "gpipe"]))
def test_relaxed_stages_left_count_is_still_exact(inst, space, log_share, schedule) -> None:
    """Tracking one stages-left count first (and doubling while the plan found does not fit) ends
    at brute force's optimum, with a plan that fits with its true counts. The memory is set near
    the model's activations so that it depends on the stages-left count (r_eff > 1)."""
    profile, cluster, _, _, optimizer = inst
    prob = build_problem(profile, cluster, microbatches=8, schedule=schedule, optimizer=optimizer, space=space)
    act_bytes = sum(x.saved_bytes for x in profile.layers) / 8
    prob.capacity_override = act_bytes * 10**log_share + 4 * max(x.param_bytes for x in profile.layers)
    build_candidates(prob)
    assume(prob.r_eff > 1)
    with mock.patch.object(descent, "RELAXED_STAGES", 1):
        a = solve(prob)
    b = brute(prob)
    assert (a is None) == (b is None)
    if a is not None and b is not None:
        assert a.objective == pytest.approx(b.objective, rel=1e-9, abs=1e-15)
        assert descent.fits(prob, a)


@given(instances(max_layers=6, max_gpus=3), spaces(), st.floats(0.5, 1.5))
def test_incumbent_closes_only_what_cannot_beat_it(inst, space, share) -> None:
    """With another problem's best as the incumbent, the result is the optimum when the optimum is
    below it, and otherwise a plan (or nothing) no better than the incumbent: never a wrong optimum."""
    profile, cluster, m, schedule, optimizer = inst
    prob = build_problem(profile, cluster, microbatches=m, schedule=schedule, optimizer=optimizer, space=space)
    b = brute(prob)
    assume(b is not None)
    assert b is not None
    incumbent = b.objective * share
    a = solve(prob, incumbent=incumbent)
    if b.objective < incumbent * (1 - 1e-9):
        assert a is not None and a.objective == pytest.approx(b.objective, rel=1e-9, abs=1e-15)
    else:
        assert a is None or a.objective >= b.objective * (1 - 1e-9)


@given(instances(), spaces())
def test_opening_made_ahead_gives_the_same_optimum(inst, space) -> None:
    profile, cluster, m, schedule, optimizer = inst
    prob = build_problem(profile, cluster, microbatches=m, schedule=schedule, optimizer=optimizer, space=space)
    opening = open_problem(prob)
    a, b = solve(prob), solve(prob, opening=opening)
    assert (a is None) == (b is None) == (opening.solution is None)
    if a is not None and b is not None:
        assert a.objective == b.objective


def test_trim_keeps_exactly_the_values_that_can_beat_the_limit() -> None:
    prob = mock.Mock(a=2.0)
    vals = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    # a * s + v < 10 with s = 3: v < 4 -> indices 0..2
    assert descent._trim(prob, vals, 0, 4, 3.0, 10.0) == 2
    assert descent._trim(prob, vals, 1, 4, 3.0, 10.0) == 2
    assert descent._trim(prob, vals, 0, 4, 0.0, math.inf) == 4
    # the interval's first value is kept even at the limit (its bound was tested before)
    assert descent._trim(prob, vals, 3, 4, 3.0, 10.0) == 3


def test_bisection_follows_a_cut_at_the_top() -> None:
    """After a top cut, the lower part is bisected; after a bisection, both parts are cut at the top."""
    prob = mock.Mock(a=1.0)
    vals = np.arange(10, dtype=float)
    sol = mock.Mock(top=6.0, total=1.0)
    heap: list = []
    descent._push_intervals(heap, prob, vals, (0, 8, 8), 0.5, sol, True)
    assert [(lo, hi, top) for _, lo, hi, _, top in heap] == [(0, 5, False)]
    heap.clear()
    descent._push_intervals(heap, prob, vals, (0, 6, 9), 0.5, sol, False)
    assert sorted((lo, hi, top) for _, lo, hi, _, top in heap) == [(0, 5, True), (7, 9, True)]

"""search.collect: every problem solved while it may win, the solutions met kept best objective first."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from planner import ir
from planner.cluster import cluster_from_dict
from planner.errors import PlannerError
from planner.search.collect import collect, collect_exact, refused_met, solve_one
from planner.search.counts import microbatch_candidates, refusal
from planner.search.options import Request, check_request, problems
from tests.conftest import make_cluster_dict, make_profile_dict


def _request(profile: ir.ModelProfile, cluster: ir.Cluster, solver: str = "dp", schedule: str = "1f1b",
             engine: str = "any") -> Request:
    return check_request(profile, cluster, schedule=schedule, optimizer="sgd", solver=solver, engine=engine,
                         config=None, precision=None, tp=None, zero="auto", recompute="auto", micro_batch_size=None,
                         max_blocks=None)


@settings(max_examples=15, deadline=None)
@given(st.integers(2, 6), st.sampled_from([(1, 2), (2, 1), (1, 3), (2, 2)]), st.sampled_from([2, 4, 8]),
       st.sampled_from([6 * 10**6, 10**10]))
def test_the_first_solution_met_is_the_best_over_every_problem(layers: int, shape: tuple[int, int], batch: int,
                                                             memory_bytes: int) -> None:
    """The solutions come best objective first, and the first is the least objective of every micro-batch count's
    problem solved by brute force: the bounds that skip problems never skip the optimum."""
    profile = ir.ModelProfile.from_dict(make_profile_dict(layers, batch_size=batch))
    cluster = cluster_from_dict(make_cluster_dict(*shape, memory_bytes))
    req = _request(profile, cluster)
    counts = microbatch_candidates(batch, "auto", None)
    brute = [solve_one(f.build(), "brute") for m in counts for f in problems(profile, cluster, m, req)
             if f.has_moves]
    best = min((s.objective for s in brute if s is not None), default=None)
    try:
        found, probs = collect(profile, cluster, req, counts, None)
    except PlannerError:  # nothing fits (or no whole micro-batches): brute force must find nothing either
        assert best is None
        return
    assert best is not None and probs
    objectives = [obj for obj, _, _, _ in found]
    assert objectives == sorted(objectives)
    assert abs(objectives[0] - best) <= 1e-9 * best


def test_the_exact_count_retry_keeps_only_counts_the_engine_runs() -> None:
    """12 equal layers on three GPUs of 20 MB at M = 16 under zb-h1 on torch: the free search's best solutions have
    three stages, which torch refuses at 16 (refused_met names one); collected again on exact stage counts, every
    solution met runs."""
    profile = ir.ModelProfile.from_dict(make_profile_dict(12, batch_size=32))
    cluster = cluster_from_dict(make_cluster_dict(1, 3, 2 * 10**7))
    req = _request(profile, cluster, schedule="zb-h1", engine="torch")
    found, _ = collect(profile, cluster, req, [16], None)
    refused = refused_met(found, "torch", "dp")
    assert refused is not None and refused.pipeline_stages == 3
    again, _ = collect_exact(profile, cluster, req, [16], None, refused, [16])
    assert again and all(refusal("zb-h1", "torch", p.microbatches, len(s.stages)) is None for _, _, p, s in again)

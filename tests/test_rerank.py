"""search.rerank: the memory rule that admits a candidate, the pruned re-rank, simulated predictions."""

from __future__ import annotations

import dataclasses

import pytest

from planner import ir
from planner.cluster import cluster_from_dict
from planner.costmodel import stage_costs
from planner.search import rerank, search
from planner.search import seeds as sd
from planner.search.sp import build_problem
from planner.simulate import SimOptions, simulate
from tests.conftest import make_cluster_dict, make_profile_dict


def _problem(nodes: int, per: int, *, n_layers: int = 8, memory_bytes: int = 10**10, **kw: object):  # type: ignore[no-untyped-def]
    profile = ir.ModelProfile.from_dict(make_profile_dict(n_layers, batch_size=16))
    cluster = cluster_from_dict(make_cluster_dict(nodes, per, memory_bytes))
    return build_problem(profile, cluster, microbatches=4, schedule="1f1b", optimizer="sgd", **kw)


def _configs(plans: list[rerank.Costed]) -> set[str]:
    return {p.config for p, _ in plans}


def test_a_seed_that_overflows_gets_recomputation_or_is_dropped() -> None:
    from planner.costmodel import plan_memory

    prob = _problem(2, 2)  # 1f1b: stage 0 of 1-1-1-1 holds 4 micro-batches in flight
    plan = next(p for p, _ in sd.seed_plans(prob, engine="any", solver="dp") if p.config == "1-1-1-1")
    need = max(s.memory_bytes for s in plan.stages)
    recomputing = dataclasses.replace(plan, stages=tuple(dataclasses.replace(s, recompute=True) for s in plan.stages))
    cap = max(plan_memory(recomputing))
    assert cap < need  # the profile's activations are worth recomputing
    tight = dataclasses.replace(plan, cluster=cluster_from_dict(make_cluster_dict(2, 2, cap)))
    fitted = rerank.with_memory(tight)
    assert fitted is not None
    assert fitted[0].stages[0].recomputes and not fitted[0].stages[-1].recomputes  # only where it overflows
    assert all(s.memory_bytes <= cap for s in fitted[0].stages)
    hopeless = dataclasses.replace(tight, cluster=cluster_from_dict(make_cluster_dict(2, 2, cap - 1)))
    assert rerank.with_memory(hopeless) is None


def test_the_returned_plan_is_the_fastest_simulated_candidate() -> None:
    profile = ir.ModelProfile.from_dict(make_profile_dict(6, batch_size=8))
    doc = make_cluster_dict(2, 2)
    doc["links"]["inter_node"]["bandwidth_Bps"] = 1.25e8
    cluster = cluster_from_dict(doc)
    plan = search(profile, cluster, microbatches=4)
    options = SimOptions(record_events=False)
    prob = build_problem(profile, cluster, microbatches=4, schedule="1f1b", optimizer="sgd")
    for seed, _ in sd.seed_plans(prob, engine="any", solver="dp"):
        assert plan.predicted.iteration_s <= simulate(seed, options).iteration_s * (1 + 1e-12)
    analytic = search(profile, cluster, microbatches=4, candidates=0)
    assert plan.predicted.iteration_s <= simulate(analytic, options).iteration_s * (1 + 1e-12)
    assert plan.predicted == rerank.simulated(plan).prediction


def test_evaluate_replaces_the_ranking_but_the_prediction_is_simulated() -> None:
    profile = ir.ModelProfile.from_dict(make_profile_dict(6, batch_size=8))
    cluster = cluster_from_dict(make_cluster_dict(2, 2))
    most_stages = search(profile, cluster, microbatches=4, evaluate=lambda p: -len(p.stages))
    assert len(most_stages.stages) == 4
    assert most_stages.predicted.iteration_s == pytest.approx(simulate(most_stages).iteration_s)


def test_pruned_re_ranking_equals_simulating_every_candidate() -> None:
    for nodes, per, n_layers in ((1, 4, 6), (2, 2, 8), (2, 4, 10)):
        prob = _problem(nodes, per, n_layers=n_layers)
        plans = sd.seed_plans(prob, engine="any", solver="dp")
        assert plans
        times = [rerank.simulated(plan, costs).prediction.iteration_s for plan, costs in plans]
        for (plan, costs), t in zip(plans, times, strict=True):
            assert rerank.busy_lower_bound_s(plan, costs) <= t * (1 + 1e-12)
        best = rerank.best_simulated(plans)
        first_best = min(range(len(plans)), key=lambda i: (times[i], i))
        assert best.prediction.iteration_s == times[first_best]
        assert rerank.plan_key(best.plan) == rerank.plan_key(plans[first_best][0])


@pytest.mark.parametrize("profile_name", ["resnet152-b64-2080ti", "resnet34-b64-2080ti"])
def test_search_is_never_slower_than_pipedream_on_the_pipepar_cluster(profile_name: str) -> None:
    """PipeDream's partitions are in the search's space and among the simulated candidates: ResNet-152, where its
    --straight_pipeline --use_fewer_machines 1-1 (32 micro-batches, 2 of the 8 GPUs) ran in 0.400 s against the
    planner's 1-1-2-2 at 0.428 s until the seeds held every PipeDream setting and its partitioner ran for a model of
    this size (PIPEDREAM_SEED_WORK); ResNet-34, where PipeDream-Flush's 1-1-2-2-2 was ranked below the candidates
    the analytic objective sent to the simulator (docs/reproduction.md)."""
    from pathlib import Path

    from planner.api import load_profile
    from planner.cluster import load_cluster
    from planner.compare import compare

    profile = load_profile(str(Path(__file__).resolve().parents[1] / "profiles" / f"{profile_name}.json"))
    c = compare(profile, load_cluster("pipepar-4x2-2080ti"), schedule="1f1b", optimizer="momentum",
                strategies=("pipedream", "planner"))
    planner_s, pipedream_s = c.get("planner").iteration_s, c.get("pipedream").iteration_s
    assert planner_s is not None and pipedream_s is not None
    assert planner_s <= pipedream_s * (1 + 1e-9)


def test_the_fastest_candidate_the_simulator_says_overflows_loses_to_one_that_fits() -> None:
    """Data parallel over two GPUs holds every weight on each and is faster than two stages holding half each; on
    GPUs that hold the pipeline's peak and not data parallel's, the re-rank returns the pipeline (the simulator's
    memory verdict, planner.judge), and data parallel when it is the only candidate."""
    from planner.costmodel import stage_costs

    profile = ir.ModelProfile.from_dict(make_profile_dict(4, batch_size=16))

    def costed(cluster: ir.Cluster, stages: tuple[ir.Stage, ...]) -> rerank.Costed:
        plan = ir.Plan(profile, cluster, "1f1b", 4, "sgd", stages, ir.Prediction(0.0, 0.0, 0.0, 0))
        return plan, tuple(stage_costs(plan))

    def candidates(cluster: ir.Cluster) -> list[rerank.Costed]:
        dp = ir.Stage((0, 4), ("n0.g0", "n0.g1"), ("dp",) * 4, 0)
        pipe = (ir.Stage((0, 2), ("n0.g0",), ("dp",) * 2, 0), ir.Stage((2, 4), ("n0.g1",), ("dp",) * 2, 0))
        return [costed(cluster, (dp,)), costed(cluster, pipe)]

    roomy = [rerank.simulated(*c) for c in candidates(cluster_from_dict(make_cluster_dict(1, 2)))]
    dp_peak, pipe_peak = (j.prediction.peak_memory_bytes for j in roomy)
    assert roomy[0].prediction.iteration_s < roomy[1].prediction.iteration_s and pipe_peak < dp_peak
    tight = cluster_from_dict(make_cluster_dict(1, 2, (dp_peak + pipe_peak) // 2))
    best = rerank.best_simulated(candidates(tight))
    assert best.fits and len(best.plan.stages) == 2
    alone = rerank.best_simulated(candidates(tight)[:1])
    assert not alone.fits and len(alone.plan.stages) == 1


def _shared_problem(concurrent: float, n_layers: int = 6):  # type: ignore[no-untyped-def]
    """One node of 4 CPU processes sharing ``concurrent`` cores (their flops: all computing at once)."""
    profile = ir.ModelProfile.from_dict(make_profile_dict(n_layers, batch_size=16))
    doc = make_cluster_dict(1, 4)
    doc["nodes"][0]["concurrent_devices"] = concurrent
    return build_problem(profile, cluster_from_dict(doc), microbatches=4, schedule="1f1b", optimizer="sgd")


@pytest.mark.parametrize("concurrent", [1.0, 2.0])
def test_pruned_re_ranking_equals_simulating_every_candidate_on_shared_cores(concurrent: float) -> None:
    """A stage computing while others wait runs faster than its nominal time on shared cores, so the bound
    counts its compute at that speed: it stays below the simulation, and the pruning skips no winner."""
    prob = _shared_problem(concurrent)
    plans = sd.seed_plans(prob, engine="any", solver="dp")
    two = next(p for p, _ in plans if p.config == "1-1-1-1")  # its first half on 2 of the node's 4 processes
    half = len(two.profile.layers) // 2
    first_two = dataclasses.replace(two, stages=(
        dataclasses.replace(two.stages[0], layers=(0, half), forms=("dp",) * half),
        dataclasses.replace(two.stages[1], layers=(half, 2 * half), forms=("dp",) * half)))
    plans = [*plans, (first_two, stage_costs(first_two))]
    times = [rerank.simulated(plan, costs).prediction.iteration_s for plan, costs in plans]
    for (plan, costs), t in zip(plans, times, strict=True):
        assert rerank.busy_lower_bound_s(plan, costs) <= t * (1 + 1e-12)
    first_best = min(range(len(plans)), key=lambda i: (times[i], i))
    assert rerank.plan_key(rerank.best_simulated(plans).plan) == rerank.plan_key(plans[first_best][0])



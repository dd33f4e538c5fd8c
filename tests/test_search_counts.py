"""search.counts: micro-batch and stage counts torch's round-based schedules run together, and the search finding
the fastest plan the engine runs where the stage DP's best plans break that rule."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner import ir
from planner.errors import InfeasibleError, UsageError
from planner.search import search
from planner.search.counts import (
    MAX_AUTO_MICROBATCHES,
    count_refused,
    counts_for_config,
    exact_count_problems,
    microbatch_candidates,
)
from planner.search.framed import frame_problem
from tests.conftest import make_cluster_dict, make_profile_dict

CANDS = [1, 2, 4, 8, 16, 32]


def test_a_config_keeps_the_counts_its_stages_run() -> None:
    """torch's ScheduleInterleavedZeroBubble runs M on K ranks in rounds of M // max(1, M // K) and refuses an M that
    is not a multiple of max(1, M // K): on 3 ranks 8 runs (rounds of 2), 16 and 32 do not (5 and 10)."""
    assert counts_for_config(CANDS, "zb-h1", "torch", (2, 2, 2)) == [1, 2, 4, 8]
    assert counts_for_config(CANDS, "zb-h1", "torch", (2, 2)) == CANDS  # M // (M // 2) = 2 for every even M
    assert counts_for_config(CANDS, "zb-h1", "any", (2, 2, 2)) == CANDS  # no engine, no rule
    assert counts_for_config(CANDS, "zb-h1", "torch", None) == CANDS
    assert counts_for_config(CANDS, "1f1b", "deepspeed", (1, 1, 1)) == CANDS


def test_a_config_that_runs_none_of_the_counts_asked_is_refused_with_the_reason() -> None:
    with pytest.raises(UsageError) as err:
        counts_for_config([32], "zb-h1", "torchtitan", (6, 6, 6))
    assert "--config 6-6-6 has 3 stages" in err.value.cause and "10 for 32 on 3 pipeline ranks" in err.value.cause
    assert "--microbatches" in err.value.hint


def _frame(m: int, gpus: int = 3) -> list:
    profile = ir.ModelProfile.from_dict(make_profile_dict(6, batch_size=2 * m))
    cluster = ir.Cluster.from_dict(make_cluster_dict(1, gpus))
    return [frame_problem(profile, cluster, microbatches=m, schedule="zb-h1", optimizer="sgd")]


def test_exact_count_problems_are_one_per_stage_count_the_engine_runs() -> None:
    assert [f.exact_k for f in exact_count_problems(_frame(16), "torch")] == [1, 2]  # 3 ranks refused at 16
    assert [f.exact_k for f in exact_count_problems(_frame(8), "torch")] == [1, 2, 3]
    assert [f.exact_k for f in exact_count_problems(_frame(16), "any")] == [1, 2, 3]


def _uniform(layers: int, gpus: int, memory_bytes: int, m: int) -> tuple[ir.ModelProfile, ir.Cluster]:
    return (ir.ModelProfile.from_dict(make_profile_dict(layers, batch_size=2 * m)),
            ir.Cluster.from_dict(make_cluster_dict(1, gpus, memory_bytes)))


@pytest.mark.parametrize("candidates", [1, 16])
def test_the_search_finds_the_fastest_plan_the_engine_runs(candidates: int) -> None:
    """12 equal layers of 1 MB on three GPUs of 20 MB at M = 16 under zb-h1: the stage DP's best plans have three
    stages, which torch refuses at 16 micro-batches. The search once failed here (all ranked plans refused) or, with
    16 ranked, took a runnable one of them 32% slower than the best two-stage plan (4 + 8 layers, 0.2425 s)."""
    profile, cluster = _uniform(12, 3, 2 * 10**7, 16)
    plan = search(profile, cluster, schedule="zb-h1", engine="torch", microbatches=16, candidates=candidates)
    forced = search(profile, cluster, schedule="zb-h1", engine="torch", microbatches=16, config="1-1")
    assert not count_refused(plan, "torch") and plan.pipeline_stages == 2
    assert [s.layers for s in plan.stages] == [(0, 6), (6, 12)]
    assert plan.predicted.iteration_s == pytest.approx(forced.predicted.iteration_s)


def test_a_config_search_skips_the_counts_its_stages_refuse() -> None:
    """--config 1-1-1 searched M = 16 and 32 too (the smallest bubbles) and failed: "the best plans found break a
    limit" (here the one plan ranked; so did --config 6-6-6 on torchtitan for llama2-13b at batch 96)."""
    profile, cluster = _uniform(6, 6, 10**10, 16)
    plan = search(profile, cluster, schedule="zb-h1", engine="torch", config="1-1-1", candidates=1)
    assert plan.pipeline_stages == 3 and not count_refused(plan, "torch")
    assert plan.microbatches in (1, 2, 4, 8)


def test_the_dp_and_brute_force_agree_where_counts_are_refused() -> None:
    profile, cluster = _uniform(8, 3, 2 * 10**7, 16)
    kwargs = {"schedule": "zb-h1", "engine": "torch", "microbatches": 16}
    dp = search(profile, cluster, **kwargs)  # type: ignore[arg-type]
    brute = search(profile, cluster, solver="brute", **kwargs)  # type: ignore[arg-type]
    assert dp.predicted.iteration_s == pytest.approx(brute.predicted.iteration_s)
    assert not count_refused(dp, "torch") and not count_refused(brute, "torch")


def test_the_analytic_optimum_is_the_best_plan_the_engine_runs() -> None:
    """--rerank 0 (the analytic optimum) returned the best plan met that torch runs, not the best it runs: 12 layers on
    three GPUs of 20 MB at M = 16 under zb-h1 gave 4 + 8 layers (0.2475 s analytic) where 6 + 6 takes 0.1913 s."""
    profile, cluster = _uniform(12, 3, 2 * 10**7, 16)
    kwargs = {"schedule": "zb-h1", "engine": "torch", "microbatches": 16, "candidates": 0}
    plan = search(profile, cluster, **kwargs)  # type: ignore[arg-type]
    forced = search(profile, cluster, config="1-1", **kwargs)  # type: ignore[arg-type]
    assert not count_refused(plan, "torch") and [s.layers for s in plan.stages] == [(0, 6), (6, 12)]
    assert plan.predicted.iteration_s == pytest.approx(forced.predicted.iteration_s)


def test_a_search_whose_plans_that_fit_are_all_refused_says_so() -> None:
    """Where only three stages fit and torch refuses 16 micro-batches on three ranks, the error named the least memory
    of two stages ("use GPUs with 12.48 MiB") as if nothing fitted; it now names the refusal and the counts that run."""
    profile, cluster = _uniform(12, 3, 11 * 10**6, 16)
    with pytest.raises(InfeasibleError) as err:
        search(profile, cluster, schedule="zb-h1", engine="torch", microbatches=16)
    assert "on 3 stages (1-1-1, 16 micro-batches) it refuses" in err.value.cause
    assert "run on 3 pipeline ranks: --microbatches 1, 2, 4, 8" in err.value.hint
    assert search(profile, cluster, schedule="zb-h1", engine="torch", microbatches=8).config == "1-1-1"


@pytest.mark.parametrize("engine", ["torch", "torchtitan"])
def test_interleaved_chunks_keep_to_the_counts_the_engine_runs_in_the_simulated_order(engine: str) -> None:
    """With v = 2 chunks a rank, torch's ScheduleInterleaved1F1B (torchtitan's too) runs 8 micro-batches on 3 ranks in
    rounds of 4, another order than simulated: torchtitan's search returned that plan (1-1-1, M = 8), which its export
    refuses, and --config 1-1-1 with every count the batch allows failed where M = 1 runs."""
    from planner.runnable import problems
    from tests.test_export_torchtitan import llama_profile

    profile, cluster = llama_profile(12), ir.Cluster.from_dict(make_cluster_dict(1, 3))
    kwargs = {"schedule": "interleaved", "virtual_stages": 2, "engine": engine, "optimizer": "adam"}
    plan = search(profile, cluster, microbatches=8, **kwargs)  # type: ignore[arg-type]
    assert problems(plan, engine) == [] and plan.virtual_stages == 2
    forced = search(profile, cluster, config="1-1-1", **kwargs)  # type: ignore[arg-type]
    assert problems(forced, engine) == [] and forced.microbatches == 1


@settings(max_examples=12)
@given(st.integers(3, 6), st.sampled_from([(1, 3), (1, 4), (2, 2)]), st.sampled_from([2 * 10**7, 10**10]),
       st.sampled_from(["zb-h1", "interleaved"]), st.sampled_from(["auto", 8, 16]))
def test_the_analytic_optimum_is_no_worse_than_any_config_the_engine_runs(layers: int, shape: tuple[int, int],
                                                                        memory: int, schedule: str,
                                                                        microbatches: int | str) -> None:
    """--rerank 0 is exact over the plans torch runs: never slower (analytically) than the optimum of any --config,
    and runnable (equal layers; 12 of them at M = 16 on three GPUs were 29% slower than --config 1-1)."""
    from itertools import product

    from planner.errors import PlannerError
    from planner.runnable import problems

    profile = ir.ModelProfile.from_dict(make_profile_dict(layers, batch_size=32))
    cluster = ir.Cluster.from_dict(make_cluster_dict(shape[0], shape[1], memory))
    kwargs = {"schedule": schedule, "engine": "torch", "microbatches": microbatches, "candidates": 0,
              "virtual_stages": 1 if schedule == "interleaved" else None}  # v > 1: a heuristic (search.interleave)
    plan = search(profile, cluster, **kwargs)  # type: ignore[arg-type]
    assert problems(plan, "torch") == []
    gpus = len(cluster.gpus)
    for k in range(1, min(layers, gpus) + 1):
        for config in (c for c in product(range(1, gpus + 1), repeat=k) if sum(c) <= gpus):
            try:
                forced = search(profile, cluster, config=config, **kwargs)  # type: ignore[arg-type]
            except PlannerError:
                continue
            assert plan.predicted.iteration_s <= forced.predicted.iteration_s * (1 + 1e-9), config


def test_microbatch_candidates_with_a_fixed_size() -> None:
    assert microbatch_candidates(32, "auto", 4) == [1, 2, 4, 8]
    assert microbatch_candidates(32, 2, 4) == [2]


def test_auto_tries_at_most_so_many_micro_batches_and_a_count_given_is_searched() -> None:
    """A prime batch of ten million offered 1 and ten million micro-batches, and the simulator's time grows with M:
    a search ran for hours. auto stops at MAX_AUTO_MICROBATCHES; a count above it, given, is still searched."""
    assert microbatch_candidates(9_999_991, "auto") == [1]
    assert microbatch_candidates(2 ** 20, "auto")[-1] == MAX_AUTO_MICROBATCHES
    assert microbatch_candidates(2 ** 20, "auto", 2)[-1] == MAX_AUTO_MICROBATCHES
    assert microbatch_candidates(2 ** 20, 2 ** 16) == [2 ** 16]

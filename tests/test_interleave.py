"""Interleaved plans with v > 1 chunks per device group: the balanced partition, chunking, judging."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner import ir
from planner.errors import InfeasibleError, UsageError
from planner.judge import judge
from planner.schedule import in_flight_microbatches, schedule_kind
from planner.search.interleave import balanced_bounds, chunk_plan, search_interleaved
from planner.simulate import simulate, validate_plan
from tests.conftest import make_cluster_dict, make_profile_dict


def _range_times(per_layer: list[float]) -> np.ndarray:
    pre = np.concatenate([[0.0], np.cumsum(per_layer)])
    t = pre[None, :] - pre[:, None]
    return np.where(np.triu(np.ones_like(t, dtype=bool), k=1), t, np.inf)


def _brute(times: list[np.ndarray], n: int, v: int, recv: list[np.ndarray] | None = None) -> float:
    k = len(times)
    best = np.inf
    for cuts in itertools.combinations(range(1, n), k * v - 1):
        b = (0, *cuts, n)
        worst = max(max(times[c % k][b[c], b[c + 1]], recv[c % k][b[c]] if recv is not None and c else 0.0)
                    for c in range(k * v))
        best = min(best, worst)
    return float(best)


@given(st.lists(st.floats(0.1, 5.0), min_size=2, max_size=8), st.lists(st.floats(0.5, 3.0), min_size=1, max_size=3),
       st.integers(1, 3), st.lists(st.floats(0.0, 6.0), min_size=8, max_size=8) | st.none())
def test_balanced_bounds_is_the_min_max_partition(layers: list[float], speeds: list[float], v: int,
                                                  inputs: list[float] | None) -> None:
    k = len(speeds)
    if len(layers) < k * v:
        with pytest.raises(ValueError, match="cannot make"):
            balanced_bounds([_range_times(layers)] * k, len(layers), v)
        return
    times = [_range_times([x / s for x in layers]) for s in speeds]
    recv = None if inputs is None else [np.array([0.0, *inputs[:len(layers) - 1]]) * s for s in speeds]
    b = balanced_bounds(times, len(layers), v, recv)
    assert b[0] == 0 and b[-1] == len(layers) and len(b) == k * v + 1
    assert all(x < y for x, y in itertools.pairwise(b))  # every chunk has a layer, model order
    worst = max(max(times[c % k][b[c], b[c + 1]], recv[c % k][b[c]] if recv is not None and c else 0.0)
                for c in range(k * v))
    assert worst == pytest.approx(_brute(times, len(layers), v, recv), rel=1e-12)


def test_faster_group_gets_more_layers() -> None:
    slow, fast = _range_times([1.0] * 12), _range_times([0.5] * 12)
    b = balanced_bounds([slow, fast], 12, 2)
    sizes = [y - x for x, y in itertools.pairwise(b)]
    assert sizes == [2, 4, 2, 4]


def test_cuts_avoid_slow_transfers() -> None:
    even = _range_times([1.0] * 8)
    recv = np.array([0.0, 9.0, 9.0, 0.5, 9.0, 9.0, 9.0, 9.0])  # only layer 3's input is cheap to send
    assert balanced_bounds([even, even], 8, 1) == [0, 4, 8]
    assert balanced_bounds([even, even], 8, 1, [recv, recv]) == [0, 3, 8]  # 5 s per chunk beats 9 s


def _base(n_layers: int = 8, batch: int = 8, m: int = 4, memory: int = 10**10) -> ir.Plan:
    from planner.search import search

    profile = ir.ModelProfile.from_dict(make_profile_dict(n_layers, batch_size=batch))
    cluster = ir.Cluster.from_dict(make_cluster_dict(2, 2, memory_bytes=memory))
    return search(profile, cluster, microbatches=m, schedule="interleaved", config=(1, 1), virtual_stages=1)


def test_chunk_plan_keeps_groups_in_model_order() -> None:
    base = _base()
    plan = chunk_plan(base, 2)
    assert plan.schedule == "interleaved" and plan.virtual_stages == 2 and len(plan.stages) == 4
    assert [s.layers for s in plan.stages] == [(0, 2), (2, 4), (4, 6), (6, 8)]
    for c, s in enumerate(plan.stages):
        assert s.devices == base.stages[c % 2].devices
        assert len(s.forms) == s.layers[1] - s.layers[0]
    validate_plan(plan)


@pytest.mark.parametrize("m", [1, 2, 4, 8])
def test_judged_plan_is_its_simulation_and_in_flight_matches(m: int) -> None:
    base = _base(m=m)
    judged = judge(chunk_plan(base, 2))
    assert judged.fits
    plan = judged.plan
    r = simulate(plan)
    assert plan.predicted.iteration_s == pytest.approx(r.iteration_s, rel=1e-12)
    assert plan.predicted.peak_memory_bytes == r.peak_memory_bytes
    for d in r.devices:
        assert d.peak_in_flight == in_flight_microbatches("interleaved", 2, m, d.lane, 2)
    for c, s in enumerate(plan.stages):
        assert s.memory_bytes == r.lane_result(c % 2).peak_memory_bytes


def test_search_interleaved_round_trips_and_validates() -> None:
    profile = ir.ModelProfile.from_dict(make_profile_dict(8, batch_size=8))
    cluster = ir.Cluster.from_dict(make_cluster_dict(2, 2))
    plan = search_interleaved(profile, cluster, 2, microbatches=4, config=(1, 1))
    assert plan.virtual_stages == 2 and len(plan.stages) == 4
    assert ir.Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    assert simulate(plan).iteration_s == pytest.approx(plan.predicted.iteration_s, rel=1e-12)
    one = search_interleaved(profile, cluster, 1, microbatches=4, config=(1, 1))
    assert one.virtual_stages == 1 and len(one.stages) == 2


def test_search_interleaved_carries_the_data_parallel_yardstick() -> None:
    """An interleaved plan is set against plain data parallel as every other plan is (contracts: ``dp_iteration_s``
    is null only where that does not fit or the batch does not split over the GPUs): the candidates the search
    judged carried none, so every interleaved plan said plain data parallel did not fit."""
    from planner.search import rerank, search

    profile = ir.ModelProfile.from_dict(make_profile_dict(8, batch_size=8))
    cluster = ir.Cluster.from_dict(make_cluster_dict(2, 2))
    plan = search_interleaved(profile, cluster, 2, microbatches=4, config=(1, 1))
    dp_s = rerank.dp_simulated_s(profile, cluster, plan.optimizer, plan.precision, plan.engine)
    assert plan.dp_iteration_s == pytest.approx(dp_s, rel=1e-12)
    assert plan.speedup_over_dp == pytest.approx(dp_s / plan.predicted.iteration_s, rel=1e-12)
    plain = search(profile, cluster, microbatches=4, config=(1, 1))
    assert plain.dp_iteration_s == pytest.approx(plan.dp_iteration_s, rel=1e-12)


def _blocks_between_linears(h: int = 256, seq: int = 16, batch: int = 4) -> ir.ModelProfile:
    """Four layers: a Linear, two transformer blocks (tensor-shardable), a Linear."""
    d = make_profile_dict(4, batch_size=batch)
    for i in (1, 2):
        d["layers"][i].update(type="Block", param_count=12 * h * h, param_bytes=48 * h * h, in_features=h,
                              out_features=h, output_bytes=4 * seq * batch * h, saved_bytes=40 * seq * batch * h,
                              block={"hidden": h, "heads": 4, "kv_heads": 4, "ffn": 4 * h, "seq_len": seq})
    return ir.ModelProfile.from_dict(d)


def test_a_chunk_without_a_tensor_parallel_block_sets_no_sequence_parallelism() -> None:
    """Chunks take their group's sequence parallelism only where they hold a block in the tp form, as the search
    sets it per stage: the chunks of the first and last layers alone kept it, and every run of the plan warned
    that it "changes nothing" (planner.consistency.idle_settings)."""
    from planner.consistency import idle_settings

    cluster = ir.Cluster.from_dict(make_cluster_dict(2, 2))
    plan = search_interleaved(_blocks_between_linears(), cluster, 2, microbatches=2, config=(2, 2), tp=2,
                              engine="torch")
    assert any(s.sequence_parallel for s in plan.stages) and any("tp" not in s.forms for s in plan.stages)
    assert [s.sequence_parallel for s in plan.stages] == ["tp" in s.forms for s in plan.stages]
    assert idle_settings(plan, "plan.json") == []


def test_search_interleaved_refuses_what_cannot_run() -> None:
    profile = ir.ModelProfile.from_dict(make_profile_dict(3, batch_size=8))
    cluster = ir.Cluster.from_dict(make_cluster_dict(2, 2))
    with pytest.raises(UsageError, match=r"into 4 chunks .* it has 3 layers"):
        search_interleaved(profile, cluster, 2, microbatches=4, config=(1, 1))  # 3 layers, 4 chunks
    with pytest.raises(UsageError, match="--virtual-stages 4 on one stage cuts the model into 4 chunks"):
        search_interleaved(profile, cluster, 4, microbatches=4)  # not even one stage cut in 4 fits 3 layers
    with pytest.raises(UsageError, match="DeepSpeed"):
        search_interleaved(profile, cluster, 2, engine="deepspeed")
    with pytest.raises(UsageError, match="positive integer"):
        search_interleaved(profile, cluster, 0)


def test_interleaving_that_does_not_fit_is_infeasible() -> None:
    # Just too little memory: the K-stage plan fits with 1f1b's in-flight count, not with v = 2's.
    profile = ir.ModelProfile.from_dict(make_profile_dict(8, batch_size=8))
    base = _base(memory=10**10)
    chunked = judge(chunk_plan(base, 2)).plan
    need = chunked.predicted.peak_memory_bytes
    tight = ir.Cluster.from_dict(make_cluster_dict(2, 2, memory_bytes=need - 1))
    assert search_interleaved(profile, tight, 1, microbatches=4, config=(1, 1)).virtual_stages == 1
    with pytest.raises(InfeasibleError, match="do not fit in memory"):
        search_interleaved(profile, tight, 2, microbatches=4, config=(1, 1))


def test_torch_interleaved_microbatch_rule() -> None:
    def torch_runs(m: int, k: int) -> bool:
        return schedule_kind("interleaved").torch_refusal(m, k, 1) is None

    assert torch_runs(8, 4) and torch_runs(3, 4) and torch_runs(10, 4)
    assert not torch_runs(7, 2)  # 3 rounds of 2 do not make 7


def test_chunks_keep_the_engines_own_forms() -> None:
    """Each chunk's forms are HPP's under the engine's limits (review 2): the torch export splits the weight of
    Linear and Embedding layers only, so a chunk of torch's interleaved plan must not shard another layer (it
    sharded an Embedding when only Linears split, and the CLI then failed with an internal error: 'the search
    produced a plan that cannot run')."""
    from planner.runnable import problems

    doc = make_profile_dict(8, batch_size=8)
    for layer in doc["layers"]:
        layer.update(type="Conv2d", in_features=500, out_features=500)
    profile = ir.ModelProfile.from_dict(doc)
    cluster = ir.Cluster.from_dict(make_cluster_dict(1, 4))
    for engine in ("any", "torch"):
        plan = search_interleaved(profile, cluster, 2, microbatches=2, config=(2, 2), tp=2, engine=engine,
                                  precision="fp32")
        forms = {form for stage in plan.stages for form in stage.forms}
        assert (forms == {"dp"}) == (engine == "torch"), (engine, forms)
        assert problems(plan, engine) == []


def test_torch_plans_only_the_micro_batch_counts_it_runs_in_the_simulated_order() -> None:
    """Review 2: torch's ScheduleInterleaved1F1B cuts M micro-batches into rounds of M // max(1, M // K), not K,
    and warms rank d up with (v - 1) rounds + 2 (K - 1 - d) forwards: on K = 3 ranks, M = 8 is two rounds of 4 and
    rank 0 holds 9 chunk micro-batches where the simulated (Megatron) order holds 8, so a plan searched for torch
    under-predicted its memory (llama3-8b at 8192 tokens on 3 x 8 H100s: stage 0 by about a chunk's 9 GiB)."""
    from planner.schedule.kinds import torch_order_matches

    assert not torch_order_matches(8, 3, 2) and not torch_order_matches(3, 2, 2) and not torch_order_matches(10, 4, 3)
    assert torch_order_matches(6, 3, 2) and torch_order_matches(8, 4, 4) and torch_order_matches(1, 2, 2)
    assert torch_order_matches(7, 2, 1)  # one chunk: plain 1F1B
    profile = ir.ModelProfile.from_dict(make_profile_dict(12, batch_size=8))
    cluster = ir.Cluster.from_dict(make_cluster_dict(3, 1))
    assert search_interleaved(profile, cluster, 2, microbatches=8, config=(1, 1, 1)).microbatches == 8
    with pytest.raises(UsageError, match="warms up in rounds of 4") as err:  # refused up front (search.counts)
        search_interleaved(profile, cluster, 2, microbatches=8, config=(1, 1, 1), engine="torch")
    assert "--microbatches 1" in err.value.hint  # of the batch's 1, 2, 4 and 8, on 3 ranks of 2 chunks


def test_the_least_memory_of_a_search_that_fits_nothing_is_not_offered_for_more_chunks() -> None:
    """When even one chunk per group fits nowhere, the error's least memory is that search's: v = 2 holds more in
    flight, so the figure (and needed_bytes) is not given as what an interleaved plan needs."""
    profile = ir.ModelProfile.from_dict(make_profile_dict(8, batch_size=8))
    tiny = ir.Cluster.from_dict(make_cluster_dict(2, 2, memory_bytes=1_000_000))
    with pytest.raises(InfeasibleError) as one:
        search_interleaved(profile, tiny, 1, microbatches=4)
    with pytest.raises(InfeasibleError) as two:
        search_interleaved(profile, tiny, 2, microbatches=4)
    assert one.value.needed_bytes is not None and two.value.needed_bytes is None
    assert two.value.cause.startswith(one.value.cause) and "2 chunks a group hold more" in two.value.cause

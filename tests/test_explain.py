"""planner.explain: where a plan's iteration goes, what bounds it, idle GPUs, runner-ups, memory headroom."""

from __future__ import annotations

import dataclasses

import pytest

from planner import ir
from planner.cluster import load_cluster
from planner.costmodel import stage_costs
from planner.explain import best_on_all_gpus, bottleneck, explain, runner_ups
from planner.jsonio import read_json
from planner.search import search
from planner.search.rerank import simulated
from planner.simulate import simulate
from tests.conftest import make_cluster_dict, make_profile_dict

Candidate = tuple[ir.Plan, ir.Prediction]


@pytest.fixture(scope="module")
def vgg_search() -> tuple[ir.Plan, list[Candidate]]:
    """vgg16 (shipped profile) on the paper's 4 x 2 RTX 2080Ti cluster, every judged candidate recorded."""
    profile = ir.ModelProfile.from_dict(read_json("profiles/vgg16-b64-2080ti.json", "profile"))
    judged: list[Candidate] = []

    def judge(plan: ir.Plan) -> float:
        verdict = simulated(plan)
        judged.append((verdict.plan, verdict.prediction))
        return verdict.prediction.iteration_s

    plan = search(profile, load_cluster("pipepar-4x2-2080ti"), evaluate=judge)
    return plan, judged


def test_terms_follow_the_stage_costs_and_the_simulation(vgg_search) -> None:
    plan, judged = vgg_search
    e = explain(plan, judged)
    costs = stage_costs(plan)
    result = simulate(plan)
    assert len(e.stages) == len(plan.stages)
    for s, (st, c) in enumerate(zip(e.stages, costs, strict=True)):
        assert st.compute_s == pytest.approx(plan.microbatches * (c.forward_s + c.backward_s))
        assert st.allreduce_s == pytest.approx(c.allreduce_s)
        act_in = costs[s - 1].send_s if s > 0 else 0.0
        assert st.transfer_s == pytest.approx(plan.microbatches * max(act_in, c.send_s))
        assert st.optimizer_s == pytest.approx(c.optimizer_step_s)
        busy = max(d.busy_s for d in result.devices if d.lane == s)
        assert st.idle_s == pytest.approx(result.iteration_s - busy, abs=1e-12)
        assert st.headroom_bytes == min(d.capacity_bytes - d.peak_memory_bytes
                                        for d in result.devices if d.lane == s)
    assert e.iteration_s == pytest.approx(result.iteration_s)
    assert e.bottleneck == bottleneck(e.stages)
    assert e.bound == e.stages[e.bottleneck].bound()


@pytest.mark.parametrize("bucket_mb", [25, 1])
def test_terms_add_up_to_the_iteration_with_the_all_reduce_overlapped(vgg_search, bucket_mb: int) -> None:
    """simulate --overlap-allreduce --explain: the part of the all-reduce the backward hides is neither
    all-reduce nor idle time; compute + all-reduce + optimizer + engine + idle is the iteration."""
    from planner.simulate import SimOptions

    plan, _ = vgg_search
    for overlap in (False, True):
        result = simulate(plan, SimOptions(overlap_allreduce=overlap, bucket_bytes=bucket_mb * 2**20))
        e = explain(plan, result=result)
        for st in e.stages:
            parts = st.compute_s + st.allreduce_s + st.optimizer_s + st.engine_s + st.idle_s
            assert parts == pytest.approx(result.iteration_s, rel=1e-9)
        full = sum(c.allreduce_s for c in stage_costs(plan)[:1])
        assert (e.stages[0].allreduce_s < full) == overlap  # stage 0's reduction partly hidden only when overlapped


def test_idle_gpus_and_the_best_plan_that_uses_them(vgg_search) -> None:
    plan, judged = vgg_search
    e = explain(plan, judged)
    used = {d for s in plan.stages for d in s.devices}
    assert set(e.idle_devices) == {g.name for g in plan.cluster.gpus} - used
    assert e.idle_devices, "vgg16 on pipepar-4x2-2080ti leaves GPUs idle (the issue's case)"
    full = [p for p in judged if p[0].world_size == 8]
    assert e.all_gpus is not None and full
    assert e.all_gpus.world_size == 8
    assert e.all_gpus.iteration_s == pytest.approx(min(p[1].iteration_s for p in full))
    assert e.all_gpus.iteration_s >= e.iteration_s  # else the search would have picked it
    assert e.all_gpus.slower_fraction == pytest.approx(e.all_gpus.iteration_s / e.iteration_s - 1)


def test_runner_ups_are_the_next_distinct_configs_fastest_first(vgg_search) -> None:
    plan, judged = vgg_search
    e = explain(plan, judged, n_runner_ups=3)
    configs = [a.config for a in e.runner_ups]
    assert len(configs) == 3 and len(set(configs)) == 3 and plan.config not in configs
    times = [a.iteration_s for a in e.runner_ups]
    assert times == sorted(times)
    assert all(t >= e.iteration_s for t in times)
    best_other = min(p[1].iteration_s for p in judged if p[0].config != plan.config)
    assert times[0] == pytest.approx(best_other)


def test_without_candidates_nothing_is_claimed_about_alternatives(vgg_search) -> None:
    plan, _ = vgg_search
    e = explain(plan)
    assert not e.judged and e.runner_ups == () and e.all_gpus is None
    doc = e.to_dict()
    assert doc["judged"] is False and doc["runner_ups"] == [] and doc["all_gpus"] is None
    assert {"bottleneck_stage", "bound", "idle_devices", "stages", "iteration_s"} <= set(doc)
    assert {"compute_s", "transfer_s", "allreduce_s", "optimizer_s", "idle_s", "headroom_bytes"} <= set(
        doc["stages"][0])


def test_judged_but_no_plan_on_all_gpus() -> None:
    profile = ir.ModelProfile.from_dict(make_profile_dict(4, batch_size=8))
    cluster = ir.Cluster.from_dict(make_cluster_dict(2, 2))
    plan = search(profile, cluster, config=(1, 1), microbatches=4)
    narrow = [(plan, plan.predicted)]
    assert best_on_all_gpus(plan, narrow) is None
    e = explain(plan, narrow)
    assert e.judged and e.all_gpus is None and len(e.idle_devices) == 2
    assert runner_ups(plan, narrow) == []


def test_a_compute_bound_single_stage_has_no_bubble_bound() -> None:
    profile = ir.ModelProfile.from_dict(make_profile_dict(4, batch_size=8))
    cluster = ir.Cluster.from_dict(make_cluster_dict(1, 1))
    plan = search(profile, cluster, microbatches=1)
    e = explain(plan)
    assert e.bound == "compute" and e.idle_devices == () and e.bottleneck == 0
    assert e.stages[0].terms()["compute"] == pytest.approx(e.stages[0].compute_s)


def test_the_engines_overheads_are_a_term_of_their_own() -> None:
    """What the plan's engine adds (per action, per micro-batch sent, per step) is the ``engine``
    term, taken out of compute and the optimizer step; the stage's work is unchanged."""
    from planner.ir import EngineOverhead

    profile = ir.ModelProfile.from_dict(make_profile_dict(8, batch_size=8))
    bare = ir.Cluster.from_dict(make_cluster_dict(2, 2))
    over = EngineOverhead(per_action_s=2e-3, per_microbatch_s=1e-3, per_step_s=5e-3)
    cluster = dataclasses.replace(bare, engine_overheads=(("torch", over),))
    plan = search(profile, cluster, microbatches=4, engine="torch", config=(2, 2))
    charged, plain = explain(plan), explain(dataclasses.replace(plan, cluster=bare))
    m = plan.microbatches
    for s, (c, p) in enumerate(zip(charged.stages, plain.stages, strict=True)):
        sends = (s < len(plan.stages) - 1) + (s > 0)
        assert c.engine_step_s == pytest.approx(5e-3)
        assert c.engine_s == pytest.approx(m * (2 * 2e-3 + sends * 1e-3) + 5e-3)
        assert c.compute_s == pytest.approx(p.compute_s) and c.optimizer_s == pytest.approx(p.optimizer_s)
        assert c.work_s == pytest.approx(p.work_s + c.engine_s)
        assert c.terms()["engine"] == c.engine_s and c.to_dict()["engine_s"] == c.engine_s
    assert all(p.engine_s == 0.0 for p in plain.stages)


def test_a_plan_over_capacity_shows_negative_headroom(vgg_search) -> None:
    plan, _ = vgg_search
    tiny = dataclasses.replace(plan.cluster, nodes=tuple(
        dataclasses.replace(n, gpus=tuple(dataclasses.replace(g, memory_bytes=2**20) for g in n.gpus))
        for n in plan.cluster.nodes))
    e = explain(dataclasses.replace(plan, cluster=tiny))
    assert all(s.headroom_bytes < 0 for s in e.stages)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_zero3s_gathers_are_data_parallel_communication_not_compute(recompute: str) -> None:
    """ZeRO-3's all-gathers in each micro-batch's forward and backward are reported with the all-reduce
    (``planner run`` measures them there), taken out of compute; the stage's work is unchanged."""
    d = make_profile_dict(4, batch_size=8)
    for layer in d["layers"]:
        layer.update(param_count=10**6, param_bytes=4 * 10**6)
    profile = ir.ModelProfile.from_dict(d)
    cluster = ir.Cluster.from_dict(make_cluster_dict(1, 4))
    devices = tuple(g.name for g in cluster.gpus)
    plan = search(profile, cluster, microbatches=2)
    stage = ir.Stage((0, 4), devices, ("dp",) * 4, 0, recompute=recompute, zero=3)
    plan = dataclasses.replace(plan, stages=(stage,))
    (c,), (st,) = stage_costs(plan), explain(plan).stages
    m = plan.microbatches
    assert c.zero_gather_s > 0
    assert st.zero_gather_s == pytest.approx(m * c.zero_gather_s)
    assert st.allreduce_s == pytest.approx(c.allreduce_s + m * c.zero_gather_s)
    assert st.compute_s == pytest.approx(m * (c.forward_s + c.backward_s - c.zero_gather_s))
    assert st.work_s == pytest.approx(m * (c.forward_s + c.backward_s) + c.allreduce_s + c.optimizer_step_s)
    z0 = stage_costs(dataclasses.replace(plan, stages=(dataclasses.replace(stage, zero=0),)))[0]
    assert c.forward_s + c.backward_s - c.zero_gather_s == pytest.approx(z0.forward_s + z0.backward_s)
    plain = stage_costs(dataclasses.replace(plan, stages=(dataclasses.replace(stage, recompute="none"),)))[0]
    forward_gather = plain.forward_s - z0.forward_s  # what the forward's gathers add (prefetched on GPUs)
    assert forward_gather > 0
    assert c.zero_gather_s == pytest.approx(plain.zero_gather_s)  # the forward redone uses the backward's gather

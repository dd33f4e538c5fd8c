"""A framed problem (planner.search.framed): its lower bound holds for every plan in it, and the search
that skips problems by it finds the optimum of solving every problem."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from planner import ir
from planner.errors import PlannerError
from planner.ir import EngineOverhead
from planner.search import search
from planner.search.counts import microbatch_candidates
from planner.search.descent import solve
from planner.search.framed import frame_problem
from planner.search.options import check_request, problems
from tests.test_sp import instances, spaces

ENGINES = ["any", "torch", "deepspeed", "torchtitan"]


@given(instances(), spaces())
def test_the_bound_is_below_the_problems_optimum(inst, space) -> None:
    profile, cluster, m, schedule, optimizer = inst
    framed = frame_problem(profile, cluster, microbatches=m, schedule=schedule, optimizer=optimizer, space=space)
    sol = solve(framed.build())
    if sol is not None:
        assert framed.lower_bound_s() <= sol.objective * (1 + 1e-9)


def _as_llama(profile: ir.ModelProfile) -> ir.ModelProfile:
    """The profile with its inner layers as gated transformer blocks (torchtitan trains nothing else)."""
    shape = ir.BlockShape(64, 4, 2, 128, 16, gated=True)
    inner = range(1, len(profile.layers) - 1)
    return dataclasses.replace(profile, layers=tuple(
        dataclasses.replace(layer, block=shape if i in inner else None) for i, layer in enumerate(profile.layers)))


def _request(profile, cluster, schedule: str, optimizer: str, engine: str):
    return check_request(profile, cluster, schedule=schedule, optimizer=optimizer, solver="dp", engine=engine,
                         config=None, precision=None, tp=None, zero="auto", recompute="auto",
                         micro_batch_size=None)


@settings(max_examples=40)
@given(instances(max_layers=4), st.sampled_from(ENGINES), st.booleans())
def test_skipping_problems_by_their_bound_keeps_the_optimum(inst, engine: str, overheads: bool) -> None:
    """``search(candidates=0)`` (problems best bound first, the rest skipped once they cannot win) returns
    the least objective of every problem of every micro-batch count solved in full, each problem's bound
    below its own optimum, for every engine (one problem per grid where the engine runs one)."""
    profile, cluster, _, schedule, optimizer = inst
    if engine == "torchtitan":
        assume(len(profile.layers) >= 3)
        profile, optimizer = _as_llama(profile), "adam"  # the one optimizer torchtitan builds
    if schedule not in ("gpipe", "1f1b") or engine == "deepspeed":
        schedule = "1f1b"  # every engine runs 1f1b (DeepSpeed only it)
    if overheads:
        cluster = dataclasses.replace(cluster, engine_overheads=(
            (engine if engine != "any" else "torch", EngineOverhead(1e-3, 2e-3, 5e-3, 1e-3, 1e-3)),))
    req = _request(profile, cluster, schedule, optimizer, engine)
    best = None
    for m in microbatch_candidates(profile.batch_size, "auto"):
        for framed in problems(profile, cluster, m, req):
            sol = solve(framed.build())
            if sol is not None:
                assert framed.lower_bound_s() <= sol.objective * (1 + 1e-9)
                best = sol.objective if best is None else min(best, sol.objective)
    try:
        plan = search(profile, cluster, schedule=schedule, optimizer=optimizer, engine=engine, candidates=0)
    except PlannerError:  # nothing fits (or no grid gives whole micro-batches): none of the problems had a plan
        assert best is None
        return
    assert best is not None and plan.predicted.iteration_s == pytest.approx(best, rel=1e-9)


def test_the_engines_cost_of_a_collective_reaches_every_grid_and_moves_the_choice() -> None:
    """Four 500 x 500 layers on two devices: a tensor group of both wins when its collectives cost their bytes alone,
    and loses to two data-parallel ranks once the engine's measured cost of each (torch on a busy CPU: about 1 ms)
    is charged; the grids of the problem carry it, and the DP's prediction is the simulator's."""
    from tests.conftest import make_cluster_dict, make_profile_dict

    doc = make_profile_dict(4, batch_size=8)
    for layer in doc["layers"]:
        layer.update(in_features=500, out_features=500)
    profile, bare = ir.ModelProfile.from_dict(doc), ir.Cluster.from_dict(make_cluster_dict(1, 2))
    chosen = []
    for cost_s in (0.0, 1e-3):
        cluster = dataclasses.replace(bare, engine_overheads=(("torch", EngineOverhead(per_collective_s=cost_s)),))
        framed = frame_problem(profile, cluster, microbatches=1, schedule="1f1b", optimizer="sgd", engine="torch")
        assert {g.collective_s for g in framed.grids} == {cost_s}
        plan = search(profile, cluster, engine="torch")
        chosen.append((plan.stages[0].tp, set(plan.stages[0].forms) - {"dp"}))
    assert chosen == [(2, {"split_out", "split_in"}), (1, set())]


@given(instances(max_layers=4))
def test_a_problem_of_two_stages_or_more_has_no_plan_of_one(inst) -> None:
    profile, cluster, m, _, optimizer = inst
    framed = frame_problem(profile, cluster, microbatches=m, schedule="1f1b", optimizer=optimizer, min_stages=2)
    one = frame_problem(profile, cluster, microbatches=m, schedule="1f1b", optimizer=optimizer, stages=1)
    both = [solve(f.build()) for f in (framed, one)]
    whole = solve(frame_problem(profile, cluster, microbatches=m, schedule="1f1b", optimizer=optimizer).build())
    assert both[0] is None or len(both[0].stages) >= 2
    found = [s.objective for s in both if s is not None]
    assert (whole is None) == (not found)
    if whole is not None:
        assert min(found) == pytest.approx(whole.objective, rel=1e-9)


def _tight_llama(batch: int, saved_bytes: int) -> ir.ModelProfile:
    """A Llama whose blocks keep ``saved_bytes`` of activations at the whole batch: memory decides the modes."""
    from tests.test_export_torchtitan import llama_profile

    profile = llama_profile(blocks=6, heads=4, kv_heads=2, shaped=False)
    layers = tuple(dataclasses.replace(lp, saved_bytes=saved_bytes) if lp.block else lp for lp in profile.layers)
    return dataclasses.replace(profile, layers=layers, batch_size=batch)


def _tight_cluster(tight: int) -> ir.Cluster:
    from tests.conftest import make_cluster_dict

    return ir.Cluster.from_dict(make_cluster_dict(1, 4, memory_bytes=10**5 + tight * 2 * 10**5))


@pytest.mark.parametrize("batch", [4, 8])
@pytest.mark.parametrize("tight", [1, 2, 3, 4, 5, 8])
def test_one_mode_for_the_whole_job_is_the_best_of_the_plans_forced_to_each_mode(batch: int, tight: int) -> None:
    """torchtitan runs one recomputation mode per job: where the best plan mixes modes, the search solves the
    problem once per mode, so its optimum is the best of the searches forced to none and to full."""
    profile, cluster = _tight_llama(batch, 10**6), _tight_cluster(tight)
    forced = {}
    for mode in ("none", "full"):
        try:
            forced[mode] = search(profile, cluster, engine="torchtitan", optimizer="adam", recompute=mode, candidates=0)
        except PlannerError:
            continue
    if not forced:  # neither mode fits: neither does the search
        with pytest.raises(PlannerError):
            search(profile, cluster, engine="torchtitan", optimizer="adam", candidates=0)
        return
    best = search(profile, cluster, engine="torchtitan", optimizer="adam", candidates=0)
    assert len({s.recompute for s in best.stages}) == 1
    assert best.predicted.iteration_s == pytest.approx(min(p.predicted.iteration_s for p in forced.values()),
                                                       rel=1e-12)
    mixed = search(profile, cluster, engine="any", optimizer="adam", recompute="auto", candidates=0)
    assert mixed.predicted.iteration_s <= best.predicted.iteration_s * (1 + 1e-12)


def test_the_tight_case_mixes_none_and_full_where_one_job_may_mix_them() -> None:
    """A tight case whose unconstrained optimum mixes the two modes torchtitan runs; torchtitan, one mode per job,
    finds that neither mode alone fits, and says so rather than emit the mixed plan."""
    profile, cluster = _tight_llama(4, 2 * 10**6), _tight_cluster(1)
    plan = search(profile, cluster, engine="any", optimizer="adam", candidates=0)
    assert [s.recompute for s in plan.stages] == ["none", "full", "none"]
    for mode in ("none", "full", "auto"):
        with pytest.raises(PlannerError):
            search(profile, cluster, engine="torchtitan", optimizer="adam", recompute=mode, candidates=0)

"""compare: every strategy judged by the same cost model and simulator; the planner never loses."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from planner import ir
from planner.compare import PLANNER_SCHEDULES, StrategyResult, best_setting, compare
from planner.errors import UsageError
from planner.judge import judge
from planner.runnable import engines_running
from planner.search import baselines as bl
from planner.search import rerank
from tests.conftest import make_cluster_dict, make_profile_dict

CONTRACT_KEYS = {"name", "iteration_s", "samples_per_s", "fits", "config"}


def _profile(n_layers: int = 12, batch_size: int = 16, **kw: Any) -> ir.ModelProfile:
    return ir.ModelProfile.from_dict(make_profile_dict(n_layers, batch_size=batch_size, **kw))


def _cluster(nodes: int = 2, per: int = 2, memory_bytes: int = 10**10) -> ir.Cluster:
    return ir.Cluster.from_dict(make_cluster_dict(nodes, per, memory_bytes))


def test_the_design_contracts_strategy_names_are_rows_and_deepspeed_is_their_best() -> None:
    """DESIGN.md section 4: names include dp, planner, gpipe-uniform, deepspeed-parameters, deepspeed-uniform,
    accpar, pipedream. ``deepspeed`` tries every partition method, so it is no slower than either named one."""
    result = compare(_profile(), _cluster())
    names = {s.name for s in result.strategies}
    assert names >= {"dp", "planner", "gpipe-uniform", "deepspeed-parameters", "deepspeed-uniform", "accpar",
                     "pipedream"}
    best, default, uniform = (result.get(n) for n in ("deepspeed", "deepspeed-parameters", "deepspeed-uniform"))
    assert default.setting is not None and default.setting.startswith("partition_method=parameters")
    assert uniform.setting is not None and uniform.setting.startswith("partition_method=uniform")
    assert best.iteration_s is not None and default.iteration_s is not None and uniform.iteration_s is not None
    assert best.iteration_s <= min(default.iteration_s, uniform.iteration_s)


def test_every_strategy_is_listed_in_order_with_the_contract_fields() -> None:
    result = compare(_profile(), _cluster())
    assert [s.name for s in result.strategies] == list(bl.STRATEGIES)
    doc = result.to_dict()
    assert doc["kind"] == "comparison"
    for row in doc["strategies"]:
        assert set(row) >= CONTRACT_KEYS
    dp = result.get("dp")
    assert dp.fits and dp.speedup_over_dp == pytest.approx(1.0)
    for s in result.strategies:
        if s.fits:
            assert s.iteration_s and s.iteration_s > 0
            assert s.samples_per_s == pytest.approx(16 / s.iteration_s)
            assert s.speedup_over_dp == pytest.approx(dp.iteration_s / s.iteration_s)
            assert s.plan is not None and s.plan.predicted.iteration_s == s.iteration_s
            assert s.to_dict()["engines"] == engines_running(s.plan)  # which engines run the row's plan
    assert "deepspeed" in (result.get("deepspeed-parameters").engines or [])  # DeepSpeed's own layout runs on it


def test_a_baseline_that_cannot_run_is_listed_with_its_reason() -> None:
    # 3 layers on 4 GPUs: one GPU per stage cannot work; the rest of the comparison goes on
    result = compare(_profile(3), _cluster())
    for name in ("gpipe-uniform", "torchgpipe"):
        row = result.get(name)
        assert not row.fits and row.iteration_s is None
        assert "4 stages" in (row.reason or "") and "3 layers" in (row.reason or "")
    assert result.get("planner").fits and result.get("dp").fits


def test_data_parallel_that_does_not_fit_in_memory_is_a_row_not_a_crash() -> None:
    # 12 layers of 1 MB weights: a full replica needs the weights, gradients and optimizer
    # state of all 12 MB; one twelfth of the model per device fits in far less
    profile = _profile(12)
    tight = _cluster(2, 2, memory_bytes=30_000_000)
    result = compare(profile, tight, optimizer="adam")
    dp = result.get("dp")
    assert not dp.fits and "MiB on" in (dp.reason or "")
    assert dp.speedup_over_dp is None
    assert all(s.speedup_over_dp is None for s in result.strategies)
    assert any(s.fits for s in result.strategies)


def test_a_bad_microbatch_count_or_strategy_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        compare(_profile(batch_size=16), _cluster(), microbatches=3)
    with pytest.raises(UsageError):
        compare(_profile(), _cluster(), strategies=["dp", "alpa"])


def test_judge_fills_memory_and_prediction_from_the_simulator() -> None:
    from planner.simulate import simulate

    profile, cluster = _profile(8), _cluster(2, 2)
    layout = bl.gpipe_uniform_layout(profile, cluster, (4,))
    assert isinstance(layout, bl.Layout)
    plan = layout.plan(profile, cluster, 4, "sgd")
    judged = judge(plan)
    sim = simulate(plan)
    assert judged.fits
    assert judged.plan.predicted.iteration_s == pytest.approx(sim.iteration_s)
    assert all(s.memory_bytes > 0 for s in judged.plan.stages)


# ----------------------------------------------------------------------------- the planner never loses


@st.composite
def cases(draw: st.DrawFn) -> tuple[ir.ModelProfile, ir.Cluster, str]:
    n = draw(st.integers(2, 8))
    batch = draw(st.sampled_from([4, 8, 16]))
    layers = []
    for i in range(n):
        fwd = draw(st.floats(1e-4, 2e-2))
        params = draw(st.integers(0, 4_000_000))
        out = draw(st.integers(1_000, 4_000_000))
        layers.append({"name": f"l{i}", "type": "Linear", "forward_s": fwd, "backward_s": 2 * fwd,
                       "forward_flops": 1e9, "backward_flops": 2e9, "param_count": params // 4,
                       "param_bytes": params, "output_bytes": out, "saved_bytes": out})
    profile = ir.ModelProfile.from_dict(make_profile_dict(n, batch_size=batch, layers=layers))
    nodes = draw(st.integers(1, 2))
    per = draw(st.integers(1, 4))
    doc = make_cluster_dict(nodes, per)
    doc["links"]["inter_node"]["bandwidth_Bps"] = draw(st.sampled_from([1.25e8, 1.25e9, 1e10]))
    doc["links"]["intra_node"]["bandwidth_Bps"] = draw(st.sampled_from([1.25e9, 1e10, 1e11]))
    return profile, ir.Cluster.from_dict(doc), "1f1b"


def _in_planner_space(plan: ir.Plan) -> bool:
    """Whether every stage's group is one the search may choose (planner.search.sp): GPUs
    contiguous inside one server, as many as a power of two or the whole server, or whole
    consecutive servers; every tensor group (a stage's ``tp`` consecutive devices, or the whole stage where
    its forms split layers) inside one server."""
    where = {g.name: (i, j) for i, node in enumerate(plan.cluster.nodes) for j, g in enumerate(node.gpus)}
    for stage in plan.stages:
        pos = [where[d] for d in stage.devices]
        nodes = sorted({n for n, _ in pos})
        tp = stage.width if set(stage.forms) - {"dp"} and stage.tp == 1 else stage.tp
        if any(len({n for n, _ in pos[i:i + tp]}) > 1 for i in range(0, len(pos), max(tp, 1))):
            return False
        if len(nodes) == 1:
            width, size = len(pos), len(plan.cluster.nodes[nodes[0]].gpus)
            first = pos[0][1]
            if [g for _, g in pos] != list(range(first, first + width)):
                return False
            if width != size and width & (width - 1):
                return False
        elif nodes != list(range(nodes[0], nodes[-1] + 1)) or sorted(pos) != [
                (n, g) for n in nodes for g in range(len(plan.cluster.nodes[n].gpus))]:
            return False
    return True


def _losses(case: tuple[ir.ModelProfile, ir.Cluster, str], *, schedule: str | None) -> list[str]:
    """The planner against every fitting baseline whose plan lies in its space (and, with a
    schedule, runs that schedule); the planner is searched for ``schedule`` (None: 1f1b and gpipe)."""
    profile, cluster, _ = case
    result = compare(profile, cluster, schedule=schedule)
    planner = result.get("planner")
    schedules = PLANNER_SCHEDULES if schedule is None else (schedule,)
    rivals = [s for s in result.strategies if s.fits and s.name != "planner" and s.plan is not None
              and _in_planner_space(s.plan) and s.schedule in schedules]
    assume(rivals)
    assert planner.fits, planner.reason
    assert planner.iteration_s is not None
    return [f"planner {planner.config} M={planner.microbatches} {planner.iteration_s:.6g} s slower than {s.name} "
            f"{s.config} M={s.microbatches} {s.iteration_s:.6g} s"
            for s in rivals if s.iteration_s is not None and planner.iteration_s > s.iteration_s * (1 + 1e-9)]


NO_SHRINK = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                     phases=[Phase.explicit, Phase.reuse, Phase.generate])
"""Each example runs every strategy; a failure is reported as found (shrinking took minutes)."""


@NO_SHRINK
@given(cases())
def test_planner_is_never_slower_than_a_baseline_in_its_own_space(case: tuple[ir.ModelProfile, ir.Cluster, str]
                                                                  ) -> None:
    """Against every baseline that runs the planner's schedule (1f1b) on device groups the
    search may form, the planner's plan (its best plans and grid seeds, re-ranked by the
    simulator) is never slower."""
    assert _losses(case, schedule="1f1b") == []


@NO_SHRINK
@given(cases())
def test_planner_is_never_slower_than_any_baseline_in_its_space(case: tuple[ir.ModelProfile, ir.Cluster, str]
                                                                ) -> None:
    """The issue's claim, with no schedule named (the planner tries 1f1b and gpipe), over every
    baseline whose device groups the search may form and whose schedule it searches (PipeDream's
    own weight-stashing schedule is the planner's only with --schedule pipedream). PipeDream's
    groups can lie outside the space (3 GPUs of a 4-GPU server, one GPU of each of two servers): those rows are left
    out, see docs/reproduction.md, 'Where the search and the simulator disagree'."""
    assert _losses(case, schedule=None) == []


def test_rerank_keeps_the_planner_off_a_transfer_bound_pipeline() -> None:
    # Found by the property test: the analytic optimum is 4-4 with M=8 (predicted 12.0 ms), but
    # 1f1b holds only K - s micro-batches in flight, so the 1 Gbit/s boundary is not hidden and it
    # simulates to 17.8 ms; plain data parallel simulates to 12.8 ms
    layers = [{"name": f"l{i}", "type": "Linear", "forward_s": f, "backward_s": 2 * f, "forward_flops": 1e9,
               "backward_flops": 2e9, "param_count": p // 4, "param_bytes": p, "output_bytes": o, "saved_bytes": o}
              for i, (f, p, o) in enumerate([(0.011834760362993, 80995, 944114),
                                             (0.010331110171916, 2002191, 1218383)])]
    profile = ir.ModelProfile.from_dict(make_profile_dict(2, batch_size=8, layers=layers))
    doc = make_cluster_dict(2, 4)
    doc["links"]["inter_node"]["bandwidth_Bps"] = 1.25e8
    doc["links"]["intra_node"]["bandwidth_Bps"] = 1e11
    result = compare(profile, ir.Cluster.from_dict(doc))
    planner, dp = result.get("planner"), result.get("dp")
    assert planner.iteration_s is not None and dp.iteration_s is not None
    assert planner.iteration_s <= dp.iteration_s * (1 + 1e-9)


def test_equal_width_grid_beats_the_planner_case() -> None:
    # Found by the property test. 2 servers x 4 GPUs, 10/1 Gbit/s, 1f1b, batch 16: the search's
    # analytic optimum is 4-4 (M=16: predicted 19.6 ms, simulated 28.8 ms); re-ranking even 200 of
    # its candidates gives 2-2-4 (predicted 19.9 ms, simulated 25.7 ms); DeepSpeed's 2-2-2-2 grid,
    # inside the search's space, is predicted 21.4 ms and simulated 24.5 ms: the grid seeds
    # (planner.search.rerank) put it among the plans the simulator judges
    layers = [{"name": f"l{i}", "type": "Linear", "forward_s": f, "backward_s": 2 * f, "forward_flops": 1e9,
               "backward_flops": 2e9, "param_count": p // 4, "param_bytes": p, "output_bytes": o, "saved_bytes": o}
              for i, (f, p, o) in enumerate([(0.0014126559516863294, 4000000, 3999999),
                                             (0.004069634786057131, 3999999, 7276),
                                             (0.01220828928009729, 291467, 12894),
                                             (0.01267061436399399, 24584, 93528)])]
    profile = ir.ModelProfile.from_dict(make_profile_dict(4, batch_size=16, layers=layers))
    doc = make_cluster_dict(2, 4)
    doc["links"]["inter_node"]["bandwidth_Bps"] = 1.25e8
    doc["links"]["intra_node"]["bandwidth_Bps"] = 1.25e9
    result = compare(profile, ir.Cluster.from_dict(doc), schedule="1f1b",
                     strategies=["planner", "deepspeed"])
    planner, grid = result.get("planner"), result.get("deepspeed")
    uniform = next(s for s in grid.settings if s.setting == "partition_method=uniform")
    assert uniform.config == "2-2-2-2" and grid.iteration_s is not None and uniform.iteration_s is not None
    assert grid.iteration_s <= uniform.iteration_s
    assert planner.iteration_s is not None and grid.iteration_s is not None
    assert planner.iteration_s <= grid.iteration_s * (1 + 1e-9)


# ----------------------------------------------------------------------------- each baseline at its best setting


def _row(setting: str, fits: bool, iteration_s: float | None, peak: int | None = 1) -> StrategyResult:
    return StrategyResult("x", fits, iteration_s, None, "1", "1f1b", 1, peak, None, None if fits else "no",
                          setting=setting)


def test_best_setting_is_the_fastest_that_fits_and_lists_every_setting() -> None:
    rows = [_row("default", True, 2.0), _row("counted", True, 1.5), _row("huge", False, None, 10**12)]
    best = best_setting(rows)
    assert best.setting == "counted" and best.iteration_s == 1.5
    assert [s.setting for s in best.settings] == ["default", "counted", "huge"]
    assert [s.fits for s in best.settings] == [True, True, False]
    # none fits: the one needing the least memory stands for the strategy
    best = best_setting([_row("a", False, None, 300), _row("b", False, None, 200)])
    assert best.setting == "b" and not best.fits


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(cases())
def test_every_row_is_no_slower_than_any_of_its_settings(case: tuple[ir.ModelProfile, ir.Cluster, str]) -> None:
    profile, cluster, _ = case
    result = compare(profile, cluster, strategies=[s for s in bl.STRATEGIES if s != "planner"])
    for row in result.strategies:
        assert row.settings and row.setting in [s.setting for s in row.settings]
        fitting = [s.iteration_s for s in row.settings if s.fits and s.iteration_s is not None]
        assert row.fits == bool(fitting)
        if fitting:
            assert row.iteration_s == pytest.approx(min(fitting))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(cases(), st.sampled_from(["gpipe-uniform", "deepspeed", "pipedream"]))
def test_best_of_skips_only_candidates_whose_lower_bound_is_slower_than_the_best(
        case: tuple[ir.ModelProfile, ir.Cluster, str], name: str) -> None:
    """best_of judges candidates by their lower bound and stops past the fastest that fits: the same answer as
    judging every one, and no judged candidate beats its floor."""
    from planner.compare import best_of, microbatch_choices
    from planner.costmodel import stage_costs
    from planner.judge import fastest
    from planner.runnable import is_runnable
    from planner.search.settings import strategy_settings

    profile, cluster, _ = case
    for setting in strategy_settings(name, profile, cluster, microbatch_choices(profile.batch_size, "auto"), "sgd"):
        plans = [p for lay in setting.layouts for m in lay.microbatches if is_runnable(p := lay.plan(
            profile, cluster, m, "sgd"))]
        every = [judge(p, recompute=True) for p in plans]
        for plan, judged in zip(plans, every, strict=True):
            assert rerank.lower_bound_s(plan, stage_costs(plan)) <= judged.prediction.iteration_s * (1 + 1e-12)
        want, got = fastest(every), best_of(plans)
        assert (want is None) == (got is None)
        if want is not None and got is not None:
            assert (got.plan, got.fits) == (want.plan, want.fits)


def test_a_pipeline_lower_bound_lies_under_the_simulation_of_an_interleaved_plan() -> None:
    from planner.costmodel import stage_costs
    from tests.test_export_torchtitan import llama_profile

    profile, cluster = llama_profile(12, heads=16, kv_heads=8), _cluster(4, 4)
    layouts = bl.megatron_layouts(profile, cluster, (4, 8), interleaved=True)
    assert isinstance(layouts, list) and layouts
    for layout in layouts:
        for m in layout.microbatches:
            plan = layout.plan(profile, cluster, m, "sgd")
            assert 0 < rerank.pipeline_lower_bound_s(plan, stage_costs(plan)) <= judge(plan).prediction.iteration_s


def test_rows_name_the_documented_setting_they_ran() -> None:
    result = compare(_profile(8), _cluster(2, 2), strategies=["pipedream", "deepspeed", "torchgpipe"])
    pipedream, deepspeed, torchgpipe = (result.get(n) for n in ("pipedream", "deepspeed", "torchgpipe"))
    assert {s.setting for s in pipedream.settings} == {f"{label}, {flags.label}" if flags.label else label
                                                        for label, _ in bl.PIPEDREAM_MODES
                                                        for flags in bl.PIPEDREAM_FLAGS}
    assert {s.schedule for s in pipedream.settings} == {"1f1b"}  # PipeDream-Flush: synchronous, as the others
    assert {s.setting for s in deepspeed.settings} >= {"partition_method=parameters", "partition_method=uniform",
                                                        "partition_method=type:Linear"}
    assert {s.setting.split(",")[0] for s in torchgpipe.settings} == {"balance_by_time", "balance_by_size"}
    assert "setting" in result.to_dict()["strategies"][0]


def test_megatron_row_runs_tensor_parallel_stages_on_a_transformer() -> None:
    from tests.test_export_torchtitan import llama_profile

    result = compare(llama_profile(6, heads=16, kv_heads=8), _cluster(2, 4), strategies=["megatron"])
    row = result.get("megatron")
    by_label = {s.setting: s for s in row.settings}
    server = by_label["tp=4 in a server, pp, dp the rest"]
    assert server.fits and server.schedule == "1f1b" and server.iteration_s is not None
    # a tiny model: tensor groups of 4 only add all-reduces, and the row takes tp 1, Megatron's own default
    assert row.fits and row.iteration_s is not None and row.iteration_s <= server.iteration_s
    assert row.setting is not None and row.setting.startswith("tp=1 ")
    assert row.plan is not None and {s.tp for s in row.plan.stages} == {1}
    cnn = compare(_profile(), _cluster(), strategies=["megatron"]).get("megatron")
    assert not cnn.fits and "transformer blocks" in (cnn.reason or "")


def test_megatron_row_names_the_uneven_stages_it_ran() -> None:
    """A head as slow as three blocks: Megatron's even cut of 6 blocks on 2 ranks (3 and 3) leaves the last rank
    twice the first's work; --decoder-first/last-pipeline-num-layers 4 and 2 even them, and the row's setting
    says so, as the options to run it again."""
    import dataclasses

    from tests.test_export_torchtitan import llama_profile

    profile = llama_profile(6, heads=16, kv_heads=8)
    head = dataclasses.replace(profile.layers[-1], forward_s=3e-3, backward_s=6e-3)
    profile = dataclasses.replace(profile, layers=(*profile.layers[:-1], head))
    row = compare(profile, _cluster(1, 2), strategies=["megatron"], microbatches=8).get("megatron")
    flags = "--decoder-first-pipeline-num-layers 4 --decoder-last-pipeline-num-layers 2"
    assert (row.setting, row.flags) == ("tp=1 in a server, pp, dp the rest", flags)
    assert row.to_dict()["flags"] == flags and {s["flags"] for s in row.to_dict()["settings"]} >= {"", flags}
    assert row.plan is not None and [s.layers for s in row.plan.stages] == [(0, 5), (5, 8)]
    layouts = bl.megatron_layouts(profile, _cluster(1, 2), (8,), tp=1)
    assert isinstance(layouts, list) and layouts[1].config == "1-1" and layouts[1].flags == ""
    even = judge(layouts[1].plan(profile, _cluster(1, 2), 8, row.plan.optimizer))
    assert row.iteration_s is not None and row.iteration_s < 0.9 * even.prediction.iteration_s


def test_megatron_row_takes_its_interleaved_schedule_where_that_is_its_best() -> None:
    """Megatron-LM's interleaved schedule is one of its settings (SC'21 section 2.2): where the model must be
    pipelined (12 blocks of 400 MB do not fit one tensor group of 2 GB GPUs), its smaller bubble wins."""
    import dataclasses

    from tests.test_export_torchtitan import llama_profile

    profile = llama_profile(12, heads=16, kv_heads=8)
    layers = tuple(dataclasses.replace(layer, param_count=10**8, param_bytes=4 * 10**8) if layer.block else layer
                   for layer in profile.layers)
    row = compare(dataclasses.replace(profile, batch_size=64, layers=layers), _cluster(4, 4, 2 * 10**9),
                  strategies=["megatron"]).get("megatron")
    by_label = {s.setting: s for s in row.settings}
    label = "tp=4 in a server, pp, dp the rest"
    plain, chunked = by_label[label], by_label[f"{label}, interleaved schedule"]
    assert chunked.iteration_s is not None and plain.iteration_s is not None
    assert chunked.iteration_s < plain.iteration_s and chunked.schedule == "interleaved"
    assert chunked.microbatches is not None and chunked.microbatches % 4 == 0  # a multiple of pp 4
    # the row is the best of every tensor degree's settings (here tp 2 on 8 stages, 1F1B)
    assert row.iteration_s is not None and row.iteration_s <= chunked.iteration_s
    doc = row.to_dict()  # the JSON says how many chunks, so that the setting can be run again
    assert doc["virtual_stages"] == row.plan.virtual_stages if row.plan is not None else True
    chunks = {s["setting"]: s["virtual_stages"] for s in doc["settings"]}
    assert chunks[label] == 1 and chunks[f"{label}, interleaved schedule"] == 2
    assert chunked.flags == ("--decoder-first-pipeline-num-layers 2 --decoder-last-pipeline-num-layers 2 "
                             "--num-virtual-stages-per-pipeline-rank 2")  # 2, 4, 4, 2 blocks: the ends are lighter


def test_pipedream_row_takes_the_readme_setting_when_the_default_cuts_a_huge_activation() -> None:
    # layer 1 emits 8 GB; PipeDream's default cuts right after it, across 10 Gbit/s
    doc = make_profile_dict(4)
    for layer, out in zip(doc["layers"], [1e3, 8e9, 1e3, 1e3], strict=True):
        layer.update(forward_s=1 / 3, backward_s=2 / 3, param_bytes=10**9, output_bytes=int(out))
    cluster_doc = make_cluster_dict(2, 1, memory_bytes=10**12)
    cluster_doc["links"]["inter_node"]["bandwidth_Bps"] = 1.25e9
    result = compare(ir.ModelProfile.from_dict(doc), ir.Cluster.from_dict(cluster_doc), strategies=["pipedream"])
    row = result.get("pipedream")
    assert row.setting == "--activation_compression_ratio 1" and row.iteration_s is not None
    default = [s.iteration_s for s in row.settings if s.setting.startswith("activations not counted")]
    assert default and all(t is not None and row.iteration_s < t / 2 for t in default)


@pytest.mark.parametrize(("options", "match"), [({"optimizer": "x"}, "unknown optimizer 'x'"),
                                                ({"optimizer": None}, "unknown optimizer None"),
                                                ({"schedule": "x"}, "unknown schedule 'x'"),
                                                ({"strategies": None}, "strategies must be a list"),
                                                ({"strategies": "dp"}, "strategies must be a list"),
                                                ({"rerank": -1}, "candidates must be a whole number"),
                                                ({"rerank": True}, "candidates must be a whole number"),
                                                ({"progress": "x"}, "progress must be a function")])
def test_a_library_callers_option_of_the_wrong_kind_is_a_usage_error(options: dict[str, object], match: str) -> None:
    """They were KeyErrors and TypeErrors, or accepted (a schedule 'x' ran every row)."""
    with pytest.raises(UsageError, match=match):
        compare(ir.ModelProfile.from_dict(make_profile_dict(4)), ir.Cluster.from_dict(make_cluster_dict(1, 2)),
                **options)  # type: ignore[arg-type]


def test_a_rows_engines_are_those_in_whose_own_memory_its_plan_fits() -> None:
    """Every row is judged for no engine; an engine's buffers and copies (DeepSpeed's flat gradient copy, autograd's
    accumulation) can overflow it: a DeepSpeed-parameters row once said fits with engines [deepspeed] where
    DeepSpeed needed 1.2 MB of a 1 MB GPU (a reviewer's find). Its engines are those whose memory it fits."""
    from planner.costmodel import plan_memory

    profile = ir.ModelProfile.from_dict(make_profile_dict(4, batch_size=8))
    row = next(s for s in compare(profile, ir.Cluster.from_dict(make_cluster_dict(2, 2)), optimizer="adam",
                                  microbatches=4, strategies=["deepspeed-parameters"]).strategies)
    assert row.plan is not None and row.engines == ["deepspeed", "torch"]
    bare, own = (max(plan_memory(dataclasses.replace(row.plan, engine=e))) for e in ("any", "deepspeed"))
    assert bare < own
    tight = ir.Cluster.from_dict(make_cluster_dict(2, 2, memory_bytes=(bare + own) // 2))
    squeezed = dataclasses.replace(row, plan=dataclasses.replace(row.plan, cluster=tight))
    assert squeezed.engines == []
    assert dataclasses.replace(row, plan=dataclasses.replace(row.plan, cluster=ir.Cluster.from_dict(
        make_cluster_dict(2, 2, memory_bytes=own)))).engines == ["deepspeed", "torch"]

"""The search's options: bad values are clear errors with the numbers; fixed values shape every stage."""

from __future__ import annotations

import dataclasses

import pytest

from planner import ir
from planner.cluster import cluster_from_dict
from planner.errors import PlannerError, UsageError
from planner.runnable import problems
from planner.search import search
from planner.search.options import resolve_virtual_stages
from tests.conftest import make_cluster_dict, make_profile_dict


def _llama_like(n_blocks: int = 4, heads: int = 8, kv: int = 4, batch: int = 16) -> ir.ModelProfile:
    d = make_profile_dict(n_blocks, batch_size=batch)
    for layer in d["layers"]:
        layer.update(in_features=512, out_features=512, param_count=3_000_000, param_bytes=12_000_000,
                     block={"hidden": 512, "heads": heads, "kv_heads": kv, "ffn": 2048, "seq_len": 256})
    return ir.ModelProfile.from_dict(d)


def _cluster(nodes: int = 2, gpus: int = 4, mem: int = 10**10) -> ir.Cluster:
    return cluster_from_dict(make_cluster_dict(nodes, gpus, mem))


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"tp": 8}, "largest server of .* has 4 GPUs"),
    ({"tp": 3}, "powers of two inside one server"),
    ({"precision": "fp8"}, "unknown precision 'fp8'"),
    ({"recompute": "some"}, "unknown --recompute 'some'"),
    ({"zero": 5}, "unknown --zero 5"),
    ({"engine": "deepspeed", "zero": 3}, "deepspeed runs ZeRO stages 0, 1, not 3"),
    ({"engine": "deepspeed", "tp": 2}, "deepspeed runs no tensor parallelism"),
    ({"engine": "torch", "precision": "fp16"}, "torch trains in fp32, bf16, not fp16"),
    ({"engine": "deepspeed", "schedule": "gpipe"}, "deepspeed runs the schedules 1f1b, not gpipe"),
    ({"engine": "torch", "schedule": "pipedream"}, "torch runs the schedules gpipe, 1f1b, interleaved, zb-h1, not"),
    ({"micro_batch_size": 3}, "--micro-batch-size 3 does not divide the batch size 16"),
    ({"micro_batch_size": 4, "microbatches": 8}, "--microbatches 8 x --micro-batch-size 4"),
    ({"tp": 2, "config": (1, 1)}, r"--tp 2 does not divide the 1 devices of a stage of --config 1-1"),
    ({"tp": 4, "config": (4, 2)}, r"--tp 4 does not divide the 2 devices of a stage of --config 4-2"),
    ({"zero": 1, "config": (1, 1)}, r"--zero 1 shards over two or more data-parallel ranks, and a stage of --config "
                                    r"1-1 has 1 device \("),
    ({"zero": 3, "tp": 2, "config": (2, 4)}, r"a stage of --config 2-4 has 2 devices at --tp 2"),
    # torchtitan builds Adam(W) only: an sgd plan's memory left out its two fp32 states per weight
    ({"engine": "torchtitan"}, r"torchtitan trains with the optimizer adam, not sgd \(the default\)"),
    ({"engine": "torchtitan", "optimizer": "momentum"}, r"adam, not momentum \(pass"),
])
def test_bad_options_are_usage_errors_with_the_numbers(kwargs: dict, match: str) -> None:
    with pytest.raises(UsageError, match=match) as err:
        search(_llama_like(), _cluster(), **kwargs)
    assert err.value.hint and err.value.exit_code == 2


def test_tp_must_divide_heads_and_kv_heads() -> None:
    with pytest.raises(UsageError, match="--tp 4 does not divide the model's 8 attention heads and 2 KV heads"):
        search(_llama_like(kv=2), _cluster(), tp=4)


def test_tp_on_blocks_the_engines_do_not_shard_is_refused_and_auto_keeps_them_whole() -> None:
    profile = _llama_like()
    layers = tuple(dataclasses.replace(x, block=dataclasses.replace(x.block, shardable=False)) if x.block else x
                   for x in profile.layers)
    fused = dataclasses.replace(profile, layers=layers)
    with pytest.raises(UsageError, match="--tp 2: the engines' tensor parallelism does not shard") as err:
        search(fused, _cluster(), tp=2)
    assert "--tp 1 or auto" in err.value.hint
    plan = search(fused, _cluster())
    assert all("tp" not in st.forms for st in plan.stages)


def test_zero_on_a_single_device_is_refused() -> None:
    with pytest.raises(UsageError, match="one GPU"):
        search(_llama_like(), _cluster(1, 1), zero=1)


def test_fixed_options_shape_every_stage_and_plans_run() -> None:
    plan = search(_llama_like(), _cluster(), tp=2, zero=1, recompute="full", precision="bf16", optimizer="adam")
    assert plan.precision == "bf16"
    for st in plan.stages:
        assert (st.tp, st.zero if st.dp > 1 else 1, st.recompute) == (2, 1, "full")
        assert set(st.forms) <= {"tp", "split_in", "split_out", "dp"}
    assert problems(plan) == []


def test_micro_batch_size_fixes_samples_per_rank() -> None:
    plan = search(_llama_like(batch=32), _cluster(), micro_batch_size=2)
    for st in plan.stages:
        assert plan.micro_batch_size(st) == 2
    doc = plan.to_dict()
    assert all(s["micro_batch_size"] == 2 and s["tp"] * s["dp"] == len(s["devices"]) for s in doc["stages"])


def test_no_grid_with_whole_micro_batches_is_a_clear_error() -> None:
    # one stage of 4 data-parallel GPUs (--tp 1) for a batch of 2: half a sample per rank
    with pytest.raises(PlannerError, match="whole micro-batches") as err:
        search(_llama_like(batch=2), _cluster(1, 4), tp=1, config=(4,))
    assert "batch = micro_batch_size x microbatches x dp" in err.value.hint


def test_virtual_stages_default_and_refusal() -> None:
    assert resolve_virtual_stages(None, "interleaved") == 2
    assert resolve_virtual_stages(None, "1f1b") == 1
    with pytest.raises(UsageError, match="needs --schedule interleaved"):
        resolve_virtual_stages(2, "1f1b")


def test_config_width_without_whole_micro_batches_says_so_not_memory() -> None:
    """A --config stage of 3 GPUs (dp 3) never splits a batch of 8: the error names the width, not memory."""
    profile = ir.ModelProfile.from_dict(make_profile_dict(4, batch_size=8))
    with pytest.raises(PlannerError, match=r"--config 3-1: no stage of \[3\] GPUs gives its data-parallel ranks "
                                           r"whole micro-batches of the batch of 8") as err:
        search(profile, _cluster(1, 4), config=(3, 1))
    assert "memory" not in str(err.value)


@pytest.mark.parametrize("engine", ["any", "torch"])
@pytest.mark.parametrize("zero", [1, 2, 3])
def test_a_fixed_zero_stage_is_honoured_on_data_parallel_ranks(engine: str, zero: int) -> None:
    """--zero N shards over two or more data-parallel ranks: the plan runs it, never a grid of one rank at ZeRO 0."""
    profile = ir.ModelProfile.from_dict(make_profile_dict(4, batch_size=16)) if engine == "torch" else _llama_like()
    plan = search(profile, _cluster(1, 4), engine=engine, zero=zero, candidates=2)
    assert plan.stages and all(s.zero == zero and s.dp >= 2 for s in plan.stages)
    with pytest.raises(PlannerError, match=f"--zero {zero} shards over two or more data-parallel ranks, and at --tp 4"):
        search(profile, _cluster(1, 4), engine=engine, zero=zero, tp=4, candidates=2)


def test_an_engine_whose_schedule_needs_a_micro_batch_per_stage_is_searched_for_at_most_m_stages() -> None:
    """16 layers of slow-to-reduce weights on 2 x 8 GPUs: the fastest plans pipeline every layer, which torch's
    Schedule1F1B refuses at 2 micro-batches; the search bounds the stages by M and finds the best it runs (the
    16 best plans found used to break that limit, and the search failed)."""
    doc = make_profile_dict(16, batch_size=4)
    for layer in doc["layers"]:
        layer.update(param_bytes=400_000_000, param_count=100_000_000)
    profile = ir.ModelProfile.from_dict(doc)
    cdoc = make_cluster_dict(2, 8, 10**11)
    cdoc["links"]["intra_node"]["bandwidth_Bps"] = 1e9
    cluster = cluster_from_dict(cdoc)
    assert search(profile, cluster, microbatches=2, candidates=4).pipeline_stages == 16  # any engine: every layer
    for engine, schedule in (("torch", "1f1b"), ("torch", "gpipe")):
        plan = search(profile, cluster, microbatches=2, engine=engine, schedule=schedule, candidates=4)
        assert problems(plan, engine) == []
        assert plan.pipeline_stages <= 2 or schedule == "gpipe"  # torch's GPipe runs fewer micro-batches than stages
    assert search(profile, cluster, microbatches=2, engine="deepspeed", candidates=4).pipeline_stages > 2


def test_when_the_bound_on_stages_leaves_nothing_that_fits_the_error_says_so() -> None:
    """Each GPU holds a quarter of the model: 4 stages or more fit, and torch's 1F1B at 2 micro-batches runs 2."""
    from planner.errors import InfeasibleError

    doc = make_profile_dict(8, batch_size=4)
    for layer in doc["layers"]:
        layer.update(param_bytes=40_000_000, param_count=10_000_000)
    profile = ir.ModelProfile.from_dict(doc)
    cluster = _cluster(1, 8, 300_000_000)
    assert search(profile, cluster, microbatches=2, candidates=2).pipeline_stages >= 4
    with pytest.raises(InfeasibleError) as err:
        search(profile, cluster, microbatches=2, engine="torch", candidates=2)
    assert "on at most 2 stages" in err.value.hint and "more --microbatches" in err.value.hint
    assert search(profile, cluster, microbatches=4, engine="torch", candidates=2).pipeline_stages <= 4


def _tensor_groups_cross_servers(cluster: ir.Cluster, devices: tuple[str, ...], tp: int) -> bool:
    server = {g.name: n.name for n in cluster.nodes for g in n.gpus}
    return any(len({server[d] for d in devices[i:i + tp]}) > 1 for i in range(0, len(devices), tp))


@pytest.mark.parametrize(("mode", "config"), [("hierarchy", None), ("contiguous", (3, 6, 3))])
def test_every_tensor_group_stays_inside_one_server_of_six(mode: str, config: tuple[int, ...] | None) -> None:
    """Servers of 6 GPUs: two whole servers hold 6 + 6, which tp 4 cuts into n0.g4-g5 + n1.g0-g1; a stage of
    n0.g3 .. n1.g2 holds 3 + 3, which tp 2 cuts into n0.g5 + n1.g0. No move of the search runs such a grid (its
    tensor all-reduces would cross the network at NVLink's price), and the plans it emits keep every tensor group
    inside a server."""
    from planner.search.sp import build_problem

    cluster, profile = _cluster(2, 6), _llama_like(batch=48)
    prob = build_problem(profile, cluster, microbatches=4, schedule="1f1b", optimizer="adam", mode=mode,
                         config=config, widths=config)
    moves = [mv for row in prob.moves for mv in row]
    assert moves and not [(mv.devices, mv.tp) for mv in moves if _tensor_groups_cross_servers(cluster, mv.devices,
                                                                                              mv.tp)]
    plan = search(profile, cluster, tp=4)
    assert not [st for st in plan.stages if _tensor_groups_cross_servers(cluster, st.devices, st.tp)]


def test_a_model_with_batch_norms_gets_no_tensor_group_under_an_engine() -> None:
    """A batch norm's samples are not split over a tensor group by any engine (planner.runnable.FormRules): --tp 2
    under the torch engine is a usage error naming the layers, and auto keeps every stage holding one at tp 1."""
    d = make_profile_dict(4, batch_size=16)
    for layer in d["layers"]:
        layer.update(in_features=512, out_features=512)
    d["layers"][1]["batch_stats"] = True
    profile, cluster = ir.ModelProfile.from_dict(d), _cluster(1, 4)
    with pytest.raises(UsageError, match=r"--tp 2: 1 layer \(l1\) hold batch norms"):
        search(profile, cluster, engine="torch", tp=2)
    plan = search(profile, cluster, engine="torch", microbatches=4)
    assert all(st.tp == 1 for st in plan.stages if st.layers[0] <= 1 < st.layers[1])
    assert problems(plan, "torch") == []


def _with_embedding(batch: int = 16) -> ir.ModelProfile:
    """_llama_like's blocks after an embedding (a weight of unknown shape: no split form holds it)."""
    d = _llama_like(batch=batch).to_dict()
    emb = {**d["layers"][0], "name": "embed", "type": "Embedding", "in_features": None, "out_features": None}
    emb.pop("block", None)
    d["layers"] = [emb, *d["layers"]]
    return ir.ModelProfile.from_dict(d)


def test_a_micro_batch_the_tensor_group_cannot_split_names_the_layer_that_needs_it() -> None:
    """The embedding runs only the dp form in a tensor group, which splits the samples: one sample does not split
    over 4 devices, and the error says so (it blamed the batch's divisors)."""
    with pytest.raises(UsageError, match=r"--micro-batch-size 1 with --tp 4: 1 layer \(embed\) takes no sharded form "
                                         r"under --engine torch, so a tensor group splits its samples") as err:
        search(_with_embedding(), _cluster(), engine="torch", tp=4, micro_batch_size=1)
    assert "(4, 8, ...)" in (err.value.hint or "")
    plan = search(_with_embedding(), _cluster(), engine="torch", tp=4, micro_batch_size=4)
    assert {st.tp for st in plan.stages} == {4} and problems(plan) == []


def test_the_library_takes_config_as_text_or_widths_and_refuses_anything_else() -> None:
    """``config="1-1"`` (the CLI's text) was a TypeError inside the search."""
    text = search(_llama_like(), _cluster(1, 2), config="1-1", microbatches=2)
    widths = search(_llama_like(), _cluster(1, 2), config=(1, 1), microbatches=2)
    assert [s.devices for s in text.stages] == [s.devices for s in widths.stages] and len(text.stages) == 2
    for bad, match in [("1-x", "not in PipeDream notation"), ((1, 0), "not a sequence of devices per stage"),
                       ((1.5, 1), "not a sequence"), ((), "not a sequence"), ((True, 1), "not a sequence")]:
        with pytest.raises(UsageError, match=match):
            search(_llama_like(), _cluster(1, 2), config=bad)  # type: ignore[arg-type]


def test_the_searchs_hooks_are_checked_where_the_search_reads_them() -> None:
    """planner.search.search itself (not only the api's search_plan) refuses hooks of the wrong kind."""
    for kwargs, match in [({"evaluate": 1}, "evaluate must be a function"), ({"candidates": -1}, "candidates must"),
                          ({"progress": "x"}, "progress must be a function"),
                          ({"alternatives": ()}, "alternatives must")]:
        with pytest.raises(UsageError, match=match):
            search(_llama_like(), _cluster(), **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("engine", "option", "match"), [
    ("torch", {"zero": 3}, r"--engine torch runs ZeRO stages 0, 1, 2 under zb-h1's split backward, not 3"),
    ("torch", {"recompute": "selective"}, r"runs recomputation none, full under zb-h1's split backward"),
])
def test_a_fixed_value_zb_h1s_split_backward_refuses_is_a_usage_error(engine: str, option: dict, match: str) -> None:
    """A fixed --zero or --recompute the engine runs, but not under zb-h1's split backward (planner.runnable), is
    bad usage (exit 2) up front, not a search that ends in 'no plan fits' (exit 3) even on GPUs of 1 TB."""
    profile = ir.ModelProfile.from_dict(make_profile_dict(4))
    cluster = cluster_from_dict(make_cluster_dict(1, 2, 10**12))
    with pytest.raises(UsageError, match=match):
        search(profile, cluster, engine=engine, schedule="zb-h1", **option)



def test_a_fixed_zero_stage_with_a_tp_that_leaves_one_data_parallel_rank_is_refused_for_what_it_is() -> None:
    """--tp 4 --zero 1 on 4 GPUs: every stage has one data-parallel rank, nothing to shard (the search blamed the
    batch's divisors, and hinted at another batch size, which cannot help)."""
    with pytest.raises(UsageError, match=r"--zero 1 shards over two or more data-parallel ranks, and at --tp 4 a "
                                         r"stage of all 4 GPUs has 1") as err:
        search(_llama_like(), _cluster(1, 4), tp=4, zero=1)
    assert "smaller --tp" in err.value.hint
    assert search(_llama_like(), _cluster(1, 4), tp=2, zero=1).stages[0].zero == 1  # 2 ranks: it shards


def test_torchtitan_without_sequence_parallelism_runs_tp_1_and_refuses_a_larger_tp() -> None:
    """torchtitan's Llama shards its norms over the sequence under tensor parallelism: --no-sequence-parallel
    leaves it tp 1 (a fixed --tp 2 is refused up front; the search refused every plan it found, and its hint
    pointed at the config or the cluster)."""
    from tests.test_export_torchtitan import llama_profile

    cluster = _cluster(1, 2)
    with pytest.raises(UsageError, match="--engine torchtitan --tp 2 --no-sequence-parallel") as err:
        search(llama_profile(4), cluster, engine="torchtitan", optimizer="adam", tp=2, sequence_parallel=False)
    assert "drop --no-sequence-parallel" in err.value.hint
    plan = search(llama_profile(4), cluster, engine="torchtitan", optimizer="adam", sequence_parallel=False)
    assert all(s.tp == 1 for s in plan.stages)

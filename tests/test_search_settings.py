"""search.settings: every documented setting of a baseline, named, with its layouts or the reason it cannot run."""

from __future__ import annotations

import pytest

from planner import ir
from planner.judge import judge
from planner.search import baselines as bl
from planner.search.settings import Setting, strategy_settings
from tests.conftest import make_cluster_dict, make_profile_dict
from tests.test_baselines import _pc
from tests.test_search_megatron import _shaped_llama


@pytest.mark.parametrize("name", [s for s in bl.STRATEGIES if s != "planner"])
def test_every_baseline_has_named_settings_with_layouts_or_a_reason(name: str) -> None:
    profile, cluster = _pc(16)
    found = strategy_settings(name, profile, cluster, (1, 2, 4), "sgd")
    assert found and len({(s.label, tuple(lay.schedule for lay in s.layouts)) for s in found}) == len(found)
    for setting in found:
        assert setting.label and (setting.layouts or setting.reason)
        for layout in setting.layouts:
            assert layout.schedule in ("1f1b", "gpipe", "pipedream")
            plan = layout.plan(profile, cluster, layout.microbatches[0], "sgd")
            assert [s.tp for s in plan.stages] == [layout.tp] * len(plan.stages)


def test_deepspeed_and_megatron_also_run_with_zero_stage_1_where_a_stage_has_data_parallel_ranks() -> None:
    # DeepSpeed's pipeline engine runs ZeRO stage 1; Megatron-LM's --use-distributed-optimizer is ZeRO-1
    cluster = ir.Cluster.from_dict(make_cluster_dict(2, 4))
    labels = [s.label for s in strategy_settings("deepspeed", _shaped_llama(), cluster, (2,), "adam")]
    assert "partition_method=parameters" in labels and "partition_method=parameters, ZeRO stage 1" in labels
    megatron = strategy_settings("megatron", _shaped_llama(), cluster, (2,), "adam")
    base = "tp=4 in a server, pp, dp the rest"
    lean = f"{base}, selective recomputation + sequence parallel"
    assert [s.label for s in megatron][:4] == [base, f"{base}, distributed optimizer", lean,
                                               f"{lean}, distributed optimizer"]
    sharded = megatron[1]
    assert sharded.layouts and all(lay.zero == 1 and lay.data_parallel for lay in sharded.layouts)
    # the 2-stage layout has dp 1 per stage (4 GPUs, tp 4): nothing to shard, so it is not a ZeRO-1 layout
    assert {lay.config for lay in sharded.layouts} == {"8"}
    plan = sharded.layouts[0].plan(_shaped_llama(), cluster, 2, "adam")
    assert [(s.dp, s.zero) for s in plan.stages] == [(2, 1)]


def test_a_zero_1_layout_keeps_zero_0_on_stages_without_data_parallel_ranks() -> None:
    profile = ir.ModelProfile.from_dict(make_profile_dict(4, batch_size=16))
    cluster = ir.Cluster.from_dict(make_cluster_dict(1, 3))
    devices = [g.name for g in cluster.gpus]
    layout = bl.Layout("deepspeed", (((0, 2), tuple(devices[:2]), ("dp",) * 2), ((2, 4), (devices[2],), ("dp",) * 2)),
                       "1f1b", (2,), zero=1)
    plan = layout.plan(profile, cluster, 2, "adam")
    assert [(s.dp, s.zero) for s in plan.stages] == [(2, 1), (1, 0)]
    assert judge(plan).plan.predicted.iteration_s > 0


def test_zero_1_saves_the_optimizer_state_that_decides_whether_a_baseline_fits() -> None:
    # Adam's 8 bytes of state per parameter: sharded over 4 ranks it fits where ZeRO-0 does not
    doc = make_profile_dict(4, batch_size=16)
    for layer in doc["layers"]:
        layer.update(param_count=250_000_000, param_bytes=1_000_000_000, saved_bytes=1000, output_bytes=1000)
    profile = ir.ModelProfile.from_dict(doc)
    cluster = ir.Cluster.from_dict(make_cluster_dict(1, 4, memory_bytes=12 * 10**9))
    plain = Setting.of("dp over 4", bl.Layout("deepspeed", (((0, 4), tuple(g.name for g in cluster.gpus),
                                                             ("dp",) * 4),), "1f1b", (1,)))
    sharded = plain.sharded("dp over 4, ZeRO stage 1")
    assert sharded is not None
    fits = [judge(s.layouts[0].plan(profile, cluster, 1, "adam")).fits for s in (plain, sharded)]
    assert fits == [False, True]
    one_rank = Setting.of("one rank", bl.Layout("deepspeed", (((0, 4), ("n0.g0",), ("dp",) * 4),), "1f1b", (1,)))
    assert one_rank.sharded("one rank, ZeRO stage 1") is None


def test_megatron_runs_selective_recomputation_with_sequence_parallelism_as_its_large_model_examples_do() -> None:
    # Korthikanti et al. 2022 (--recompute-activations --sequence-parallel): each block keeps all but the
    # attention core, its norms and dropout sharded over the sequence; less memory than no recomputation
    cluster = ir.Cluster.from_dict(make_cluster_dict(2, 4))
    settings = {s.label: s for s in strategy_settings("megatron", _shaped_llama(), cluster, (2,), "adam")}
    lean = settings["tp=4 in a server, pp, dp the rest, selective recomputation + sequence parallel"]
    plan = lean.layouts[1].plan(_shaped_llama(), cluster, 2, "adam")
    assert [(s.tp, s.recompute, s.sequence_parallel) for s in plan.stages] == [(4, "selective", True)] * 2
    plain = settings["tp=4 in a server, pp, dp the rest"].layouts[1].plan(_shaped_llama(), cluster, 2, "adam")
    assert [(s.recompute, s.sequence_parallel) for s in plain.stages] == [("none", False)] * 2
    lean_mem = judge(plan).plan.predicted.peak_memory_bytes
    assert 0 < lean_mem < judge(plain).plan.predicted.peak_memory_bytes


def test_megatron_runs_every_tensor_degree_of_a_server_each_plain_and_interleaved() -> None:
    """Every --tensor-model-parallel-size that divides a server and the heads (4, 2, 1 on servers of 4 GPUs, 16
    heads, 8 KV heads), each under 1F1B and, on 2 stages of 6 blocks, interleaved (Megatron-LM runs pp 2 with its
    default --overlap-p2p-comm); at tp 1 Megatron turns sequence parallelism off, and the label says so."""
    cluster = ir.Cluster.from_dict(make_cluster_dict(2, 4))
    found = strategy_settings("megatron", _shaped_llama(), cluster, (2,), "adam")
    labels = [s.label for s in found]
    for tp in (4, 2, 1):
        base = f"tp={tp} in a server, pp, dp the rest"
        lean = f"{base}, selective recomputation" + (" + sequence parallel" if tp > 1 else "")
        assert {base, lean, f"{base}, interleaved schedule"} <= set(labels)
        assert all(lay.tp == tp for s in found if s.label.startswith(f"tp={tp} ") for lay in s.layouts)
    assert labels.index("tp=4 in a server, pp, dp the rest") == 0  # SC'21's recipe first
    chunked = next(s for s in found if s.label == "tp=4 in a server, pp, dp the rest, interleaved schedule")
    # 6 blocks: 3 a rank in chunks of 1 (v 3), or 2 and 4 a rank in chunks of 1 and 2 (v 2, uneven ends)
    assert [(lay.config, lay.virtual_stages) for lay in chunked.layouts] == [("4-4", 2), ("4-4", 2), ("4-4", 3)]
    tp1 = [lay for s in found if s.label.startswith("tp=1 ") for lay in s.layouts]
    assert not any(lay.plan(_shaped_llama(), cluster, 2, "adam").stages[0].sequence_parallel for lay in tp1)


def test_pipedream_runs_each_activation_mode_with_each_of_its_shape_flags() -> None:
    """--straight_pipeline (a stage per GPU) and --use_fewer_machines, each named in the setting; a straight
    pipeline on more GPUs than layers cannot run, and says why."""
    profile, cluster = _pc(16)
    found = {s.label: s for s in strategy_settings("pipedream", profile, cluster, (1, 2), "sgd")}
    assert len(found) == 8
    straight = found["activations not counted (default), --straight_pipeline"].layouts[0]
    assert straight.config == "1-1-1-1-1-1-1-1"
    assert "--activation_compression_ratio 1, --straight_pipeline --use_fewer_machines" in found
    few, _ = _pc(5)
    short = {s.label: s for s in strategy_settings("pipedream", few, cluster, (1,), "sgd")}
    refused = short["activations not counted (default), --straight_pipeline"]
    assert not refused.layouts and "8 GPUs" in (refused.reason or "") and "5 layers" in (refused.reason or "")
    assert short["activations not counted (default), --straight_pipeline --use_fewer_machines"].layouts

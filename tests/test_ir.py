"""ir: contract JSON round trips and field validation."""

from __future__ import annotations

import contextlib
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.errors import FormatError
from planner.ir import BatchTimes, Cluster, Link, ModelProfile, Node, Plan, Prediction, Stage
from tests.conftest import make_cluster_dict, make_profile_dict


def test_contract_only_profile_loads_and_round_trips() -> None:
    profile = ModelProfile.from_dict(make_profile_dict())
    assert len(profile.layers) == 4 and not profile.layers[0].splittable
    again = ModelProfile.from_dict(profile.to_dict())
    assert again == profile
    assert profile.param_count == 1_000_000


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: d.update(kind="plan"), "'kind' is 'plan'"),
        (lambda d: d.update(version=2), "'version' is 2"),
        (lambda d: d.pop("layers"), "missing field 'layers'"),
        (lambda d: d["layers"][1].update(forward_s=-1.0), "layers[1].forward_s"),
        (lambda d: d["layers"][0].update(param_bytes=math.nan), "param_bytes"),
        (lambda d: d.update(batch_size=0), "batch_size must be a positive"),
        (lambda d: d.update(layers=[]), "non-empty list"),
        (lambda d: d.update(dtype="int8"), "dtype 'int8' is not a floating-point dtype"),
        (lambda d: d.update(dtype="float99"), "dtype 'float99'"),
        (lambda d: d.update(mode="guessed"), "mode 'guessed' is neither of measured, analytic"),
    ],
)
def test_bad_profile_names_field_and_value(mutate: Any, needle: str) -> None:
    doc = make_profile_dict()
    mutate(doc)
    with pytest.raises(FormatError) as info:
        ModelProfile.from_dict(doc)
    assert needle in str(info.value)


def test_cluster_round_trip_and_duplicate_names() -> None:
    cluster = Cluster.from_dict(make_cluster_dict())
    assert Cluster.from_dict(cluster.to_dict()) == cluster
    assert len(cluster.gpus) == 4
    assert cluster.link("inter_node").bandwidth_Bps == 1e9
    doc = make_cluster_dict()
    doc["nodes"][1]["gpus"][0]["name"] = "n0.g0"
    with pytest.raises(FormatError, match="unique"):
        Cluster.from_dict(doc)


def test_duplicate_node_names_are_refused_where_a_plan_embeds_its_cluster() -> None:
    """A plan's cluster is read by ir alone (not planner.cluster.load_cluster): two servers of one name would
    be one server to export and run (ranks map to servers by name), a 2 x 2 cluster exported as 4 ranks on one."""
    doc = make_cluster_dict()
    doc["nodes"][1]["name"] = "n0"
    with pytest.raises(FormatError, match=r"node names must be unique.*'n0'"):
        Cluster.from_dict(doc)
    profile = ModelProfile.from_dict(make_profile_dict())
    stages = (Stage((0, 2), ("n0.g0", "n0.g1"), ("dp",) * 2, 1), Stage((2, 4), ("n1.g0", "n1.g1"), ("dp",) * 2, 1))
    plan = Plan(profile, Cluster.from_dict(make_cluster_dict()), "1f1b", 2, "sgd", stages,
                Prediction(1.0, 8.0, 0.2, 1), 2.0, 2.0).to_dict()
    plan["cluster"]["nodes"][1]["name"] = "n0"
    with pytest.raises(FormatError, match="node names must be unique"):
        Plan.from_dict(plan)


def test_cluster_zero_bandwidth_is_refused() -> None:
    doc = make_cluster_dict()
    doc["links"]["inter_node"]["bandwidth_Bps"] = 0
    with pytest.raises(FormatError, match="bandwidth_Bps must be a positive"):
        Cluster.from_dict(doc)


def test_link_alpha_beta() -> None:
    link = Link(bandwidth_Bps=1e9, latency_s=1e-4)
    assert link.transfer_s(0) == 0.0
    assert link.transfer_s(1e9) == pytest.approx(1.0001)


def test_a_links_collectives_bandwidths_default_to_its_own_and_round_trip() -> None:
    link = Link(1e9, 1e-4)
    assert (link.allreduce_Bps, link.allgather_Bps) == (1e9, 1e9) and link.to_dict() == {"bandwidth_Bps": 1e9,
                                                                                          "latency_s": 1e-4}
    bus = Link(1e9, 1e-4, 4e8, 2e8)
    assert (bus.allreduce_Bps, bus.allgather_Bps) == (4e8, 2e8)
    assert bus.transfer_s(1e9) == pytest.approx(1.0001)  # point to point: its own bandwidth
    assert Link.from_dict(bus.to_dict(), "links.intra_node") == bus
    doc = make_cluster_dict()
    doc["links"]["intra_node"]["allgather_bandwidth_Bps"] = -1
    with pytest.raises(FormatError, match="allgather_bandwidth_Bps must be a positive"):
        Cluster.from_dict(doc)


def test_plan_round_trip_and_config() -> None:
    profile = ModelProfile.from_dict(make_profile_dict())
    cluster = Cluster.from_dict(make_cluster_dict())
    stages = (Stage((0, 1), ("n0.g0", "n0.g1"), ("dp",), 123), Stage((1, 4), ("n1.g0",), ("dp",) * 3, 456))
    plan = Plan(profile, cluster, "1f1b", 4, "adam", stages, Prediction(1.0, 8.0, 0.2, 456), 2.0, 2.0)
    assert plan.config == "2-1"
    assert plan.world_size == 3
    doc = plan.to_dict()
    assert doc["config"] == "2-1" and doc["model"] == "toy" and doc["batch_size"] == 8
    assert Plan.from_dict(doc) == plan


def test_stage_forms_must_match_layers() -> None:
    with pytest.raises(FormatError, match="2 forms for 3 layers"):
        Stage.from_dict({"layers": [0, 3], "devices": ["a"], "forms": ["dp", "dp"], "memory_bytes": 1}, "s")
    with pytest.raises(FormatError, match="unknown form"):
        Stage.from_dict({"layers": [0, 1], "devices": ["a"], "forms": ["tensor"], "memory_bytes": 1}, "s")


def test_tp_is_never_inferred_when_a_stage_is_built() -> None:
    # split forms on two devices with tp left at 1: kept as given, and the grid says why it is wrong
    stage = Stage((0, 2), ("a", "b"), ("split_out", "split_in"), 0)
    assert stage.tp == 1 and stage.dp == 2
    problem = stage.grid_problem()
    assert problem is not None and "tp is 1 but the stage has split_in, split_out forms" in problem[0]
    assert "tp=2" in problem[1]
    with pytest.raises(FormatError, match="tp is 1 but the stage has split_in, split_out forms"):
        stage.check("s")
    assert Stage((0, 2), ("a", "b"), ("split_out", "split_in"), 0, tp=2).grid_problem() is None
    assert Stage((0, 2), ("a", "b", "c"), ("dp", "dp"), 0, tp=2).grid_problem() is not None  # 2 does not divide 3
    one = Stage((0, 1), ("a",), ("split_out",), 0).grid_problem()  # its hint named tp=1, the value refused
    assert one is not None and "tp=" not in one[1] and "stage of one device" in one[1]


def test_a_version_1_stage_without_tp_reads_split_forms_over_the_whole_stage() -> None:
    doc = {"layers": [0, 2], "devices": ["a", "b"], "forms": ["split_out", "dp"], "memory_bytes": 1}
    assert Stage.from_dict(doc, "s").tp == 2
    assert Stage.from_dict({**doc, "forms": ["dp", "dp"]}, "s").tp == 1
    with pytest.raises(FormatError, match="tp is 1 but the stage has split_out forms"):
        Stage.from_dict({**doc, "tp": 1}, "s").check("s")


def test_whole_floats_in_lists_read_as_integers_as_in_single_fields() -> None:
    """``batch_size: 32.0`` read as 32, but a stage's ``[0.0, 2]`` was refused as not 'first < end', and a tie's
    layers, tensor counts and shapes as not whole: every integer now reads a whole float alike."""
    doc = {"layers": [0.0, 2.0], "devices": ["a"], "forms": ["dp", "dp"], "memory_bytes": 1}
    assert Stage.from_dict(doc, "s").layers == (0, 2)
    with pytest.raises(FormatError, match=r"s.layers must be \[first, end\), whole numbers .* got \[0.5, 2\]"):
        Stage.from_dict({**doc, "layers": [0.5, 2]}, "s")
    prof = make_profile_dict(input_shape=[16.0], ties=[{**TIE, "layers": [0.0, 3.0]}])
    prof["layers"][0]["tensor_counts"] = [200_000.0, 50_000]
    read = ModelProfile.from_dict(prof)
    assert read == ModelProfile.from_dict(json.loads(json.dumps(read.to_dict())))
    assert (read.input_shape, read.ties[0].layers, read.layers[0].tensor_counts) == ((16,), (0, 3), (200_000, 50_000))
    assert all(type(v) is int for v in (*read.input_shape, *read.ties[0].layers, *read.layers[0].tensor_counts))


def test_fixed_parts_and_memory_bandwidth_round_trip() -> None:
    d = make_profile_dict(2)
    d["layers"][0].update(forward_fixed_s=0.004, backward_fixed_s=0.0)
    prof = ModelProfile.from_dict(d)
    assert (prof.layers[0].forward_fixed_s, prof.layers[0].backward_fixed_s) == (0.004, 0.0)
    assert prof.layers[1].forward_fixed_s is None and "forward_fixed_s" not in prof.layers[1].to_dict()
    assert ModelProfile.from_dict(prof.to_dict()) == prof
    c = make_cluster_dict(1, 2)
    c["nodes"][0]["gpus"][0]["memory_bandwidth_Bps"] = 9e11
    cluster = Cluster.from_dict(c)
    assert cluster.gpus[0].memory_bandwidth_Bps == 9e11 and cluster.gpus[1].memory_bandwidth_Bps is None
    assert "memory_bandwidth_Bps" not in cluster.to_dict()["nodes"][0]["gpus"][1]
    assert Cluster.from_dict(cluster.to_dict()) == cluster


@pytest.mark.parametrize("fixed", [-0.001, 0.5])
def test_fixed_part_outside_the_whole_time_is_refused(fixed: float) -> None:
    d = make_profile_dict(1)
    d["layers"][0]["forward_fixed_s"] = fixed
    with pytest.raises(FormatError, match="forward_fixed_s"):
        ModelProfile.from_dict(d)


def test_replicated_parts_round_trip_and_are_shares_of_the_part_that_grows_with_the_batch() -> None:
    d = make_profile_dict(2)
    fwd, bwd = d["layers"][0]["forward_s"], d["layers"][0]["backward_s"]
    d["layers"][0].update(forward_fixed_s=fwd / 2, forward_replicated_s=fwd / 10, backward_replicated_s=bwd / 4)
    prof = ModelProfile.from_dict(d)
    assert ModelProfile.from_dict(prof.to_dict()) == prof
    assert prof.layers[0].replicated_shares == pytest.approx((0.2, 0.25))  # of fwd - fixed = fwd / 2
    assert prof.layers[1].replicated_shares == (0.0, 0.0) and "forward_replicated_s" not in prof.layers[1].to_dict()


def test_zero_memory_bandwidth_is_refused() -> None:
    c = make_cluster_dict(1, 1)
    c["nodes"][0]["gpus"][0]["memory_bandwidth_Bps"] = 0
    with pytest.raises(FormatError, match="memory_bandwidth_Bps"):
        Cluster.from_dict(c)


def test_loss_time_round_trips_and_is_optional() -> None:
    prof = ModelProfile.from_dict(make_profile_dict(2, loss_s=0.003, loss_fixed_s=0.001))
    assert (prof.loss_s, prof.loss_fixed_s) == (0.003, 0.001)
    assert ModelProfile.from_dict(prof.to_dict()) == prof
    plain = ModelProfile.from_dict(make_profile_dict(2))
    assert plain.loss_s is None and "loss_s" not in plain.to_dict()


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: d["layers"][0].update(forward_fixed_s=0.5), "forward_fixed_s (0.5) must lie in [0, forward_s"),
        (lambda d: d["layers"][0].update(backward_weight_s=0.5), "backward_weight_s (0.5) must lie in [0, backward_s"),
        (lambda d: d["layers"][0].update(forward_replicated_s=0.5), "forward_replicated_s (0.5) must lie in [0, forw"),
        (lambda d: d["layers"][0].update(backward_replicated_s=-1e-3), "backward_replicated_s must be a non-negative"),
        (lambda d: d.update(loss_s=0.1, loss_fixed_s=0.2), "loss_fixed_s (0.2) must lie in [0, loss_s=0.1]"),
    ],
)
def test_a_part_of_a_time_cannot_exceed_the_whole(mutate: Any, needle: str) -> None:
    doc = make_profile_dict()
    mutate(doc)
    with pytest.raises(FormatError) as info:
        ModelProfile.from_dict(doc)
    assert needle in str(info.value)


TIE = {"name": "w", "layers": [0, 3], "param_count": 1000, "param_bytes": 4000}


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"ties": [{**TIE, "layers": [0, 3, 0]}]}, "ties[0].layers lists a layer twice: [0, 3, 0]"),
        ({"ties": [{**TIE, "param_count": 10**6}]}, "ties[0] (1000000 parameters, 4000 bytes) is larger than layer 0"),
        ({"ties": [{**TIE, "layers": [3, 0], "param_bytes": 2 * 10**6}]}, "larger than layer 3 it is counted in"),
        ({"min_batch": 16}, "min_batch 16 is not a batch from 1 to the profile's batch_size 8"),
        ({"layers": [{**make_profile_dict()["layers"][0], "param_bytes": 0}]},
         "layers[0].param_bytes is 0 but param_count is 250000: its weights would take no memory"),
    ],
)
def test_a_profile_files_inconsistent_fields_are_refused_naming_the_file(change: dict[str, Any], needle: str) -> None:
    """Caught on loading, with the file and the field (a tie larger than its layer was a cost-model error naming no
    file; a tie listing a layer twice loaded and charged that layer a tie's gradient buffer)."""
    with pytest.raises(FormatError) as info:
        ModelProfile.from_dict(make_profile_dict(**change), "p.json")
    assert info.value.cause.startswith("p.json: ") and needle in info.value.cause


def test_optional_fields_round_trip() -> None:
    doc = make_profile_dict(loss_s=0.01, loss_fixed_s=0.001)
    doc["layers"][0].update(forward_fixed_s=0.001, backward_fixed_s=0.002, in_features=4, out_features=8)
    profile = ModelProfile.from_dict(doc)
    out = profile.to_dict()
    assert out["loss_fixed_s"] == 0.001 and out["layers"][0]["backward_fixed_s"] == 0.002
    assert "forward_fixed_s" not in out["layers"][1]
    assert ModelProfile.from_dict(out) == profile


def test_a_blocks_shardable_flag_is_written_only_when_false_and_round_trips() -> None:
    doc = make_profile_dict()
    block = {"hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "seq_len": 16}
    doc["layers"][0]["block"] = dict(block)
    doc["layers"][1]["block"] = {**block, "shardable": False}
    profile = ModelProfile.from_dict(doc)
    first, second = profile.layers[0].block, profile.layers[1].block
    assert first is not None and second is not None and first.shardable and not second.shardable
    out = profile.to_dict()
    assert "shardable" not in out["layers"][0]["block"] and out["layers"][1]["block"]["shardable"] is False
    assert ModelProfile.from_dict(out) == profile
    assert (first.splits_over(2), first.splits_over(4), second.splits_over(2), second.splits_over(1)) == (
        True, False, False, True)  # 4 does not divide 2 KV heads; an unshardable block runs on one rank a group
    assert profile.has_blocks and not ModelProfile.from_dict(make_profile_dict()).has_blocks


@pytest.mark.parametrize(("gpus", "concurrent", "share"), [(4, 2.0, 0.5), (2, 2.0, 1.0), (2, 8.0, 1.0), (3, None, 1.0)])
def test_node_core_share_is_each_devices_speed_when_all_compute(gpus: int, concurrent: float | None,
                                                               share: float) -> None:
    doc: dict[str, Any] = {"name": "n", "gpus": [{"name": f"g{i}", "flops": 1e9, "memory_bytes": 10**9}
                                                 for i in range(gpus)]}
    if concurrent is not None:
        doc["concurrent_devices"] = concurrent
    assert Node.from_dict(doc, "n").core_share == share


def _with_batch_times(doc: dict[str, Any], points: list[tuple[int, float, float]]) -> dict[str, Any]:
    for layer in doc["layers"]:
        layer["batch_times"] = [{"batch": b, "forward_s": f, "backward_s": w} for b, f, w in points]
    return doc


def test_batch_times_round_trip_and_are_left_out_when_absent() -> None:
    prof = ModelProfile.from_dict(_with_batch_times(make_profile_dict(2), [(4, 0.006, 0.011), (2, 0.004, 0.007)]))
    assert prof.layers[1].batch_times == (BatchTimes(4, 0.006, 0.011), BatchTimes(2, 0.004, 0.007))
    assert ModelProfile.from_dict(prof.to_dict()) == prof
    assert "batch_times" not in ModelProfile.from_dict(make_profile_dict(2)).to_dict()["layers"][0]


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: _with_batch_times(d, [(8, 0.01, 0.02)]), "each must be below the batch size 8"),
        (lambda d: _with_batch_times(d, [(2, 0.004, 0.007), (4, 0.006, 0.011)]), "largest first"),
        (lambda d: _with_batch_times(d, [(4, 0.006, 0.011), (4, 0.006, 0.011)]), "distinct"),
        (lambda d: d["layers"][0].update(batch_times=[{"batch": 4, "forward_s": 0.006, "backward_s": 0.011}]),
         "layers[1].batch_times are at batches []"),
        (lambda d: _with_batch_times(d, [(4, -0.006, 0.011)]), "batch_times[0].forward_s must be a non-negative"),
        (lambda d: _with_batch_times(d, [(0, 0.006, 0.011)]), "batch_times[0].batch must be a positive integer"),
        (lambda d: d["layers"][0].update(batch_times={"batch": 4}), "batch_times must be a list, got {"),
    ],
)
def test_bad_batch_times_are_refused_with_the_field(mutate: Any, needle: str) -> None:
    doc = make_profile_dict(2)
    mutate(doc)
    with pytest.raises(FormatError) as info:
        ModelProfile.from_dict(doc)
    assert needle in str(info.value)


def test_a_profile_whose_layers_take_no_time_is_refused() -> None:
    doc = make_profile_dict()
    for layer in doc["layers"]:
        layer.update(forward_s=0.0, backward_s=0.0)
    with pytest.raises(FormatError, match="takes 0 s forward and backward: there is no work"):
        ModelProfile.from_dict(doc)
    doc["layers"][-1]["backward_s"] = 1e-6
    assert ModelProfile.from_dict(doc).layers[-1].backward_s == 1e-6


@pytest.mark.parametrize("dtype", ["float32", "torch.bfloat16", "BFloat16", "fp16", "half", "float64"])
def test_every_dtype_name_a_profile_is_made_in_loads(dtype: str) -> None:
    doc = make_profile_dict()
    doc.update(dtype=dtype, mode="measured")
    assert ModelProfile.from_dict(doc).dtype == dtype


def _full_plan_doc() -> dict[str, Any]:
    """A plan document with every optional field set (blocks, batch times, ties, peaks, bus bandwidths)."""
    profile = make_profile_dict()
    profile["layers"][1].update(block={"hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "seq_len": 8,
                                       "gated": True, "attention_saved": False},
                                output_shape=[8, 64], in_features=64, out_features=64)
    for layer in profile["layers"]:
        layer["batch_times"] = [{"batch": 2, "forward_s": layer["forward_s"] / 4,
                                 "backward_s": layer["backward_s"] / 4}]
    profile["ties"] = [{"name": "w", "layers": [0, 3], "param_count": 4, "param_bytes": 16}]
    cluster = make_cluster_dict()
    cluster["nodes"][0]["gpus"][0]["peak_flops"] = {"bf16": 1e12}
    cluster["links"]["intra_node"]["allreduce_bandwidth_Bps"] = 1e9
    stages = (Stage((0, 1), ("n0.g0", "n0.g1"), ("dp",), 123, "selective", 2, 0, True),
              Stage((1, 4), ("n1.g0",), ("dp",) * 3, 456))
    plan = Plan(ModelProfile.from_dict(profile), Cluster.from_dict(cluster), "1f1b", 4, "adam", stages,
                Prediction(1.0, 8.0, 0.2, 456), 2.0, 2.0, engine="torch", precision="bf16")
    doc = plan.to_dict()
    assert Plan.from_dict(doc) == plan
    return doc


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(doc, dict):
        items: list[tuple[Any, Any]] = list(doc.items())
    elif isinstance(doc, list):
        items = list(enumerate(doc))
    else:
        return []
    return [p for key, value in items for p in ((*prefix, key), *_paths(value, (*prefix, key)))]


_HOSTILE = [None, -1, 0, 1.5, math.nan, math.inf, 2**70, "x", "false", "", [], [1], {}, {"a": 1}, True, False]


@given(st.data())
@settings(max_examples=300, deadline=None)
def test_any_field_set_to_any_value_loads_or_says_which_field(data: st.DataObject) -> None:
    """A plan (with its profile and cluster) whose one field, at any depth, is replaced by a hostile value, or
    removed, loads or raises a FormatError; never another exception from the field readers."""
    doc = _full_plan_doc()
    path = data.draw(st.sampled_from(_paths(doc)))
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if data.draw(st.booleans()) and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = data.draw(st.sampled_from(_HOSTILE))
    with contextlib.suppress(FormatError):
        Plan.from_dict(doc)


@pytest.mark.parametrize(("mutate", "needle"), [
    (lambda d: d["profile"]["layers"][1]["block"].update(gated="false"), "block.gated must be true or false"),
    (lambda d: d["stages"][0].update(sequence_parallel=1), "sequence_parallel must be true or false"),
    (lambda d: d["profile"].update(ties="w"), "ties must be a list"),
    (lambda d: d["cluster"]["links"].update(intra_node=3.0), "expected an object"),
    (lambda d: d.update(engine=7), "engine must be a string"),
])
def test_a_value_of_the_wrong_kind_is_named_not_coerced(mutate: Any, needle: str) -> None:
    """"false" is not false, and 1 is not true: a bool field takes a JSON boolean only."""
    doc = _full_plan_doc()
    mutate(doc)
    with pytest.raises(FormatError, match=needle):
        Plan.from_dict(doc)


def test_batch_stats_round_trips_and_is_false_in_older_profiles() -> None:
    doc = make_profile_dict()
    doc["layers"][1]["batch_stats"] = True
    profile = ModelProfile.from_dict(doc)
    assert [x.batch_stats for x in profile.layers] == [False, True, False, False]
    again = profile.to_dict()
    assert again["layers"][1]["batch_stats"] is True and "batch_stats" not in again["layers"][0]
    assert ModelProfile.from_dict(again) == profile
    doc["layers"][1]["batch_stats"] = "yes"
    with pytest.raises(FormatError, match="batch_stats"):
        ModelProfile.from_dict(doc)


def test_a_layers_tensor_counts_round_trip_and_must_add_up_to_its_trainable_parameters() -> None:
    """``tensor_counts`` (each trainable tensor's elements, largest first) is optional, written only when known,
    and refused, naming the field, when its elements do not add up, are not whole or not largest first."""
    doc = make_profile_dict(2)
    doc["layers"][0]["tensor_counts"] = [249_000, 1_000]
    prof = ModelProfile.from_dict(doc)
    assert prof.layers[0].tensor_counts == (249_000, 1_000) and prof.layers[1].tensor_counts == ()
    assert ModelProfile.from_dict(prof.to_dict()) == prof and "tensor_counts" not in prof.to_dict()["layers"][1]
    for bad, says in (([249_000, 999], "add up to 249999"), ([1_000, 249_000], "largest first"),
                      ([250_000.5], "whole numbers"), ([True, 249_999], "whole numbers"), ("250000", "list")):
        doc["layers"][0]["tensor_counts"] = bad
        with pytest.raises(FormatError, match=says) as exc:
            ModelProfile.from_dict(doc)
        assert "tensor_counts" in str(exc.value)
    doc["layers"][0].update(tensor_counts=[1_000], trainable_count=1_000)
    assert ModelProfile.from_dict(doc).layers[0].tensor_counts == (1_000,)


def test_min_batch_round_trips_is_left_out_at_one_and_stays_inside_the_batch() -> None:
    prof = ModelProfile.from_dict(make_profile_dict(2, batch_size=8, min_batch=2))
    assert prof.min_batch == 2 and ModelProfile.from_dict(prof.to_dict()).min_batch == 2
    assert "min_batch" not in ModelProfile.from_dict(make_profile_dict(2, batch_size=8)).to_dict()
    for bad in (0, 9):
        with pytest.raises(FormatError, match="min_batch"):
            ModelProfile.from_dict(make_profile_dict(2, batch_size=8, min_batch=bad))


def test_a_cluster_keeping_a_share_of_memory_free_offers_the_rest_of_every_gpu() -> None:
    cluster = Cluster.from_dict(make_cluster_dict(2, 2, memory_bytes=1000))
    assert cluster.keeping_free(0.0) is cluster
    assert [g.memory_bytes for g in cluster.keeping_free(0.25).gpus] == [750] * 4
    assert cluster.keeping_free(0.25).name == cluster.name and cluster.keeping_free(0.25).links == cluster.links
    for share in (-0.1, 1.0):
        with pytest.raises(FormatError, match="kept free must be in"):
            cluster.keeping_free(share)


def test_a_cluster_records_the_share_of_memory_it_keeps_free_and_reads_it_back() -> None:
    """keeping_free's share travels with the cluster (a plan embeds it), composes, and round-trips; a cluster
    without it writes no key."""
    cluster = Cluster.from_dict(make_cluster_dict(2, 2, memory_bytes=1000))
    assert cluster.memory_kept_free == 0.0 and "memory_kept_free" not in cluster.to_dict()
    kept = cluster.keeping_free(0.1)
    assert kept.memory_kept_free == 0.1 and Cluster.from_dict(kept.to_dict()) == kept
    assert kept.keeping_free(0.5).memory_kept_free == pytest.approx(0.55)
    assert [g.memory_bytes for g in kept.keeping_free(0.5).gpus] == [450] * 4
    with pytest.raises(FormatError, match=r"^c.json: memory_kept_free is 1.0, must be in \[0, 1\)"):
        Cluster.from_dict({**make_cluster_dict(1, 1), "memory_kept_free": 1.0}, "c.json")

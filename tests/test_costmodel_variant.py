"""Closed forms of the grid cost model: ZeRO memory and traffic (ZeRO paper), Korthikanti et al.'s activation
memory per transformer layer (Table 2), Megatron's per-block tensor-parallel communication, mixed precision."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner import costmodel as cm
from planner import ir
from planner.cluster import cluster_from_dict, group_of
from planner.grad_buffers import deepspeed_bucket_params
from planner.runnable import FormRules
from tests.conftest import make_cluster_dict, make_profile_dict

PSI = 7_500_000_000  # the ZeRO paper's 7.5B-parameter example


def _big_cluster(nodes: int = 8, gpus: int = 8) -> ir.Cluster:
    return cluster_from_dict(make_cluster_dict(nodes, gpus, 10**14))


def _one_layer(param_count: int, **extra: object) -> ir.ModelProfile:
    d = make_profile_dict(1, batch_size=64)
    d["layers"][0].update(param_count=param_count, param_bytes=4 * param_count, **extra)
    return ir.ModelProfile.from_dict(d)


@pytest.mark.parametrize(("zero", "gb"), [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_memory_per_device_matches_the_papers_7_5b_example(zero: int, gb: float) -> None:
    # ZeRO (Rajbhandari et al. SC'20), Figure 1 / section 5: Psi = 7.5B, Nd = 64, mixed-precision Adam (K = 12)
    cluster = _big_cluster()
    stage = ir.Stage((0, 1), tuple(g.name for g in cluster.gpus), ("dp",), 0, zero=zero)
    cost = cm.stage_cost_values(_one_layer(PSI), cluster, stage, 1, "adam", None, "bf16")
    assert cost.static_bytes / 1e9 == pytest.approx(gb, abs=0.05)


def test_fp32_adam_is_16_bytes_and_mixed_adam_too_but_sgd_differs() -> None:
    cluster = cluster_from_dict(make_cluster_dict(1, 1, 10**12))
    stage = ir.Stage((0, 1), ("n0.g0",), ("dp",), 0)
    prof = _one_layer(1000)
    static = {(p, o): cm.stage_cost_values(prof, cluster, stage, 1, o, None, p).static_bytes
              for p in ("fp32", "bf16") for o in ("adam", "sgd")}
    assert static == {("fp32", "adam"): 16_000, ("bf16", "adam"): 16_000, ("fp32", "sgd"): 8_000,
                      ("bf16", "sgd"): 8_000}


AGG = {"sync": 2.0, "time": 10.0, "fwd": 4.0, "static0": 0.0, "static1": 0.0, "static2": 0.0, "static3": 0.0,
       "weight": 1.0, "act": 1.0, "act_sel": 0.5, "core": 0.25, "fwd_head": 0.0, "act_head": 0.0, "units": 3.0,
       "grad": 1.0, "wsync": 2.0, "loss_ws": 0.0, "unit_max": 0.0, "loss_gathered": 0.0}
"""A stage's aggregates: an all-reduce A = 2 (so one all-gather or reduce-scatter H = 1), 3 FSDP units; every
weight trains (its gradients ``grad`` are its weights' bytes, ``wsync`` its all-reduce)."""


def test_zero_traffic_per_iteration() -> None:
    # plain all-reduce and ZeRO-1/2: 2 Psi (reduce-scatter + all-gather); ZeRO-3: 3 Psi, per micro-batch
    agg = AGG
    m, const = 4, 0.0
    cost = {z: cm.variant_cost(agg, 0.1, cm.Variant("none", z), m, const) for z in range(4)}
    assert cost[0].sync == cost[1].sync == 2.0
    assert cost[2].sync == pytest.approx(2.0 + (m - 1) * 1.0)  # every later backward reduce-scatters
    assert cost[3].sync == pytest.approx(m * 1.0)
    assert cost[3].fwd == pytest.approx(4.0 + 1.0) and cost[3].time == pytest.approx(10.0 + 2.0)
    # with one micro-batch ZeRO-3 moves 3 Psi against 2 Psi: all-gather forward, backward, reduce-scatter
    one = {z: cm.variant_cost(agg, 0.1, cm.Variant("none", z), 1, const) for z in (0, 3)}
    assert (one[3].sync + one[3].time - agg["time"]) / one[0].sync == pytest.approx(1.5)


def test_torchs_zero1_broadcasts_the_parameters_after_the_all_reduce() -> None:
    """torch's ZeRO-1 (all-reduce, then ZeroRedundancyOptimizer's broadcast from each owner): 3 Psi
    against the paper's 2 Psi; DeepSpeed's ZeRO-1 as the paper has it."""
    cluster = _big_cluster(1, 8)
    assert cm.zero_comms(cluster, "torch").gather_share == 0.5
    deepspeed = cm.zero_comms(cluster, "deepspeed")
    assert (deepspeed.gather_share, deepspeed.sync_last_backward, deepspeed.unit_op_s) == (0.0, False, 0.0)
    assert cm.zero_comms(cluster, "any") == dataclasses.replace(cm.PAPER, prefetch=True)  # GPUs: beside the compute
    torch = cm.variant_cost(AGG, 0.1, cm.Variant("none", 1), 4, 0.0, cm.ZeroComms(gather_share=0.5)).sync
    assert torch == pytest.approx(3.0) and cm.variant_cost(AGG, 0.1, cm.Variant("none", 1), 4, 0.0).sync == 2.0
    stage = ir.Stage((0, 1), tuple(g.name for g in cluster.gpus), ("dp",), 0, zero=1)
    by = {(e, p): cm.stage_cost_values(_one_layer(10**8), cluster, stage, 1, "adam", None, p, engine=e).allreduce_s
          for e in ("torch", "deepspeed") for p in ("fp32", "bf16")}
    assert by["torch", "fp32"] == pytest.approx(1.5 * by["deepspeed", "fp32"], rel=1e-3)
    # in bf16 torch reduces fp32 gradients and broadcasts fp32 parameters, DeepSpeed's ZeRO-1 the bf16 ones
    assert by["torch", "bf16"] == pytest.approx(3.0 * by["deepspeed", "bf16"], rel=1e-2)


def test_zero0_stays_a_choice_where_zero1_moves_more() -> None:
    """ZeRO-0 is dropped for ZeRO-1 only where ZeRO-1 moves the same bytes (the paper's, DeepSpeed's)."""
    paper = {v.zero for v in cm.variants(["none"], (0, 1, 2), 4)}
    torch = {v.zero for v in cm.variants(["none"], (0, 1, 2), 4, cm.ZeroComms(gather_share=0.5))}
    assert paper == {1, 2} and torch == {0, 1, 2}
    assert {v.zero for v in cm.variants(["none"], (0, 1), 1, cm.ZeroComms(gather_share=0.5))} == {0}


@given(st.integers(1, 16), st.floats(0.0, 1e-2), st.sampled_from(["none", "selective", "full"]))
def test_zero3_is_dropped_where_it_holds_zero2s_memory_for_more_time(m: int, op_s: float, mode: str) -> None:
    """An engine that reduces once a step (torch's FSDP under its schedules): ZeRO-3 keeps ZeRO-2's
    memory and gathers again in every backward, so ``variants`` leaves it out beside 2 (not alone)."""
    torch = cm.ZeroComms(0.5, sync_last_backward=True, unit_op_s=op_s)
    two, three = (cm.variant_cost(AGG, 0.1, cm.Variant(mode, z), m, 0.0, torch) for z in (2, 3))
    assert (three.static, three.act, three.workspace) == (two.static, two.act, two.workspace)
    assert three.time >= two.time and three.fwd >= two.fwd
    assert m * three.time + three.sync >= m * two.time + two.sync
    assert {v.zero for v in cm.variants([mode], (0, 1, 2, 3), 4, torch)} == {0, 1, 2}
    assert {v.zero for v in cm.variants([mode], (3,), 4, torch)} == {3}
    assert {v.zero for v in cm.variants([mode], (0, 1, 2, 3), 4)} == {1, 2, 3}  # the paper's ZeRO-3 shards more


@given(st.integers(1, 16), st.floats(0.0, 1e-2))
def test_fsdp_under_a_schedule_that_reduces_after_the_last_backward(m: int, op_s: float) -> None:
    """torch pipelining defers an FSDP module's reduction and resharding to the step's last backward:
    ZeRO-2 moves A (one all-gather, one reduce-scatter) at any M; ZeRO-3 gathers in every backward
    and once more at the first forward. Each unit's collective adds ``unit_op_s``."""
    torch = cm.ZeroComms(0.5, sync_last_backward=True, unit_op_s=op_s)
    two = cm.variant_cost(AGG, 0.1, cm.Variant("none", 2), m, 0.0, torch)
    assert (two.sync, two.time, two.fwd) == pytest.approx((2.0 + 2 * 3 * op_s, 10.0, 4.0))
    three = cm.variant_cost(AGG, 0.1, cm.Variant("none", 3), m, 0.0, torch)
    assert three.time == pytest.approx(10.0 + 1.0 + 3 * op_s) and three.fwd == 4.0
    assert three.gather == pytest.approx(three.time - 10.0) and float(two.gather) == 0.0  # the backward's gather
    assert three.sync == pytest.approx(2 * (1.0 + 3 * op_s))
    # the step's whole traffic: M backward gathers, one forward gather, one reduce-scatter
    assert m * (three.time - 10.0) + three.sync == pytest.approx((m + 2) * (1.0 + 3 * op_s))


def test_fsdp_that_keeps_weights_gathered_holds_zero1s_memory_and_a_sharded_copy() -> None:
    """Under torch pipelining FSDP keeps each unit's gathered weights and unreduced gradients until the
    step's last backward: ZeRO-2 and 3 hold ZeRO-1's memory plus the weights' shard (8-way, Adam fp32:
    W = 4, gradients 4, state 8 bytes a parameter); the paper's shard the gradients (and weights)."""
    cluster = _big_cluster(1, 8)
    stage = {z: ir.Stage((0, 1), tuple(g.name for g in cluster.gpus), ("dp",), 0, zero=z) for z in range(4)}
    prof = _one_layer(10**6)
    by = {(e, z): cm.stage_cost_values(prof, cluster, stage[z], 4, "adam", None, "fp32", engine=e).static_bytes
          for e in ("torch", "any") for z in range(4)}
    mb = 10**6
    assert by["any", 1] == by["torch", 1] == pytest.approx(4 * mb + 4 * mb + 8 * mb / 8, abs=2)
    assert by["any", 2] == pytest.approx(4 * mb + (4 + 8) * mb / 8, abs=2)
    assert by["any", 3] == pytest.approx(16 * mb / 8, abs=2)
    assert by["torch", 2] == by["torch", 3] == pytest.approx(by["torch", 1] + 4 * mb / 8, abs=2)


@given(st.integers(1, 16), st.floats(0.0, 1e-2))
def test_fsdp_per_micro_batch_as_the_paper_with_each_units_collective_cost(m: int, op_s: float) -> None:
    """The paper's ZeRO-2 reduce-scatters every backward and gathers the weights once; ZeRO-3 gathers
    in every forward and backward and reduces every backward: each collective of each unit adds ``unit_op_s``."""
    paper = cm.ZeroComms(unit_op_s=op_s)
    two = cm.variant_cost(AGG, 0.1, cm.Variant("none", 2), m, 0.0, paper)
    assert two.sync == pytest.approx(2.0 + (m - 1) * 1.0 + (1 + m) * 3 * op_s)
    three = cm.variant_cost(AGG, 0.1, cm.Variant("none", 3), m, 0.0, paper)
    assert (three.time, three.fwd) == pytest.approx((10.0 + 2 * (1.0 + 3 * op_s), 4.0 + 1.0 + 3 * op_s))
    assert three.sync == pytest.approx(m * (1.0 + 3 * op_s))
    assert three.gather == pytest.approx(2 * (1.0 + 3 * op_s))  # the forward's and the backward's gathers
    redone = cm.variant_cost(AGG, 0.1, cm.Variant("full", 3), m, 0.0, paper)
    assert redone.gather == three.gather  # the forward redone runs on the backward's gather (FSDP's pre-backward)
    assert redone.time == pytest.approx(three.time + AGG["fwd"])  # and redoes the forward's compute alone
    none = cm.variant_cost(AGG, 0.1, cm.Variant("none", 0), m, 0.0, paper)
    assert none.sync == 2.0  # ZeRO-0's all-reduce has no FSDP units


@given(st.floats(0.0, 20.0), st.floats(0.1, 20.0), st.integers(1, 8), st.integers(1, 8),
       st.sampled_from([2, 3]), st.booleans(), st.sampled_from(["none", "full"]))
def test_prefetched_collectives_add_what_the_compute_cannot_hide(comm: float, fwd: float, units: int, m: int,
                                                              zero: int, last: bool, recompute: str) -> None:
    """Where ZeRO's collectives run beside the compute (FSDP's prefetch on a GPU's own stream), a forward or
    backward takes max(compute + one unit's share, comm): never longer than in turn, as long with one unit
    (nothing to overlap), and the comm itself when it exceeds the compute."""
    agg = {**AGG, "sync": 2.0 * comm, "wsync": 2.0 * comm, "fwd": fwd, "time": 2.5 * fwd, "units": float(units)}
    base = cm.ZeroComms(sync_last_backward=last)
    serial = cm.variant_cost(agg, 0.1, cm.Variant(recompute, zero), m, 0.0, base)
    beside = cm.variant_cost(agg, 0.1, cm.Variant(recompute, zero), m, 0.0, dataclasses.replace(base, prefetch=True))
    per_step = {"serial": m * serial.time + serial.sync, "beside": m * beside.time + beside.sync}
    assert per_step["beside"] <= per_step["serial"] * (1 + 1e-12) + 1e-12
    if units == 1:
        assert per_step["beside"] == pytest.approx(per_step["serial"])
    if zero == 3 and not last and recompute == "none":
        bwd = 1.5 * fwd
        want = max(fwd + comm / units, comm) + max(bwd + 2 * comm / units, 2 * comm)
        assert beside.time == pytest.approx(want) and beside.sync == 0.0
        assert beside.gather == pytest.approx(want - 2.5 * fwd)


def test_overlap_is_for_devices_with_processors_of_their_own() -> None:
    # GPUs run NCCL beside the compute; CPU processes sharing a node's cores (a calibrated cluster) do not
    gpus = _big_cluster(1, 4)
    cpus = dataclasses.replace(gpus, nodes=tuple(dataclasses.replace(n, concurrent_devices=2.0) for n in gpus.nodes))
    assert cm.zero_comms(gpus, "any").prefetch and cm.zero_comms(gpus, "torch").prefetch
    assert not cm.zero_comms(cpus, "any").prefetch and not cm.zero_comms(cpus, "torch").prefetch


def test_a_stage_pays_the_clusters_measured_unit_cost_for_each_layer_with_weights() -> None:
    """``per_shard_s`` in the cluster's torch overheads reaches a ZeRO-2 stage's all-reduce: one
    all-gather and one reduce-scatter per layer with weights; a weightless layer is no FSDP unit."""
    import dataclasses

    d = make_profile_dict(3, batch_size=8)
    d["layers"][1].update(param_count=0, param_bytes=0)
    profile = ir.ModelProfile.from_dict(d)
    base = _big_cluster(1, 4)
    names = tuple(g.name for g in base.gpus)
    stage = ir.Stage((0, 3), names, ("dp",) * 3, 0, zero=2)
    op = 1e-3
    costs = {}
    for shard_s in (0.0, op):
        cluster = dataclasses.replace(base, engine_overheads=(("torch", ir.EngineOverhead(per_shard_s=shard_s)),))
        costs[shard_s] = cm.stage_cost_values(profile, cluster, stage, 2, "sgd", None, engine="torch").allreduce_s
    assert costs[op] - costs[0.0] == pytest.approx(2 * 2 * op)  # 2 units (layers 0 and 2), 2 collectives each
    assert cm.zero_comms(base, "torch").unit_op_s == 0.0  # no measured overheads: bytes only


def test_recomputation_modes() -> None:
    agg = {"sync": 0.0, "time": 10.0, "fwd": 4.0, "static0": 0.0, "static1": 0.0, "static2": 0.0, "static3": 0.0,
           "act": 100.0, "act_sel": 60.0, "core": 0.5, "fwd_head": 0.0, "act_head": 0.0, "units": 1.0,
           "wsync": 0.0, "loss_ws": 0.0, "unit_max": 0.0, "loss_gathered": 0.0}
    none, sel, full = (cm.variant_cost(agg, 7.0, cm.Variant(r, 0), 2, 0.0) for r in ("none", "selective", "full"))
    assert (none.time, none.act, none.workspace) == (10.0, 100.0, 0.0)
    assert (sel.time, sel.act, sel.workspace) == (10.5, 60.0, 0.0)
    assert (full.time, full.act, full.workspace) == (14.0, 7.0, 100.0)
    # the head after the last block is not redone and keeps its activations
    head = cm.variant_cost({**agg, "fwd_head": 1.0, "act_head": 30.0}, 7.0, cm.Variant("full", 0), 2, 0.0)
    assert (head.time, head.act, head.workspace) == (13.0, 37.0, 70.0)
    # the last stage's loss needs its workspace before any backward: the larger of the two
    lossy = {**agg, "loss_ws": 80.0}
    assert [cm.variant_cost(lossy, 7.0, cm.Variant(r, 0), 2, 0.0).workspace for r in ("none", "selective", "full")] \
        == [80.0, 80.0, 100.0]


def _block_profile(s: int, b: int, h: int, a: int, kv: int | None = None) -> ir.ModelProfile:
    d = make_profile_dict(1, batch_size=b)
    saved = s * b * h * (34 + 5 * a * s / h)  # Korthikanti et al. Table 2, no parallelism (16-bit)
    d["layers"][0].update(saved_bytes=int(saved), output_bytes=2 * s * b * h, param_count=12 * h * h,
                          param_bytes=24 * h * h, in_features=h, out_features=h,
                          block={"hidden": h, "heads": a, "kv_heads": kv or a, "ffn": 4 * h, "seq_len": s})
    d["dtype"] = "bfloat16"
    d["input_bytes"] = 2 * s * b * h
    return ir.ModelProfile.from_dict(d)


@given(st.sampled_from([1, 2, 4, 8]), st.sampled_from([512, 2048]), st.sampled_from([1024, 4096]),
       st.booleans())
def test_activation_memory_per_layer_korthikanti_table_2(t: int, s: int, h: int, sp: bool) -> None:
    a, b = 32, 2
    profile = _block_profile(s, b, h, a)
    cluster = cluster_from_dict(make_cluster_dict(1, 8, 10**12))
    group = group_of(cluster, [g.name for g in cluster.gpus][:t])
    table = cm.layer_table(profile, cm.Grid(group, t, "bf16", sp), 1, "adam")
    sbh = s * b * h
    col = cm.TP if t > 1 else cm.DP
    if t == 1:
        want, want_sel = sbh * (34 + 5 * a * s / h), sbh * 34
    elif sp:
        want, want_sel = sbh * (34 / t + 5 * a * s / (h * t)), sbh * 34 / t
    else:
        want, want_sel = sbh * (10 + 24 / t + 5 * a * s / (h * t)), sbh * (10 + 24 / t)
    assert table.act[0, col] == pytest.approx(want, rel=1e-6)
    assert table.act_sel[0, col] == pytest.approx(want_sel, rel=1e-6)
    # full recomputation keeps the layer input: 2 s b h, 2 s b h / t with sequence parallelism
    assert table.in_bytes[0] == pytest.approx(2 * sbh)
    assert table.kept_in[0, col] == pytest.approx(2 * sbh / (t if sp else 1))


def _decoder(blocks_at: tuple[int, ...], n: int = 4) -> ir.ModelProfile:
    d = make_profile_dict(n, batch_size=8)
    for i in blocks_at:
        d["layers"][i].update(in_features=64, out_features=64,
                              block={"hidden": 64, "heads": 4, "kv_heads": 4, "ffn": 256, "seq_len": 16})
    return ir.ModelProfile.from_dict(d)


@pytest.mark.parametrize(("blocks_at", "redone"), [((1, 2), 3), ((), 4), ((0, 1, 2, 3), 4), ((3,), 4)])
def test_full_recomputation_leaves_out_the_layers_after_the_last_block(blocks_at: tuple[int, ...],
                                                                       redone: int) -> None:
    # Megatron-LM and torchtitan checkpoint the transformer layers only: the final norm and logits head after the
    # last block keep their activations and are not redone; a model without blocks redoes its whole stage
    profile = _decoder(blocks_at)
    assert profile.recomputed_layers(0, 4) == redone
    assert profile.recomputed_layers(redone, 4) == 0
    cluster = cluster_from_dict(make_cluster_dict(1, 1, 10**12))
    costs = {r: cm.stage_cost_values(profile, cluster, ir.Stage((0, 4), ("n0.g0",), ("dp",) * 4, 0, r), 1, "sgd",
                                    None)
             for r in ("none", "full")}
    layer = profile.layers[0]
    assert costs["full"].backward_s - costs["none"].backward_s == pytest.approx(redone * layer.forward_s)
    head = (4 - redone) * layer.saved_bytes  # activations of the layers not redone
    if blocks_at:  # each redone layer its own checkpoint: its input kept, one layer's activations redone at a time
        inputs = profile.input_bytes + (redone - 1) * layer.output_bytes
        assert costs["full"].activation_bytes == pytest.approx(inputs + head)
        assert costs["full"].workspace_bytes == pytest.approx(layer.saved_bytes)
    else:  # the stage as one region (GPipe): its input kept, all its activations redone at once
        assert costs["full"].activation_bytes == pytest.approx(profile.input_bytes + head)
        assert costs["full"].workspace_bytes == pytest.approx(redone * layer.saved_bytes)


@given(st.lists(st.booleans(), min_size=1, max_size=6), st.data())
def test_full_recomputation_redoes_exactly_the_stages_layers_before_the_head(blocks: list[bool], data: st.DataObject
                                                                             ) -> None:
    n = len(blocks)
    profile = _decoder(tuple(i for i, is_block in enumerate(blocks) if is_block), n)
    first = data.draw(st.integers(0, n - 1))
    end = data.draw(st.integers(first + 1, n))
    k = profile.recomputed_layers(first, end)
    redone = [i for i in range(first, end) if not any(blocks) or i <= max(j for j, x in enumerate(blocks) if x)]
    assert k == len(redone) and redone == list(range(first, first + k))
    cluster = cluster_from_dict(make_cluster_dict(1, 1, 10**12))
    costs = {r: cm.stage_cost_values(profile, cluster, ir.Stage((first, end), ("n0.g0",), ("dp",) * (end - first), 0,
                                                                r), 1, "sgd", None) for r in ("none", "full")}
    layer = profile.layers[0]
    assert costs["full"].backward_s - costs["none"].backward_s == pytest.approx(k * layer.forward_s)
    one_region = k * layer.saved_bytes
    assert costs["full"].workspace_bytes == pytest.approx(min(k, 1) * layer.saved_bytes if any(blocks) else one_region)


def test_full_recomputation_of_a_deep_decoder_keeps_two_sbh_a_layer_and_redoes_one_layer() -> None:
    # Korthikanti et al. 2022, Table 2: full recomputation keeps the layer input, 2 s b h bytes at 16 bits, per
    # layer and micro-batch; the backward redoes one layer at a time, so the workspace is one layer's 34 s b h +
    # 5 a s^2 b, whatever the depth (the stage as one region would hold every layer's at once)
    s, b, h, a, layers = 512, 1, 256, 8, 24
    block = _block_profile(s, b, h, a)
    d = block.to_dict()
    d["layers"] = [dict(d["layers"][0], name=f"layers.{i}") for i in range(layers)]
    profile = ir.ModelProfile.from_dict(d)
    cluster = cluster_from_dict(make_cluster_dict(1, 8, 10**12))
    stage = ir.Stage((0, layers), ("n0.g0",), ("dp",) * layers, 0, "full")
    cost = cm.stage_cost_values(profile, cluster, stage, 1, "adam", None, "bf16")
    sbh = s * b * h
    assert cost.activation_bytes == pytest.approx(layers * 2 * sbh, rel=1e-6)
    assert cost.workspace_bytes == pytest.approx(sbh * (34 + 5 * a * s / h), rel=1e-6)


def test_megatron_block_form_two_allreduces_each_way() -> None:
    s, b, h, a, t = 1024, 4, 2048, 16, 4
    profile = _block_profile(s, b, h, a)
    cluster = cluster_from_dict(make_cluster_dict(1, 8, 10**12))
    group = group_of(cluster, [g.name for g in cluster.gpus][:t])
    table = cm.layer_table(profile, cm.Grid(group, t, "bf16"), 1, "adam")
    layer = profile.layers[0]
    compute_f = layer.forward_s / t
    ar = cm.ring_allreduce_s(2 * s * b * h, t, cluster.link("intra_node"))
    assert table.fwd[0, cm.TP] == pytest.approx(compute_f + 2 * ar)
    assert table.bwd[0, cm.TP] == pytest.approx(layer.backward_s / t + 2 * ar)
    assert table.allowed[0, cm.TP]
    assert table.allowed[0, cm.DP]  # the block may also run on the group's share of the samples
    only = cm.layer_table(profile, cm.Grid(group, t, "bf16"), 1, "adam", rules=FormRules(blocks_tp=True))
    assert only.allowed[0, cm.TP] and not only.allowed[0, cm.DP]  # but not under an engine that shards every block


def test_tp_needs_heads_and_kv_heads_it_divides() -> None:
    profile = _block_profile(128, 1, 512, 8, kv=2)
    cluster = cluster_from_dict(make_cluster_dict(1, 8, 10**12))
    allowed = {}
    for t in (2, 4, 8):
        group = group_of(cluster, [g.name for g in cluster.gpus][:t])
        allowed[t] = bool(cm.layer_table(profile, cm.Grid(group, t), 1, "sgd").allowed[0, cm.TP])
    assert allowed == {2: True, 4: False, 8: False}


def test_bf16_plan_of_fp32_profile_halves_activations_and_uses_the_bf16_peak() -> None:
    d = make_cluster_dict(1, 2, 10**12)
    for g in d["nodes"][0]["gpus"]:
        g["peak_flops"] = {"fp32": 1e12, "bf16": 8e12}
    cluster = cluster_from_dict(d)
    prof = ir.ModelProfile.from_dict(make_profile_dict(2))
    stage = ir.Stage((0, 2), ("n0.g0",), ("dp", "dp"), 0)
    fp32 = cm.stage_cost_values(prof, cluster, stage, 1, "sgd", None, "fp32")
    bf16 = cm.stage_cost_values(prof, cluster, stage, 1, "sgd", None, "bf16")
    assert bf16.activation_bytes * 2 == fp32.activation_bytes
    assert bf16.forward_s * 8 == pytest.approx(fp32.forward_s)


def test_variants_leave_out_zero_0_when_1_is_allowed_and_zero_needs_data_parallelism() -> None:
    assert {v.zero for v in cm.variants(["none"], [0, 1, 2, 3], 4)} == {1, 2, 3}
    assert {v.zero for v in cm.variants(["none"], [0, 1, 2, 3], 1)} == {0}
    assert {v.zero for v in cm.variants(["none"], [0, 2], 2)} == {0, 2}


@given(st.floats(0.0, 1e10), st.floats(1.0, 1e9), st.floats(0.5, 2.0), st.integers(0, 3), st.booleans(),
       st.booleans())
def test_the_gradient_all_reduces_flat_copy_is_the_gradients_up_to_the_cap(
        weight: float, cap: float, scale: float, zero: int, synced: bool, alone: bool) -> None:
    """``min(G, cap)`` with ``G`` the gradients as reduced, under the engine's copying ZeRO stages and only
    where the stage synchronises its gradients, or always for an engine that copies alone (DeepSpeed's)."""
    comms = cm.ZeroComms(copy_zero=(0, 1), copy_cap_bytes=cap, copy_scale=scale, copy_alone=alone)
    agg = {**AGG, "weight": weight, "grad": weight, "sync": 2.0 if synced else 0.0}
    got = float(cm.variant_cost(agg, 0.1, cm.Variant("none", zero), 4, 0.0, comms).transient)
    expect = min(weight * scale, cap) if zero in (0, 1) and (synced or alone) else 0.0
    assert got == pytest.approx(expect)
    assert float(cm.variant_cost(agg, 0.1, cm.Variant("none", zero), 4, 0.0).transient) == 0.0  # the paper's: none


@pytest.mark.parametrize(("engine", "precision", "zero", "params", "copy"), [
    ("torch", "fp32", 0, 10**6, 4 * 10**6),  # fp32 gradients, under the 25 MiB bucket
    ("torch", "bf16", 1, 10**6, 4 * 10**6),  # bf16 casts of fp32 parameters: fp32 gradients
    ("torch", "fp32", 0, 10**8, 25 * 2**20),  # capped at one bucket
    ("torch", "fp32", 2, 10**6, 0),  # FSDP: no flat copy
    ("deepspeed", "fp32", 0, 10**8, 4 * 10**8),  # up to 5e8 elements at once
    ("deepspeed", "bf16", 0, 10**8, 4 * 10**8),  # its bf16 optimizer reduces fp32 gradients
    ("deepspeed", "fp32", 1, 10**8, 4 * 10**8 // 8),  # its ZeRO-1's fp32 gradient partition in the step
    ("deepspeed", "bf16", 1, 10**8, 4 * 10**8 // 8),  # fp32 whatever the weights
    ("torchtitan", "bf16", 0, 10**8, 0),  # DDP's buckets live with the model: static bytes (below)
    ("any", "fp32", 0, 10**8, 0),
])
def test_a_data_parallel_stage_holds_its_engines_flat_gradient_copy(engine: str, precision: str, zero: int,
                                                                      params: int, copy: int) -> None:
    cluster = _big_cluster(1, 8)
    stage = ir.Stage((0, 1), tuple(g.name for g in cluster.gpus), ("dp",), 0, zero=zero)
    cost = cm.stage_cost_values(_one_layer(params), cluster, stage, 2, "adam", None, precision, engine=engine)
    assert cost.grad_copy_bytes == pytest.approx(copy, rel=1e-6)
    one = ir.Stage((0, 1), (cluster.gpus[0].name,), ("dp",), 0)
    alone = 4 * params if engine == "deepspeed" else 0  # DeepSpeed flattens its fp32 gradients all the same
    assert cm.stage_cost_values(_one_layer(params), cluster, one, 2, "adam", None, precision,
                                engine=engine).grad_copy_bytes == alone  # else nothing to all-reduce


@given(st.floats(0.0, 1e10), st.floats(0.5, 2.0), st.floats(0.0, 1e-9), st.integers(0, 3), st.booleans(),
       st.booleans(), st.booleans())
def test_the_flat_copy_takes_its_passes_over_every_gradient_byte_once_a_step(
        grad: float, scale: float, per_byte_s: float, zero: int, synced: bool, alone: bool, held: bool) -> None:
    """All ``G`` bytes as reduced, at ``copy_s_per_byte``, added to the step's synchronisation where the engine
    copies (its ZeRO stages, the stage synchronising or the engine copying alone, buckets not held for good);
    the cap bounds what is held at once, not what is copied."""
    comms = cm.ZeroComms(copy_zero=(0,), copy_cap_bytes=1.0, copy_scale=scale, copy_alone=alone, copy_held=held,
                         copy_s_per_byte=per_byte_s)
    agg = {**AGG, "weight": grad, "grad": grad, "sync": 2.0 if synced else 0.0}
    got = float(cm.variant_cost(agg, 0.1, cm.Variant("none", zero), 4, 0.0, comms).sync)
    base = float(cm.variant_cost(agg, 0.1, cm.Variant("none", zero), 4, 0.0,
                                 dataclasses.replace(comms, copy_s_per_byte=0.0)).sync)
    share = 1.0 if synced else 2 / 3 if alone else 0.0  # a group of one scales nothing: two passes of three
    assert got - base == pytest.approx(grad * scale * per_byte_s * share if zero == 0 and not held else 0.0,
                                       abs=1e-12)


def test_an_engines_flat_copy_is_timed_at_the_devices_memory_bandwidth() -> None:
    """Three passes (flatten, scale, copy back), each a read and a write, at the slowest device's memory
    bandwidth; DeepSpeed's even on one process; none where a device gives no bandwidth or the engine copies
    nothing."""
    from planner.grad_buffers import ALONE_COPY_PASSES, GRAD_COPY_PASSES

    d = make_cluster_dict(1, 2, 10**14)
    for g, bw in zip(d["nodes"][0]["gpus"], (2e10, 1e10), strict=True):
        g["memory_bandwidth_Bps"] = bw
    cluster = cluster_from_dict(d)
    params = 10**6
    one = ir.Stage((0, 1), (cluster.gpus[0].name,), ("dp",), 0)
    both = ir.Stage((0, 1), tuple(g.name for g in cluster.gpus), ("dp",), 0)

    def sync_s(stage: ir.Stage, engine: str, on: ir.Cluster = cluster) -> float:
        return cm.stage_cost_values(_one_layer(params), on, stage, 2, "sgd", None, "fp32", engine=engine).allreduce_s

    copy_s = 2 * GRAD_COPY_PASSES * 4 * params / 1e10
    alone_s = 2 * ALONE_COPY_PASSES * 4 * params / 1e10  # flattened and copied back, nothing to scale
    assert sync_s(one, "deepspeed") == pytest.approx(alone_s)  # flattened alone too, at the slower device's rate
    assert sync_s(one, "torch") == 0.0  # nothing to all-reduce, nothing copied
    assert sync_s(both, "torch") - sync_s(both, "any") == pytest.approx(copy_s)
    plain = cluster_from_dict(make_cluster_dict(1, 2, 10**14))  # no memory bandwidth: not charged
    assert sync_s(one, "deepspeed", plain) == 0.0


@given(st.floats(1.0, 1e9), st.integers(1, 8), st.integers(0, 3), st.booleans(), st.booleans(), st.booleans())
def test_autograd_holds_the_largest_layers_new_gradient_beside_the_kept_one_over_several_microbatches(
        unit: float, m: int, zero: int, sync_last: bool, trains: bool, engine: bool) -> None:
    """``U`` more workspace where an engine accumulates over two or more micro-batches a stage with gradients;
    a ZeRO-3 that reduces every micro-batch holds the gradient already (its gathered units)."""
    comms = cm.ZeroComms(sync_last_backward=sync_last, accumulates=engine)
    agg = {**AGG, "unit_max": unit, "grad": 1.0 if trains else 0.0}
    base = cm.ZeroComms(sync_last_backward=sync_last)
    got = float(cm.variant_cost(agg, 0.1, cm.Variant("none", zero), m, 0.0, comms).workspace)
    paper = float(cm.variant_cost(agg, 0.1, cm.Variant("none", zero), m, 0.0, base).workspace)
    reduces_each = zero == 3 and not sync_last
    assert got - paper == pytest.approx(unit if engine and m > 1 and trains and not reduces_each else 0.0)


def test_torchs_bf16_holds_a_bf16_copy_of_the_weights_under_zero_0_and_1() -> None:
    """The torch export computes with a bf16 copy of its fp32 parameters made once a step (export.sharding.
    Bf16Compute): the weights' bytes beyond the paper's static bytes under ZeRO-0 and 1; under 2 and 3 FSDP's
    mixed precision gathers bf16 weights a unit at a time; none in fp32, and none for another engine."""
    cluster = _big_cluster(1, 8)
    assert cm.zero_comms(cluster, "torch", "bf16").compute_copy_zero == (0, 1)
    assert cm.zero_comms(cluster, "torch", "fp32").compute_copy_zero == ()
    assert cm.zero_comms(cluster, "deepspeed", "bf16").compute_copy_zero == ()
    comms = cm.zero_comms(cluster, "torch", "bf16")
    without = dataclasses.replace(comms, compute_copy_zero=())
    agg = {**AGG, "weight": 3.0, "grad": 3.0, "static0": 16.0, "static1": 10.0, "static2": 7.0, "static3": 4.0}
    for zero in range(4):
        held = cm.variant_cost(agg, 0.1, cm.Variant("none", zero), 4, 0.0, comms).static
        plain = cm.variant_cost(agg, 0.1, cm.Variant("none", zero), 4, 0.0, without).static
        assert held - plain == (3.0 if zero < 2 else 0.0)


def test_torchtitan_runs_fsdp_as_the_paper_alone_and_as_torch_in_a_pipeline() -> None:
    """torchtitan's FSDP without a pipeline reduces in every backward (the paper's ZeRO-2 memory); with
    one it runs torch's schedules, which keep the gradients unreduced until the step's end."""
    cluster = _big_cluster(1, 8)
    names = tuple(g.name for g in cluster.gpus)
    prof = _one_layer(10**6)
    d = make_profile_dict(2, batch_size=64)
    for layer in d["layers"]:
        layer.update(param_count=10**6, param_bytes=4 * 10**6)
    two_layers = ir.ModelProfile.from_dict(d)
    alone = ir.Stage((0, 1), names, ("dp",), 0, zero=2)
    single = cm.stage_costs_for(prof, cluster, [alone], 4, "adam", engine="torchtitan")[0].static_bytes
    paper = cm.stage_costs_for(prof, cluster, [alone], 4, "adam", engine="any")[0].static_bytes
    piped = [ir.Stage((0, 1), names[:4], ("dp",), 0, zero=2), ir.Stage((1, 2), names[4:], ("dp",), 0, zero=2)]
    in_pipeline = cm.stage_costs_for(two_layers, cluster, piped, 4, "adam", engine="torchtitan")[0].static_bytes
    as_torch = cm.stage_costs_for(two_layers, cluster, piped, 4, "adam", engine="torch")[0].static_bytes
    assert single == paper and in_pipeline == as_torch > single


def test_zero0_stays_a_choice_where_zero1_holds_buffers_of_its_own() -> None:
    """DeepSpeed's ZeRO-1 moves the paper's bytes but holds two reduction buffers: it is not always leaner."""
    assert {v.zero for v in cm.variants(("none",), (0, 1), 4, cm.ZeroComms(zero1_buffer_bytes=8.0))} == {0, 1}
    assert {v.zero for v in cm.variants(("none",), (0, 1), 4)} == {1}
    assert {v.zero for v in cm.variants(("none",), (0, 1), 4, cm.ZeroComms(zero1_unit_ops=True))} == {0, 1}
    static = cm.variant_cost(AGG, 0.1, cm.Variant("none", 1), 4, 0.0, cm.ZeroComms(zero1_buffer_bytes=8.0)).static
    assert float(static) == AGG["static1"] + 8.0


@given(st.floats(0.0, 1e-2), st.integers(1, 8))
def test_deepspeeds_zero1_pays_each_layers_unit_cost_twice_a_step(op_s: float, m: int) -> None:
    """DeepSpeed's ZeRO-1 reduces into partitions and all-gathers the parameters parameter by parameter:
    ``unit_op_s`` twice a step per layer with weights, on top of the paper's all-reduce volume."""
    ds = cm.variant_cost(AGG, 0.1, cm.Variant("none", 1), m, 0.0, cm.ZeroComms(unit_op_s=op_s, zero1_unit_ops=True))
    assert ds.sync == pytest.approx(2.0 + 2 * 3 * op_s) and ds.time == AGG["time"]
    assert cm.variant_cost(AGG, 0.1, cm.Variant("none", 1), m, 0.0, cm.ZeroComms(unit_op_s=op_s)).sync == 2.0
    cluster = dataclasses.replace(_big_cluster(1, 8), engine_overheads=(
        ("deepspeed", ir.EngineOverhead(per_shard_s=op_s)),))
    assert cm.zero_comms(cluster, "deepspeed").zero1_unit_ops and cm.zero_comms(cluster, "deepspeed").unit_op_s == op_s


@pytest.mark.parametrize(("precision", "grad_bytes"), [("fp32", 4), ("bf16", 4)])
def test_torchtitans_replicate_holds_every_gradient_twice(precision: str, grad_bytes: int) -> None:
    """torchtitan's ZeRO-0 is DDP, whose buckets (``gradient_as_bucket_view=False``) hold a copy of every
    gradient for the model's life: static bytes, not a transient; fp32 gradients under bf16 (autocast
    over fp32 parameters). None on one rank, and FSDP has none. torch's ZeRO-0 holds its bf16 copy instead."""
    params = 10**7
    cluster = _big_cluster(1, 8)
    names = tuple(g.name for g in cluster.gpus)

    def cost(engine: str, zero: int, devices: tuple[str, ...] = names) -> ir.StageCost:
        stage = ir.Stage((0, 1), devices, ("dp",), 0, zero=zero)
        return cm.stage_cost_values(_one_layer(params), cluster, stage, 2, "adam", None, precision, engine=engine)

    titan, torch = cost("torchtitan", 0), cost("torch", 0)
    bf16_copy = 2 * params if precision == "bf16" else 0  # torch's own copy to compute with (its ZeRO-0/1)
    assert titan.static_bytes - (torch.static_bytes - bf16_copy) == pytest.approx(grad_bytes * params, rel=1e-6)
    assert titan.grad_copy_bytes == 0
    assert cost("torchtitan", 0, names[:1]).static_bytes == cost("torch", 0, names[:1]).static_bytes - bf16_copy
    assert cost("torchtitan", 2).static_bytes == cost("torch", 2).static_bytes  # FSDP in a pipeline: as torch
    held = cm.zero_comms(cluster, "torchtitan", precision)
    assert held.copy_held and held.copy_zero == (0,)
    agg = {**AGG, "weight": 3.0, "grad": 3.0, "sync": 2.0}
    got = cm.variant_cost(agg, 0.1, cm.Variant("none", 0), 4, 0.0, held)
    assert float(got.static) == pytest.approx(AGG["static0"] + 3.0 * held.copy_scale) and float(got.transient) == 0


@pytest.mark.parametrize(("precision", "master"), [("fp32", 1), ("bf16", 0)])
def test_deepspeeds_zero1_keeps_an_fp32_master_partition_of_fp32_weights(precision: str, master: int) -> None:
    """DeepSpeed's ZeRO-1 clones its partition of the weights into fp32 even when they are fp32 (the
    paper's mixed-precision state already holds that copy under bf16): ``W / d`` more static bytes,
    besides its two reduction buffers."""
    params, d = 10**8, 8
    cluster = _big_cluster(1, d)
    stage = ir.Stage((0, 1), tuple(g.name for g in cluster.gpus), ("dp",), 0, zero=1)

    def static(engine: str) -> int:
        return cm.stage_cost_values(_one_layer(params), cluster, stage, 2, "adam", None, precision,
                                    engine=engine).static_bytes

    buffers = 2 * 4 * deepspeed_bucket_params(params)
    weight_bytes = 4 if precision == "fp32" else 2
    assert static("deepspeed") - static("any") == pytest.approx(buffers + master * weight_bytes * params / d, rel=1e-6)


@given(st.floats(0.0, 1e9), st.floats(0.0, 1e9), st.floats(0.0, 2.0), st.floats(0.0, 4.0), st.booleans())
def test_what_an_engine_holds_adds_up_and_its_transients_overlap(buffers: float, cap: float, master: float,
                                                                 grad: float, held: bool) -> None:
    """An engine's extra memory under ZeRO-1 is the sum of what it holds for good (DDP's bucket copy,
    reduction buffers, an fp32 master partition) and, after the last backward, the larger of its
    transients (the all-reduce's flat copy, the fp32 gradient partition): none hides another."""
    agg = {**AGG, "weight": 8.0, "grad": 8.0, "static1": 6.0, "static2": 3.0}  # W = 8, W / d = 8 - (6 - 3) = 5
    comms = cm.ZeroComms(copy_zero=(1,), copy_cap_bytes=cap, copy_scale=1.5, copy_held=held,
                         zero1_buffer_bytes=buffers, zero1_master_share=master, zero1_grad_share=grad)
    got = cm.variant_cost(agg, 0.1, cm.Variant("none", 1), 4, 0.0, comms)
    assert float(got.static) == pytest.approx(6.0 + (12.0 if held else 0.0) + buffers + 5.0 * master)
    assert float(got.transient) == pytest.approx(max(0.0 if held else min(12.0, cap), 5.0 * grad))


@given(st.integers(1, 16), st.floats(1.0, 5.0), st.sampled_from([0.0, 0.5]))
def test_zeros_gathers_and_reductions_run_at_the_links_all_gather_bandwidth(m: int, scale: float, share: float) -> None:
    """Each all-gather or reduce-scatter costs ``shard_scale`` times half the all-reduce's bytes time (the links'
    all-reduce over all-gather bus bandwidth; gloo's on CPU reduce-scatters slower than it all-reduces); ZeRO-0's
    all-reduce, and torch's ZeRO-1 all-reduce before its broadcast, keep the all-reduce's."""
    comms = cm.ZeroComms(gather_share=share, shard_scale=scale)
    cost = {z: cm.variant_cost(AGG, 0.1, cm.Variant("none", z), m, 0.0, comms) for z in range(4)}
    half = scale * 1.0  # AGG's all-reduce is 2.0
    assert cost[0].sync == 2.0
    assert cost[1].sync == pytest.approx((2.0 if share else 2 * half) + share * 2 * half)
    assert cost[2].sync == pytest.approx((m + 1) * half)
    assert cost[3].sync == pytest.approx(m * half) and cost[3].time == pytest.approx(10.0 + 2 * half)
    kept = 0 in {v.zero for v in cm.variants(["none"], (0, 1), 4, comms)}
    assert kept == (scale > 1.0 or share > 0)  # ZeRO-0 stays a choice where ZeRO-1 costs more


def test_zero_comms_take_the_intra_node_links_bus_bandwidths() -> None:
    d = make_cluster_dict(2, 2)
    d["links"]["intra_node"].update(allreduce_bandwidth_Bps=2e9, allgather_bandwidth_Bps=5e8)
    cluster = cluster_from_dict(d)
    assert cm.zero_comms(cluster, "any").shard_scale == pytest.approx(4.0)
    assert cm.zero_comms(cluster, "deepspeed").shard_scale == pytest.approx(4.0)
    assert cm.zero_comms(_big_cluster(1, 8), "torch").shard_scale == 1.0  # none given: NCCL's rings, alike


def _frozen_stage_cost(trainable: int | None, zero: int, precision: str = "fp32", dp: int = 8) -> ir.StageCost:
    params = 10**8
    cluster = _big_cluster(1, dp)
    stage = ir.Stage((0, 1), tuple(g.name for g in cluster.gpus), ("dp",), 0, zero=zero)
    profile = _one_layer(params, **({} if trainable is None else {"trainable_count": trainable}))
    return cm.stage_cost_values(profile, cluster, stage, 4, "adam", None, precision)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_frozen_weights_have_no_gradients_optimizer_state_or_synchronisation(zero: int) -> None:
    """Fine-tuning: a layer whose weights are all frozen keeps its weights only (4 bytes a parameter in fp32,
    against mixed Adam's 4 + 4 + 8), reduces nothing and steps nothing; ZeRO-3 still gathers them (FSDP shards
    frozen weights too: in every micro-batch's forward and backward), and shards them as their only static
    bytes."""
    params, d = 10**8, 8
    frozen, trains = _frozen_stage_cost(0, zero), _frozen_stage_cost(None, zero)
    assert frozen.static_bytes == pytest.approx(4 * params / (d if zero == 3 else 1), rel=1e-6)
    assert trains.static_bytes > frozen.static_bytes
    assert frozen.optimizer_step_s == 0.0 and frozen.allreduce_bytes == 0.0 and frozen.allreduce_s == 0.0
    gathered = frozen.forward_s + frozen.backward_s - (_frozen_stage_cost(0, 0).forward_s
                                                       + _frozen_stage_cost(0, 0).backward_s)
    assert (gathered > 0) == (zero == 3)


@given(st.integers(0, 3), st.sampled_from(["fp32", "bf16"]), st.integers(0, 10**8))
def test_a_trainable_count_of_every_parameter_is_no_count_and_fewer_cost_no_more(zero: int, precision: str,
                                                                                  trainable: int) -> None:
    """``trainable_count`` = ``param_count`` costs what a profile without the field does (all train); fewer
    trainable parameters never cost more memory, synchronisation or optimizer time."""
    every, none = _frozen_stage_cost(10**8, zero, precision), _frozen_stage_cost(None, zero, precision)
    assert every == none
    some = _frozen_stage_cost(trainable, zero, precision)
    assert some.static_bytes <= none.static_bytes and some.allreduce_s <= none.allreduce_s + 1e-12
    assert some.optimizer_step_s <= none.optimizer_step_s + 1e-12
    assert some.static_bytes >= _frozen_stage_cost(0, zero, precision).static_bytes


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_fp32_gradients_of_16_bit_weights_move_twice_the_bytes_and_the_weights_gathers_do_not(zero: int) -> None:
    """Where the engine reduces fp32 gradients of bf16 weights (``wide_reduce_zero``), every gradient
    reduction moves twice the bytes; ZeRO's gathers of the weights move the weights' bytes either way."""
    m = 4
    narrow = cm.variant_cost(AGG, 0.1, cm.Variant("none", zero), m, 0.0, cm.ZeroComms(copy_scale=2.0))
    wide = cm.variant_cost(AGG, 0.1, cm.Variant("none", zero), m, 0.0,
                           cm.ZeroComms(copy_scale=2.0, wide_reduce_zero=(zero,)))
    grads = {0: 2.0, 1: 1.0, 2: m * 1.0, 3: m * 1.0}[zero]  # the gradients' share of the narrow volume
    moved = lambda c: float(c.sync) + float(c.time) - AGG["time"]  # noqa: E731
    assert moved(wide) - moved(narrow) == pytest.approx(grads)
    assert float(wide.fwd) == float(narrow.fwd)  # ZeRO-3's forward gathers only weights


def test_zero3_holds_the_gathered_units_and_one_units_gradient_during_a_backward() -> None:
    """ZeRO-3 gathers the unit computing and the one prefetched (2 U) and holds the computing unit's whole
    gradient until its reduce-scatter (U, or 2 U as fp32 gradients of bf16 weights); an engine that keeps
    the weights gathered through the step holds them in its static bytes instead; below ZeRO-3, nothing."""
    agg = {**AGG, "unit_max": 0.25}
    work = {z: float(cm.variant_cost(agg, 0.1, cm.Variant("none", z), 4, 0.0).workspace) for z in range(4)}
    assert work == {0: 0.0, 1: 0.0, 2: 0.0, 3: pytest.approx(0.75)}
    wide = cm.ZeroComms(copy_scale=2.0, wide_reduce_zero=(3,))
    assert float(cm.variant_cost(agg, 0.1, cm.Variant("none", 3), 4, 0.0, wide).workspace) == pytest.approx(1.0)
    kept = cm.ZeroComms(sync_last_backward=True)
    assert float(cm.variant_cost(agg, 0.1, cm.Variant("none", 3), 4, 0.0, kept).workspace) == 0.0
    frozen = {**agg, "grad": 0.0}  # no gradient to hold
    assert float(cm.variant_cost(frozen, 0.1, cm.Variant("none", 3), 4, 0.0).workspace) == pytest.approx(0.5)
    # the largest unit, not the sum, and on top of the loss's workspace
    lossy = {**agg, "loss_ws": 2.0}
    assert float(cm.variant_cost(lossy, 0.1, cm.Variant("full", 3), 4, 0.0).workspace) == pytest.approx(2.75)


def test_a_zero3_stage_peaks_three_of_its_largest_layers_above_its_shards() -> None:
    """On a real stage: ZeRO-3's peak over its sharded static bytes grows by three copies of the largest
    layer's weights (two gathered, one gradient) at the paper's bytes."""
    cluster = _big_cluster(1, 8)
    profile = _one_layer(10**8)
    stage = ir.Stage((0, 1), tuple(g.name for g in cluster.gpus), ("dp",), 0, zero=3)
    got = cm.stage_cost_values(profile, cluster, stage, 1, "adam", None, "bf16")
    layer = profile.layers[0]
    assert got.workspace_bytes >= 3 * 2 * layer.param_count  # 2 bytes a bf16 weight

"""baselines: the partitioners of DeepSpeed, torchgpipe and PipeDream, reimplemented faithfully."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from planner import ir
from planner.search import baselines as bl
from planner.search.settings import strategy_settings
from tests.conftest import make_cluster_dict, make_profile_dict

# ----------------------------------------------------------------------------- DeepSpeed


def test_partition_uniform_spreads_the_residual_over_the_first_parts() -> None:
    assert bl.partition_uniform(10, 4) == [0, 3, 6, 8, 10]
    assert bl.partition_uniform(8, 4) == [0, 2, 4, 6, 8]
    assert bl.partition_uniform(3, 5) == [0, 1, 2, 3, 3, 3]  # DeepSpeed's own edge case


def test_partition_balanced_on_a_vgg_like_model_isolates_the_big_classifier() -> None:
    # 13 convolutions of few parameters, then three fully-connected layers holding most
    weights = [2_000] * 13 + [100_000_000, 16_000_000, 4_000_000]
    parts = bl.partition_balanced(weights, 2)
    assert parts == [0, 14, 16]


def test_deepspeed_parameters_counts_a_tied_weight_in_every_layer_that_holds_it() -> None:
    doc = make_profile_dict(4)
    doc["ties"] = [{"name": "wte", "layers": [0, 3], "param_count": 1000, "param_bytes": 4000}]
    profile = ir.ModelProfile.from_dict(doc)
    counts = bl.deepspeed_layer_weights(profile)
    assert counts[3] == profile.layers[3].param_count + 1000
    assert counts[0] == profile.layers[0].param_count


ds_utils = None
try:  # DeepSpeed is a dev extra; the comparison runs wherever it is installed
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from deepspeed.runtime import utils as ds_utils  # type: ignore[no-redef]
except Exception:  # any import failure means "not available here"
    ds_utils = None

needs_deepspeed = pytest.mark.skipif(ds_utils is None, reason="deepspeed is not importable")


@needs_deepspeed
@given(st.integers(0, 40), st.integers(1, 12))
def test_partition_uniform_equals_deepspeed(items: int, parts: int) -> None:
    assert bl.partition_uniform(items, parts) == list(ds_utils.partition_uniform(items, parts))


@needs_deepspeed
@given(st.lists(st.integers(0, 10**8), min_size=1, max_size=24), st.integers(1, 8))
def test_partition_balanced_equals_deepspeed(weights: list[int], parts: int) -> None:
    assert bl.partition_balanced(weights, parts) == [int(x) for x in ds_utils.partition_balanced(weights, parts)]


@needs_deepspeed
@given(st.lists(st.floats(0, 1e3, allow_nan=False), min_size=1, max_size=16), st.integers(1, 6))
def test_partition_balanced_equals_deepspeed_on_floats(weights: list[float], parts: int) -> None:
    assert bl.partition_balanced(weights, parts) == [int(x) for x in ds_utils.partition_balanced(weights, parts)]


@given(st.lists(st.one_of(st.integers(0, 10**8), st.sampled_from([0, 1, 2])), max_size=24), st.integers(1, 9))
def test_partition_balanced_fast_equals_the_loop(weights: list[int], parts: int) -> None:
    assert bl.partition_balanced_fast(weights, parts) == bl.partition_balanced(weights, parts)


@given(st.lists(st.floats(0, 1e3, allow_nan=False), max_size=16), st.integers(1, 6))
def test_partition_balanced_fast_equals_the_loop_on_floats(weights: list[float], parts: int) -> None:
    assert bl.partition_balanced_fast(weights, parts) == bl.partition_balanced(weights, parts)


# ----------------------------------------------------------------------------- torchgpipe


def test_block_partition_stops_where_torchgpipes_loop_cycles() -> None:
    """torchgpipe's move loop cycles for ever on this sequence (zeros and ties); ours stops, with
    non-empty blocks covering every element."""
    seq = [0.5, 0, 2, 1, 0, 0, 0.0223, 3, 3, 0.5, 3, 0.5, 1, 3, 0, 0.5, 0, 0.186, 0, 0.743, 0.5, 3, 0.508, 2, 3,
           0.5, 0, 0.48, 3]
    counts = bl.block_partition(seq, 27)
    assert len(counts) == 27 and sum(counts) == len(seq) and min(counts) >= 1


def test_block_partition_matches_torchgpipes_own_tests() -> None:
    # torchgpipe tests/test_balance.py: solve([1..6], 2) == [[1, 2, 3, 4], [5, 6]]; solve([0, 0], 2)
    assert bl.block_partition([1, 2, 3, 4, 5, 6], 2) == [4, 2]
    assert bl.block_partition([0, 0], 2) == [1, 1]
    with pytest.raises(ValueError):
        bl.block_partition([42], 0)
    with pytest.raises(ValueError):
        bl.block_partition([42], 2)


@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=30), st.integers(1, 8))
def test_block_partition_is_a_partition(seq: list[int], parts: int) -> None:
    if parts > len(seq):
        return
    balance = bl.block_partition(seq, parts)
    assert len(balance) == parts and sum(balance) == len(seq)


def test_block_partition_keeps_torchgpipes_empty_block_on_ties_at_zero() -> None:
    # torchgpipe takes the first smallest block, not the one closest to the largest as the
    # paper says, so elements normalised to 0 can leave a block empty; GPipe then refuses
    # the balance, and so does the torchgpipe baseline
    assert bl.block_partition([0, 0, 1, 1], 3) == [3, 0, 1]
    doc = make_profile_dict(4)
    for layer, t in zip(doc["layers"], [5e-6, 5e-6, 6e-6, 6e-6], strict=True):
        layer["forward_s"] = t
    from tests.conftest import make_cluster_dict

    result = bl.torchgpipe_layout(ir.ModelProfile.from_dict(doc), ir.Cluster.from_dict(make_cluster_dict(1, 3)), (1,))
    assert isinstance(result, bl.NotFitting) and "[3, 0, 1]" in result.reason


def test_balance_by_time_uses_forward_times_in_microseconds() -> None:
    doc = make_profile_dict(6)
    for i, layer in enumerate(doc["layers"]):
        layer["forward_s"] = (i + 1) / 100  # torchgpipe's test: Delay(i/100) for i in 1..6
    assert bl.balance_by_time(ir.ModelProfile.from_dict(doc), 2) == [4, 2]


def test_balance_by_time_times_forward_and_backward_as_torchgpipe_does() -> None:
    # torchgpipe's profile_times runs each layer's backward inside the timed span (v0.0.5 on); a balance on the
    # forwards alone split 4 layers of equal forwards (1 ms) but backwards of 0, 0, 6, 6 ms as [2, 2]: 2 ms
    # against 14 ms per step, where torchgpipe gives [3, 1]: 8 ms against 7 ms
    doc = make_profile_dict(4)
    for layer, back in zip(doc["layers"], [0.0, 0.0, 6e-3, 6e-3], strict=True):
        layer.update(forward_s=1e-3, backward_s=back)
    assert bl.balance_by_time(ir.ModelProfile.from_dict(doc), 2) == [3, 1]


# ----------------------------------------------------------------------------- PipeDream


def test_pipedream_single_level_is_pure_data_parallel_when_communication_is_free() -> None:
    stages = bl.pipedream_partition([1.0] * 6, [0.0] * 6, [(4, 1e12)])
    assert stages == [bl.PipeDreamStage(0, 6, ((0,), (1,), (2,), (3,)))]


def test_pipedream_puts_weight_heavy_layers_on_few_replicas() -> None:
    # compute in the first layers, parameters in the last one, slow network: PipeDream
    # replicates the compute-heavy front and leaves the weight-heavy tail on one device
    times = [1.0, 1.0, 1.0, 0.01]
    params = [1e3, 1e3, 1e3, 4e8]
    stages = bl.pipedream_partition(times, params, [(4, 1.25e8)])
    assert (stages[-1].first, stages[-1].end, stages[-1].replicas) == (3, 4, 1)
    assert sum(s.replicas for s in stages) == 4
    assert stages[0].first == 0 and stages[-1].end == 4


def test_pipedream_hierarchy_multiplies_replicas_across_servers() -> None:
    times = [1.0] * 8
    stages = bl.pipedream_partition(times, [0.0] * 8, [(2, 1e10), (4, 1e9)])
    # free weight sync: data parallel everywhere, 2 GPUs per server x 4 servers
    assert len(stages) == 1 and stages[0].replicas == 8
    assert stages[0].devices == tuple((srv, gpu) for srv in range(4) for gpu in range(2))


@given(st.lists(st.floats(1e-3, 1.0), min_size=1, max_size=10), st.integers(1, 4), st.integers(1, 3))
def test_pipedream_stages_cover_the_layers_and_use_every_device(times: list[float], per: int, servers: int) -> None:
    params = [1e6 * (i + 1) for i in range(len(times))]
    stages = bl.pipedream_partition(times, params, [(per, 1e10), (servers, 1e9)])
    assert stages[0].first == 0 and stages[-1].end == len(times)
    assert all(a.end == b.first for a, b in itertools.pairwise(stages))
    assert sum(s.replicas for s in stages) == per * servers
    used = [d for s in stages for d in s.devices]
    assert sorted(used) == [(a, b) for a in range(servers) for b in range(per)]


_FEWER = bl.PipeDreamFlags(use_fewer_machines=True)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.floats(1e-3, 1.0), st.integers(0, 4 * 10**9), st.integers(1, 10**9)), min_size=1,
                max_size=9),
       st.sampled_from([[(1, 1e10)], [(3, 1e9)], [(6, 1.25e9)], [(2, 1e10), (2, 1e9)], [(4, 1e11), (3, 1.25e8)],
                        [(3, 1e10), (1, 1e9)]]),
       st.sampled_from(list(bl.PIPEDREAM_FLAGS)), st.sampled_from([None, 1.0]))
# facts random chains seldom reach: the first stage's weight sync divided by the GPUs per server, a later stage's
# not; a stage's output transfer counted, and divided by its own replicas
@example([(0.25, 0, 10**9), (0.25, 4 * 10**9, 10**8)], [(2, 1e10), (2, 1e9)], bl.PipeDreamFlags(), 1.0)
@example([(0.5, 3 * 10**9, 1), (1.0, 10**9, 10**9)], [(4, 1e11), (3, 1.25e8)], bl.PipeDreamFlags(), None)
@example([(0.25, 10**9, 1), (1.0, 4 * 10**9, 10**9), (0.5, 10**9, 1)], [(6, 1.25e9)], _FEWER, 1.0)
@example([(1.0, 10**9, 10**8), (1.0, 10**9, 10**9), (0.5, 10**9, 10**9)], [(6, 1.25e9)], _FEWER, 1.0)
def test_pipedream_partition_is_optimal_for_pipedreams_objective_by_brute_force(
        layers: list[tuple[float, int, int]], levels: list[tuple[int, float]], flags: bl.PipeDreamFlags,
        ratio: float | None) -> None:
    """PipeDream's objective (tests/pipedream_brute.py, written from optimizer_graph_hierarchical.py's definition)
    over every cut of the chain and every replica count, level by level, with --straight_pipeline,
    --use_fewer_machines and --activation_compression_ratio: the answer reaches the brute force's best time and is
    optimal inside every unit, it is the brute force's answer where that is the only optimal one, and it is empty
    exactly where the brute force has no answer (a straight pipeline on more GPUs than layers)."""
    from tests import pipedream_brute as brute

    times, params, outputs = ([float(x[c]) for x in layers] for c in range(3))
    chain = brute.Chain(tuple(times), tuple(params), tuple(outputs), ratio, flags.straight_pipeline,
                        flags.use_fewer_machines)
    levels_ = brute.levels_of(levels)
    solved = brute.solve(chain, levels_)
    top, whole = len(levels) - 1, (0, len(times))
    best = solved[top][whole].time
    got = bl.pipedream_partition(times, params, levels, outputs, ratio, flags)
    if best is None:
        assert got == []
        return
    assert got
    nested = brute.nest([(s.first, s.end, s.devices) for s in got], top)
    value = brute.nested_time(chain, levels_, nested, top)
    assert value is not None and abs(value - best) <= brute.TOL * best
    assert brute.inner_optimal(chain, levels_, solved, nested, top)
    optimal = brute.flat_answers(solved, top, whole)
    if len(optimal) == 1:
        assert [(s.first, s.end, s.replicas) for s in got] == list(optimal.pop())
    used = [d for s in got for d in s.devices]
    assert len(used) == len(set(used)) and len(used) <= levels[0][0] * (levels[-1][0] if len(levels) > 1 else 1)


def test_pipedream_flags_shape_the_partition_as_their_help_says() -> None:
    """--straight_pipeline: "No replication across stages" (a stage per GPU); --use_fewer_machines: "Use fewer
    machines, if possible" (a weight-heavy model on a slow network keeps to fewer GPUs than its budget)."""
    times, params = [1.0, 1.0, 1.0, 1.0], [4e9] * 4
    default = bl.pipedream_partition(times, params, [(4, 1.25e8)])
    assert sum(s.replicas for s in default) == 4
    straight = bl.pipedream_partition(times, params, [(4, 1.25e8)], flags=bl.PipeDreamFlags(straight_pipeline=True))
    assert [(s.first, s.end, s.replicas) for s in straight] == [(0, 1, 1), (1, 2, 1), (2, 3, 1), (3, 4, 1)]
    assert bl.pipedream_partition(times, params, [(8, 1.25e8)], flags=bl.PipeDreamFlags(straight_pipeline=True)) == []
    # two layers of 4 GB weights, 1 s each, on 4 GPUs at 1 Gbit/s: any replica pays 32 s of weight sync per step,
    # so the best is one GPU each, the other two idle
    fewer = bl.pipedream_partition([1.0, 1.0], [4e9, 4e9], [(4, 1.25e8)],
                                   flags=bl.PipeDreamFlags(use_fewer_machines=True))
    assert [(s.first, s.end, s.replicas) for s in fewer] == [(0, 1, 1), (1, 2, 1)]
    assert sum(s.replicas for s in bl.pipedream_partition([1.0, 1.0], [4e9, 4e9], [(4, 1.25e8)])) == 4


# ----------------------------------------------------------------------------- layouts


def _pc(n_layers: int = 16, nodes: int = 4, per: int = 2) -> tuple[ir.ModelProfile, ir.Cluster]:
    from tests.conftest import make_cluster_dict

    return (ir.ModelProfile.from_dict(make_profile_dict(n_layers, batch_size=16)),
            ir.Cluster.from_dict(make_cluster_dict(nodes, per)))


def test_dp_layout_is_one_stage_on_every_gpu() -> None:
    profile, cluster = _pc()
    layout = bl.dp_layout(profile, cluster)
    assert layout.config == "8" and layout.microbatches == (1,)
    assert layout.stages[0][2] == ("dp",) * 16


def test_gpipe_uniform_gives_equal_layer_counts_one_gpu_each() -> None:
    profile, cluster = _pc(18)
    layout = bl.gpipe_uniform_layout(profile, cluster, (1, 2))
    assert isinstance(layout, bl.Layout)
    assert [b - a for (a, b), _, _ in layout.stages] == [3, 3, 2, 2, 2, 2, 2, 2]
    assert layout.config == "1-1-1-1-1-1-1-1" and layout.schedule == "gpipe"
    plan = layout.plan(profile, cluster, 2, "sgd")
    assert plan.microbatches == 2 and plan.stages[-1].layers == (16, 18)


@pytest.mark.parametrize("builder", [bl.gpipe_uniform_layout, bl.torchgpipe_layout])
def test_more_stages_than_layers_is_not_fitting_with_the_reason(builder) -> None:  # type: ignore[no-untyped-def]
    profile, cluster = _pc(5)
    result = builder(profile, cluster, (1,))
    assert isinstance(result, bl.NotFitting)
    assert "8 stages" in result.reason and "5 layers" in result.reason


def test_deepspeed_layouts_cover_every_pipeline_depth_of_the_grid() -> None:
    profile, cluster = _pc(16)
    layouts = bl.deepspeed_layouts(profile, cluster, "parameters", (1, 4))
    assert isinstance(layouts, list)
    assert [layout.config for layout in layouts] == ["8", "4-4", "2-2-2-2", "1-1-1-1-1-1-1-1"]
    # stage s holds ranks [s*D, (s+1)*D): consecutive GPUs, data axis innermost
    assert layouts[1].stages[1][1] == ("n2.g0", "n2.g1", "n3.g0", "n3.g1")


def test_pipedream_layout_names_real_devices_and_uses_each_once() -> None:
    profile, cluster = _pc(16)
    layout = bl.pipedream_layout(profile, cluster, (1,))
    assert isinstance(layout, bl.Layout)
    used = [d for _, devices, _ in layout.stages for d in devices]
    assert sorted(used) == sorted(g.name for g in cluster.gpus)
    assert all(form == "dp" for _, _, forms in layout.stages for form in forms)


# ----------------------------------------------------------------------------- settings


def test_pipedream_counting_activations_avoids_the_huge_activation_cut() -> None:
    # 2 servers of 1 GPU on 10 Gbit/s, four equal layers of 1 GB weights (data parallel is slow);
    # layer 1 emits 8 GB. PipeDream's default ignores transfers and cuts at the balanced point,
    # right where the 8 GB must cross servers (12.8 s a batch); with --activation_compression_ratio
    # 1 the DP sees it and cuts next to it (3 s a batch)
    times, params, outputs = [1.0] * 4, [1e9] * 4, [1e3, 8e9, 1e3, 1e3]
    levels = [(1, 1e11), (2, 1.25e9)]
    default = bl.pipedream_partition(times, params, levels, outputs)
    assert [(s.first, s.end) for s in default] == [(0, 2), (2, 4)]
    counted = bl.pipedream_partition(times, params, levels, outputs, activation_compression_ratio=1.0)
    assert len(counted) == 2 and counted[0].end != 2
    # the compression ratio divides the activation term: at 1e4 the cut is back at the balance point
    relaxed = bl.pipedream_partition(times, params, levels, outputs, activation_compression_ratio=1e4)
    assert [(s.first, s.end) for s in relaxed] == [(0, 2), (2, 4)]
    with pytest.raises(ValueError):
        bl.pipedream_partition(times, params, levels, None, activation_compression_ratio=1.0)


def test_pipedream_layout_reads_the_profiles_outputs_for_the_activation_term() -> None:
    # the partitioner case above as a profile on 2 servers x 1 GPU: each mode's layout, and
    # compare runs both, naming them
    from tests.conftest import make_cluster_dict

    doc = make_profile_dict(4)
    for layer, out in zip(doc["layers"], [1e3, 8e9, 1e3, 1e3], strict=True):
        layer.update(forward_s=1 / 3, backward_s=2 / 3, param_bytes=10**9, output_bytes=int(out))
    cluster_doc = make_cluster_dict(2, 1)
    cluster_doc["links"]["inter_node"]["bandwidth_Bps"] = 1.25e9
    profile, cluster = ir.ModelProfile.from_dict(doc), ir.Cluster.from_dict(cluster_doc)
    default = bl.pipedream_layout(profile, cluster, (1,))
    counted = bl.pipedream_layout(profile, cluster, (1,), activation_compression_ratio=1.0)
    assert isinstance(default, bl.Layout) and isinstance(counted, bl.Layout)
    assert [layers for layers, _, _ in default.stages] == [(0, 2), (2, 4)]
    assert len(counted.stages) == 2 and counted.stages[0][0] != (0, 2)
    labels = [s.label for s in strategy_settings("pipedream", profile, cluster, (1,), "sgd")]
    assert labels == [f"{label}, {flags.label}" if flags.label else label for label, _ in bl.PIPEDREAM_MODES
                      for flags in bl.PIPEDREAM_FLAGS for _ in bl.BASELINE_SCHEDULES["pipedream"]]


def test_deepspeed_type_method_balances_the_matching_layers() -> None:
    doc = make_profile_dict(6)
    for layer, kind in zip(doc["layers"], ["Embedding", *["Block"] * 4, "Linear"], strict=True):
        layer["type"] = kind
    profile = ir.ModelProfile.from_dict(doc)
    assert bl.deepspeed_type_weights(profile, "block") == [0, 1, 1, 1, 1, 0]  # case-insensitive search
    assert bl.deepspeed_parts(profile, 2, "type:Block") == bl.partition_balanced([0, 1, 1, 1, 1, 0], 2)
    assert bl.deepspeed_methods(profile) == ("parameters", "uniform", "type:Embedding", "type:Block", "type:Linear")
    with pytest.raises(ValueError):
        bl.deepspeed_parts(profile, 2, "size")


def test_balance_by_size_weighs_activations_of_a_micro_batch_and_scaled_parameters() -> None:
    doc = make_profile_dict(6)
    sizes = [(8000, 0), (8000, 0), (0, 1000), (0, 1000), (0, 1000), (0, 1000)]
    for layer, (saved, params) in zip(doc["layers"], sizes, strict=True):
        layer["saved_bytes"], layer["param_bytes"] = saved, params
        layer["param_count"] = params // 4  # fp32: no bytes, no parameters
    profile = ir.ModelProfile.from_dict(doc)
    # one chunk: the two 8000-byte activations outweigh four layers of 2 x 1000 parameter bytes
    assert bl.balance_by_size(profile, 2, 1, 2.0) == [1, 5]
    # eight chunks: 1000 activation bytes per micro-batch, the parameters now weigh more
    assert bl.balance_by_size(profile, 2, 8, 2.0) == [4, 2]
    assert bl.torchgpipe_param_scale("sgd") == 2 and bl.torchgpipe_param_scale("adam") == 4


def test_accpar_gives_its_split_stage_the_whole_group_as_tensor_degree() -> None:
    # VGG16's 400 MB classifier on 1 Gbit/s: AccPar splits it over every GPU rather than all-reduce it
    from pathlib import Path

    from planner.cluster import load_cluster
    from planner.jsonio import read_json

    root = Path(__file__).resolve().parent.parent
    profile = ir.ModelProfile.from_dict(read_json(str(root / "profiles/vgg16-b64-2080ti.json"), "profile"))
    cluster = load_cluster("pipepar-4x2-2080ti")
    layout = bl.accpar_layout(profile, cluster, "sgd")
    assert set(layout.stages[0][2]) - {"dp"} and layout.tp == 8
    plan = layout.plan(profile, cluster, 1, "sgd")
    assert plan.stages[0].tp == 8 and plan.stages[0].grid_problem() is None


def test_pipedream_times_a_16_bit_profile_at_its_own_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bf16 profile was scaled to the GPUs' fp32 peak (15x slower on H100s beside the links): PipeDream's
    partitioner then chose data parallelism over 64 GPUs, which a batch of 32 cannot split."""
    profile = ir.ModelProfile.from_dict(make_profile_dict(4, dtype="bfloat16"))
    doc = make_cluster_dict(1, 2)
    for gpu in doc["nodes"][0]["gpus"]:
        gpu["peak_flops"] = {"fp32": 1e12, "bf16": 15e12}
    seen: list[list[float]] = []

    def spy(times: list[float], *args: object, **kwargs: object) -> object:
        seen.append(list(times))
        return real(times, *args, **kwargs)  # type: ignore[arg-type]

    real = bl.pipedream_partition
    monkeypatch.setattr(bl, "pipedream_partition", spy)
    bl.pipedream_layout(profile, ir.Cluster.from_dict(doc), (1,))
    assert seen[0] == pytest.approx([0.03 / 15] * 4)

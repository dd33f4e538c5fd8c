"""The one runnability check: batch shapes, grids, engine limits; and every plan the tool emits passes it."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner import ir
from planner.cluster import cluster_from_dict, load_cluster
from planner.compare import compare
from planner.errors import PlanError, UsageError
from planner.jsonio import read_json
from planner.runnable import check_runnable, engines_running, is_runnable, problems, unrun_note
from planner.search import search
from tests.conftest import make_cluster_dict, make_profile_dict
from tests.test_export_torchtitan import llama_profile, titan_plan  # imported inside a @given test: nested @given


def _plan(batch: int = 8, m: int = 2, widths: tuple[int, ...] = (2, 2), **stage: object) -> ir.Plan:
    profile = ir.ModelProfile.from_dict(make_profile_dict(4, batch_size=batch))
    cluster = cluster_from_dict(make_cluster_dict(2, 2))
    names = [g.name for g in cluster.gpus]
    stages, at, first = [], 0, 0
    for s, w in enumerate(widths):
        end = 4 if s == len(widths) - 1 else first + 2
        stages.append(ir.Stage((first, end), tuple(names[at:at + w]), ("dp",) * (end - first), 0, **stage))
        at, first = at + w, end
    return ir.Plan(profile, cluster, "1f1b", m, "sgd", tuple(stages), ir.Prediction(1, 1, 0, 0))


def test_engines_running_and_the_note_on_a_plan_none_runs() -> None:
    """Stages of different widths (2 and 1 GPUs): the search space of ``any``, which no engine here runs (each runs
    one grid for every stage); equal widths: DeepSpeed and torch run it (torchtitan trains Llama-family models only).
    Only a plan of engine ``any`` gets the note, and none that cannot run at all."""
    uneven = _plan(widths=(2, 1))
    assert engines_running(uneven) == [] and not problems(uneven)
    note = unrun_note(uneven)
    assert note is not None and note[0].startswith(  # alike refusals said once
        "no engine runs this plan (deepspeed, torch: stage 1 is a tp 1 x dp 1 grid with ZeRO 0, stage 0 tp 1 x dp 2 "
        "with ZeRO 0: each engine runs one grid for every stage; torchtitan: toy is not a Llama-family model"), note
    assert "`planner search --engine deepspeed|torch` finds" in note[1]  # not torchtitan, which refuses the model
    even = _plan(widths=(2, 2))
    assert engines_running(even) == ["deepspeed", "torch"] and unrun_note(even) is None
    assert unrun_note(dataclasses.replace(uneven, engine="torch")) is None
    assert unrun_note(dataclasses.replace(uneven, microbatches=3)) is None  # 8 samples in 3: check_runnable says why


def test_the_note_names_no_engine_that_refuses_the_searchs_settings() -> None:
    """Under PipeDream's schedule no ``planner search --engine`` runs at all (each refuses the schedule before it
    searches): the note says the schedule is what each refuses and names no --engine to search with."""
    note = unrun_note(dataclasses.replace(_plan(widths=(2, 1)), schedule="pipedream"))
    assert note is not None and "deepspeed: deepspeed runs the schedules 1f1b, not 'pipedream'" in note[0], note
    assert "--engine deepspeed" not in note[1] and "another --schedule" in note[1], note


def test_split_forms_with_tp_1_are_not_runnable() -> None:
    plan = _plan()
    split = dataclasses.replace(plan.stages[0], forms=("split_out", "dp"))
    found = problems(dataclasses.replace(plan, stages=(split, plan.stages[1])))
    assert any("stage 0: tp is 1 but the stage has split_out forms" in p for p in found)
    assert problems(dataclasses.replace(plan, stages=(dataclasses.replace(split, tp=2), plan.stages[1]))) == []


def test_dp_form_in_a_tensor_group_needs_samples_the_group_divides() -> None:
    # batch 12, M 2, dp 1 (tp 2 on 2 GPUs): 6 samples per micro-batch split over 2 -> fine; M 6: 2 -> fine;
    # batch 6, M 2: 3 samples over a tensor group of 2 -> not runnable
    for batch, m, ok in ((12, 2, True), (12, 6, True), (6, 2, False)):
        plan = _plan(batch=batch, m=m, tp=2)
        found = [p for p in problems(plan) if "does not divide them" in p]
        assert (found == []) == ok, (batch, m, found)
    found = problems(_plan(batch=6, m=2, tp=2))
    assert any("micro-batch's 3 samples over the tensor group of 2" in p for p in found)


def test_torch_1f1b_needs_as_many_micro_batches_as_stages() -> None:
    plan = _plan(batch=8, m=1)  # 2 stages, 1 micro-batch: torch's Schedule1F1B refuses it
    assert any("needs at least as many micro-batches as stages: the plan has 1 on 2 stages" in p
               for p in problems(plan, "torch"))
    assert is_runnable(plan, "deepspeed") and is_runnable(_plan(batch=8, m=2), "torch")
    assert is_runnable(dataclasses.replace(plan, schedule="gpipe"), "torch")


def test_batch_shape_rule() -> None:
    assert problems(_plan(batch=8, m=2)) == []
    bad = _plan(batch=8, m=8)  # 8 samples over 8 micro-batches x 2 ranks
    assert any("0.5 per rank" in p for p in problems(bad))
    with pytest.raises(PlanError, match="batch 8 is not 8 micro-batches x 2 data-parallel ranks"):
        check_runnable(bad)


def test_engine_limits() -> None:
    plan = _plan(zero=1)
    assert is_runnable(plan, "deepspeed") and is_runnable(plan, "torch")
    assert any("ZeRO stage 3" in p for p in problems(dataclasses.replace(plan, stages=tuple(
        dataclasses.replace(s, zero=3) for s in plan.stages)), "deepspeed"))
    assert any("one grid" in p for p in problems(_plan(widths=(2, 1)), "torch"))
    assert any("schedules" in p for p in problems(dataclasses.replace(plan, schedule="pipedream"), "torch"))
    assert any("fp16" in p for p in problems(dataclasses.replace(plan, precision="fp16"), "torch"))
    assert problems(dataclasses.replace(plan, precision="fp16"), "deepspeed") == []


def test_tp_form_needs_a_block_whose_heads_it_divides() -> None:
    plan = _plan()
    tp_stage = dataclasses.replace(plan.stages[0], forms=("tp", "dp"), tp=2)
    found = problems(dataclasses.replace(plan, stages=(tp_stage, *plan.stages[1:])))
    assert any("not a transformer block" in p for p in found)


def test_tp_form_on_a_block_the_engines_do_not_shard_is_refused() -> None:
    plan = _plan()
    shape = ir.BlockShape(64, 4, 2, 128, 16, gated=True, shardable=False)
    layers = (dataclasses.replace(plan.profile.layers[0], block=shape), *plan.profile.layers[1:])
    profile = dataclasses.replace(plan.profile, layers=layers)
    tp_stage = dataclasses.replace(plan.stages[0], forms=("tp", "dp"), tp=2)
    found = problems(dataclasses.replace(plan, profile=profile, stages=(tp_stage, *plan.stages[1:])))
    assert any("tensor parallelism does not shard its block" in p for p in found)


@given(st.integers(1, 3), st.integers(1, 4), st.sampled_from([4, 6, 8, 12]), st.sampled_from(["1f1b", "gpipe"]))
@settings(max_examples=15, deadline=None)
def test_search_and_compare_emit_only_runnable_plans(nodes: int, gpus: int, batch: int, schedule: str) -> None:
    profile = ir.ModelProfile.from_dict(make_profile_dict(5, batch_size=batch))
    cluster = cluster_from_dict(make_cluster_dict(nodes, gpus))
    assert problems(search(profile, cluster, schedule=schedule, candidates=2)) == []
    result = compare(profile, cluster, schedule=schedule, rerank=2)
    for row in result.strategies:
        if row.plan is not None and row.fits:
            assert problems(row.plan) == [], (row.name, problems(row.plan))


@pytest.mark.parametrize("preset", ["pipepar-4x2-2080ti", "pipedream-4x4-10g", "mixed-a100-v100-2080ti"])
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "zb-h1"])
def test_shipped_profiles_on_shipped_presets_give_runnable_plans(preset: str, schedule: str) -> None:
    cluster = load_cluster(preset)
    for name in ("vgg16-b64-2080ti", "mlp-b64-cpu"):
        profile = ir.ModelProfile.from_dict(read_json(f"profiles/{name}.json", "profile"))
        plan = search(profile, cluster, schedule=schedule, optimizer="adam", candidates=2)
        assert problems(plan) == [] and problems(plan, plan.engine) == []
    ds = search(profile, cluster, schedule="1f1b", engine="deepspeed", candidates=2)
    assert problems(ds, "deepspeed") == []


def test_when_each_engine_reduces_fsdp_gradients_once_a_step() -> None:
    """torch's schedules reduce ZeRO-2/3 gradients once a step; torchtitan runs them only with a pipeline
    (its FSDP alone without one), so only its plans of one stage run otherwise; DeepSpeed never."""
    from planner.runnable import ENGINES

    got = {name: (e.syncs_last_backward(True), e.syncs_last_backward(False), e.sync_depends_on_stages)
           for name, e in ENGINES.items()}
    assert got == {"torch": (True, True, False), "torchtitan": (True, False, True),
                   "deepspeed": (False, False, False)}


def test_torchtitan_runs_its_llama_only_with_every_block_sharded_and_the_sequence_too() -> None:
    """torchtitan trains its own Llama; under tensor parallelism every block takes the tp form with sequence
    parallelism, and one recomputation mode runs for the whole job."""

    plan = titan_plan([0, 8], tp=2, sequence_parallel=True)
    assert problems(plan) == []
    st = plan.stages[0]
    assert any("without the tp form" in p for p in problems(dataclasses.replace(
        plan, stages=(dataclasses.replace(st, forms=("dp", "dp", *st.forms[2:])),))))
    assert any("without sequence parallelism" in p for p in problems(dataclasses.replace(
        plan, stages=(dataclasses.replace(st, sequence_parallel=False),))))
    two = titan_plan([0, 4, 8], dp=1)
    mixed = dataclasses.replace(two, stages=(two.stages[0], dataclasses.replace(two.stages[1], recompute="full")))
    assert any("one recomputation mode" in p for p in problems(mixed))
    gpt = ir.ModelProfile.from_dict(make_profile_dict(8, batch_size=8))
    assert any("not a Llama-family model" in p for p in problems(dataclasses.replace(plan, profile=gpt)))
    qwen = dataclasses.replace(plan.profile, meta={"split_method": "structure:qwen2"})  # Llama's shape, not its blocks
    assert any("a qwen2 model with Llama's shape" in p for p in problems(dataclasses.replace(plan, profile=qwen)))
    old = dataclasses.replace(plan.profile, meta={})  # a profile from before the field: its shape decides
    assert problems(dataclasses.replace(plan, profile=old)) == []
    wide = dataclasses.replace(plan.profile, layers=tuple(  # heads of their own width (a Llama config's head_dim)
        dataclasses.replace(lp, block=dataclasses.replace(lp.block, head_dim=32)) if lp.block else lp
        for lp in plan.profile.layers))
    assert any("16 heads of 32 on a width of 256" in p for p in problems(dataclasses.replace(plan, profile=wide)))
    assert problems(dataclasses.replace(plan, profile=wide), "any") == []


@pytest.mark.parametrize(("layer", "form"), [(0, "dp"), (0, "split_out"), (-1, "dp"), (-1, "split_in")])
def test_torchtitan_shards_its_embeddings_and_heads_vocabulary_under_tensor_parallelism(layer: int, form: str) -> None:
    """torchtitan's Llama plan runs the embedding row-wise and the head column-wise with loss_parallel: a plan whose
    tensor group replicates either (dp) or splits the other dimension predicts a layout that does not run."""

    plan = titan_plan([0, 8], tp=2, sequence_parallel=True)
    st = plan.stages[0]
    forms = list(st.forms)
    forms[layer] = form
    wrong = dataclasses.replace(plan, stages=(dataclasses.replace(st, forms=tuple(forms)),))
    found = [p for p in problems(wrong) if "vocabulary sharded" in p]
    assert len(found) == 1 and form in found[0], problems(wrong)
    assert problems(wrong, "any") == []


@given(st.sampled_from([(1, 2), (1, 4), (2, 2)]), st.sampled_from([4, 8]), st.sampled_from([None, 1, 2]),
       st.sampled_from(["auto", "full"]))
@settings(max_examples=12, deadline=None)
def test_a_torchtitan_search_emits_plans_torchtitan_runs(shape: tuple[int, int], batch: int, tp: int | None,
                                                         recompute: str) -> None:

    profile = dataclasses.replace(llama_profile(blocks=4, heads=4, kv_heads=2), batch_size=batch)
    cluster = cluster_from_dict(make_cluster_dict(*shape))
    plan = search(profile, cluster, engine="torchtitan", optimizer="adam", tp=tp, recompute=recompute,
                  candidates=2)
    assert problems(plan) == [], problems(plan)
    assert all(s.sequence_parallel for s in plan.stages if s.tp > 1)
    first, last = plan.stages[0], plan.stages[-1]
    assert first.tp == 1 or first.forms[0] == "split_in"
    assert last.tp == 1 or last.forms[-1] == "split_out"
    with pytest.raises(Exception, match="not a Llama-family model"):
        search(ir.ModelProfile.from_dict(make_profile_dict(5, batch_size=batch)), cluster, engine="torchtitan",
               optimizer="adam")


def test_torchs_interleaved_schedules_need_micro_batches_in_whole_rounds() -> None:
    """torch's interleaved and zero-bubble classes run M in rounds of max(1, M // K): 7 on 2 ranks (3 rounds) fails."""
    for schedule in ("zb-h1", "interleaved"):
        for m, ok in ((7, False), (5, False), (6, True), (2, True), (1, True)):
            plan = dataclasses.replace(_plan(batch=2 * m, m=m, widths=(1, 1)), schedule=schedule)
            found = [p for p in problems(plan, "torch") if "rounds" in p]
            assert (found == []) == ok, (schedule, m, found)
            assert not [p for p in problems(plan, "any") if "rounds" in p]


@pytest.mark.parametrize(("field", "values", "refused", "widths"), [
    ("recompute", ("none", "full"), "selective", (1, 1)),
    ("zero", (0, 1, 2), 3, (2, 2)),
])
def test_torchs_zero_bubble_schedule_runs_neither_selective_recomputation_nor_zero_3(
        field: str, values: tuple[object, ...], refused: object, widths: tuple[int, int]) -> None:
    """ScheduleInterleavedZeroBubble backwards each stage twice (B, then W): a selective-checkpoint region refuses
    that at run time ("only allowed to backward once"), and under ZeRO-3 (FSDP resharding after forward) it trained
    other weights than one process (planner run --check: 1.7e-4 apart on an MLP, 2.4e-4 on GPT-2; ZeRO-2, and 1f1b
    under ZeRO-3, matched to 4e-8)."""
    plan = dataclasses.replace(_plan(batch=8, m=2, widths=widths), schedule="zb-h1")
    for value in (*values, refused):
        staged = dataclasses.replace(plan, stages=tuple(dataclasses.replace(s, **{field: value}) for s in plan.stages))
        found = [p for p in problems(staged, "torch") if "split backward" in p]
        assert (found == []) == (value != refused), (value, found)
        assert is_runnable(dataclasses.replace(staged, schedule="1f1b"), "torch")
    said = {"recompute": "stage 0 recomputes 'selective' under zb-h1", "zero": "stage 0 uses ZeRO stage 3 under zb-h1"}
    assert any(said[field] in p for p in problems(staged, "torch"))


def test_the_torch_export_splits_linear_and_embedding_layers_only() -> None:
    plan = _plan(tp=2, widths=(2, 2))
    split = dataclasses.replace(plan.stages[0], forms=("split_out", "dp"))
    for kind, ok in (("Linear", True), ("Embedding", True), ("Conv2d", False), ("Head", False)):
        layers = (dataclasses.replace(plan.profile.layers[0], type=kind), *plan.profile.layers[1:])
        edited = dataclasses.replace(plan, profile=dataclasses.replace(plan.profile, layers=layers),
                                     stages=(split, plan.stages[1]))
        found = [p for p in problems(edited, "torch") if "splits the weight of Linear, Embedding layers only" in p]
        assert (found == []) == ok, (kind, found)
        assert not [p for p in problems(edited, "any") if "layers only" in p]


def test_the_torch_export_splits_no_layer_that_shares_a_parameter() -> None:
    """A tie (GPT-2's embedding and head) on a split layer: torch's tensor parallelism would replace the head's
    weight with a new distributed one, and the two copies would train apart; any engine's plan keeps it."""
    plan = _plan(tp=2, widths=(2, 2))
    layers = tuple(dataclasses.replace(x, type="Linear") for x in plan.profile.layers)
    tie = ir.Tie("wte.weight", (0, 3), 10, 40)
    profile = dataclasses.replace(plan.profile, layers=layers, ties=(tie,))
    for forms, ok in ((("split_out", "dp"), True), (("dp", "split_out"), False)):
        tied_head = dataclasses.replace(plan.stages[1], forms=forms)
        edited = dataclasses.replace(plan, profile=profile, stages=(plan.stages[0], tied_head))
        found = [p for p in problems(edited, "torch") if "splits no tied layer" in p]
        assert (found == []) == ok, (forms, found)
        assert not [p for p in problems(edited, "any") if "tied" in p]


def test_a_torch_search_leaves_tied_layers_unsplit() -> None:
    """The cost model's table closes the split forms on a tied layer under torch's rules, not under any engine's."""
    from planner.cluster import group_of
    from planner.costmodel.layers import SPLIT_IN, SPLIT_OUT, Grid, layer_table
    from planner.runnable import ENGINES

    plan = _plan(tp=2, widths=(2, 2))
    layers = tuple(dataclasses.replace(x, type="Linear", in_features=8, out_features=8) for x in plan.profile.layers)
    profile = dataclasses.replace(plan.profile, layers=layers, ties=(ir.Tie("w", (0, 3), 10, 40),))
    grid = Grid(group_of(plan.cluster, plan.stages[0].devices), 2)
    torch = layer_table(profile, grid, 2, "sgd", rules=ENGINES["torch"].form_rules)
    free = layer_table(profile, grid, 2, "sgd")
    for layer in (0, 3):
        assert not torch.allowed[layer, [SPLIT_IN, SPLIT_OUT]].any()
        assert free.allowed[layer, [SPLIT_IN, SPLIT_OUT]].all()
    assert torch.allowed[1, [SPLIT_IN, SPLIT_OUT]].all()


def test_the_torch_export_splits_only_features_the_tensor_group_divides() -> None:
    """DTensor's column -> row styles fail on uneven shards (the row layer takes its uneven input for an even
    shard), so torch splits only a multiple of tp; any engine's plan (Megatron pads its vocabulary) keeps it."""
    plan = _plan(tp=2, widths=(2, 2))
    for form, (fin, fout), ok in (("split_out", (8, 8), True), ("split_out", (8, 7), False),
                                  ("split_in", (7, 8), False), ("split_in", (8, 7), True),
                                  ("split_out", (None, None), True)):  # no shape: the export checks the model
        layer = dataclasses.replace(plan.profile.layers[0], in_features=fin, out_features=fout)
        edited = dataclasses.replace(plan, profile=dataclasses.replace(
            plan.profile, layers=(layer, *plan.profile.layers[1:])),
            stages=(dataclasses.replace(plan.stages[0], forms=(form, "dp")), plan.stages[1]))
        found = [p for p in problems(edited, "torch") if "layer 0" in p and form in p]
        assert (found == []) == ok, (form, fin, fout, found)
        assert ok or "over tp 2; torch shards only a multiple of tp" in found[0]
        assert not [p for p in problems(edited, "any") if "layer 0" in p]


@given(st.lists(st.integers(1, 24), min_size=4, max_size=6), st.sampled_from([2, 4]))
@settings(max_examples=25, deadline=None)
def test_a_torch_search_splits_only_what_its_tensor_group_divides(widths: list[int], tp: int) -> None:
    """Layers of random widths (a chain of Linears): every split form a torch search emits gives equal shards, and
    the plan is one torch runs."""
    layers = make_profile_dict(len(widths) - 1, batch_size=8)["layers"]
    for i, layer in enumerate(layers):
        layer.update(in_features=widths[i], out_features=widths[i + 1], forward_s=0.01 * widths[i])
    profile = ir.ModelProfile.from_dict(make_profile_dict(len(layers), batch_size=8, layers=layers))
    cluster = cluster_from_dict(make_cluster_dict(1, tp))
    plan = search(profile, cluster, engine="torch", tp=tp, candidates=2)
    assert problems(plan, "torch") == []
    for st_ in plan.stages:
        for j, form in enumerate(st_.forms):
            x = profile.layers[st_.layers[0] + j]
            if form == "split_out":
                assert x.out_features is not None and x.out_features % st_.tp == 0
            if form == "split_in":
                assert x.in_features is not None and x.in_features % st_.tp == 0


def test_a_launcher_starts_as_many_processes_on_every_server() -> None:
    uneven = _plan(widths=(2, 1))  # n0.g0, n0.g1 | n1.g0: 2 on n0, 1 on n1
    for engine in ("torch", "deepspeed"):
        assert any("different numbers of processes per server (n0: 2, n1: 1)" in p for p in problems(uneven, engine))
    assert not [p for p in problems(uneven, "any") if "per server" in p]
    assert not [p for p in problems(_plan(widths=(2, 2)), "torch") if "per server" in p]


def test_a_search_whose_plans_all_break_an_engine_limit_says_which() -> None:
    """Servers of 3 and 1 GPUs, memory for about a layer each: the plans that fit span them 3 + 1, which torchrun
    cannot start; the search tries the even parts (3 GPUs of one server, 1 of each) and says so instead of
    emitting one."""
    from planner.errors import InfeasibleError

    profile = ir.ModelProfile.from_dict(make_profile_dict(4, batch_size=8))
    doc = make_cluster_dict(2, 3, 10**12)
    doc["nodes"][1]["gpus"] = doc["nodes"][1]["gpus"][:1]
    for node in doc["nodes"]:
        for gpu in node["gpus"]:
            gpu["memory_bytes"] = 3_000_000  # a layer's 1 MB of weights, its gradients and its activations
    cluster = cluster_from_dict(doc)
    assert {d for s in search(profile, cluster, candidates=4).stages for d in s.devices} == {
        "n0.g0", "n0.g1", "n0.g2", "n1.g0"}
    with pytest.raises(InfeasibleError, match=r"--engine torch starts as many processes on every server, so the "
                                              r"uneven servers were searched as 3 GPUs \(1 x 3\) and 2 GPUs \(2 x 1\)"):
        search(profile, cluster, engine="torch", candidates=4)


def _frozen_first_two(plan: ir.Plan) -> ir.Plan:
    """``plan`` on a profile whose first two layers (stage 0 of ``_plan``) are all frozen."""
    layers = tuple(dataclasses.replace(x, trainable_count=0) if i < 2 else x
                   for i, x in enumerate(plan.profile.layers))
    return dataclasses.replace(plan, profile=dataclasses.replace(plan.profile, layers=layers))


def test_deepspeed_runs_a_stage_that_trains_nothing_only_in_fp32_without_zero() -> None:
    """Its ZeRO and bf16/fp16 optimizers index their first parameter; torch runs such a stage either way."""
    plan = _frozen_first_two(_plan())
    assert not [p for p in problems(plan, "deepspeed") if "trains no weight" in p]
    for changed, what in ((dataclasses.replace(plan, precision="bf16"), "bf16"),
                          (dataclasses.replace(plan, stages=tuple(dataclasses.replace(s, zero=1)
                                                                  for s in plan.stages)), "ZeRO stage 1")):
        found = [p for p in problems(changed, "deepspeed") if "trains no weight" in p]
        assert found == [f"stage 0 trains no weight (all frozen), and deepspeed's {what} optimizer cannot step a "
                         "stage without any (fp32 without ZeRO can)"]
        assert not [p for p in problems(changed, "torch") if "trains no weight" in p]


def test_a_deepspeed_search_on_a_frozen_prefix_in_bf16_keeps_a_weight_to_train_in_every_stage() -> None:
    doc = make_profile_dict(6, batch_size=8)
    for i, layer in enumerate(doc["layers"]):
        layer.update(param_count=10**7, param_bytes=4 * 10**7, trainable_count=0 if i < 3 else 10**7)
    profile = ir.ModelProfile.from_dict(doc)
    cluster = cluster_from_dict(make_cluster_dict(1, 4, 2 * 10**8))
    plan = search(profile, cluster, engine="deepspeed", precision="bf16", candidates=4)
    assert problems(plan, "deepspeed") == []
    assert all(any(x.trainable_share > 0 for x in profile.layers[s.layers[0]:s.layers[1]]) for s in plan.stages)


def test_a_batch_norm_in_the_dp_form_of_a_tensor_group_is_no_engines_plan() -> None:
    """The dp form in a tensor group splits the micro-batch's samples over it, and a batch norm (a profile layer's
    ``batch_stats``) then takes statistics over each rank's share: the torch engine refuses such a plan when it
    launches, so every engine's check refuses it before; the cost model's own ``any`` keeps it (each device's
    share, as data parallelism does)."""
    plan = _plan(tp=2)
    norm = dataclasses.replace(plan.profile.layers[1], batch_stats=True)
    layers = (plan.profile.layers[0], norm, *plan.profile.layers[2:])
    plan = dataclasses.replace(plan, profile=dataclasses.replace(plan.profile, layers=layers))
    assert any("layer 1 (l1) runs the dp form in a tensor group of 2" in p and "batch norm" in p
               for p in problems(plan, "torch"))
    assert problems(plan) == []
    untouched = dataclasses.replace(plan, stages=(dataclasses.replace(plan.stages[0], tp=1), plan.stages[1]))
    assert not [p for p in problems(untouched, "torch") if "batch norm" in p]


def test_no_engine_runs_a_tensor_group_across_servers() -> None:
    """Megatron-LM, torchtitan and the torch export keep a tensor group on one server; the cost model's own plans
    (engine any: AccPar's baseline) may span them."""
    plan = _plan(widths=(4,), tp=2)
    stage = dataclasses.replace(plan.stages[0], devices=("n0.g0", "n1.g0", "n0.g1", "n1.g1"))
    mixed = dataclasses.replace(plan, stages=(stage,))
    assert any("spans servers n0, n1" in p for p in problems(mixed, "torch"))
    assert not [p for p in problems(mixed) if "spans servers" in p]
    assert not [p for p in problems(plan, "torch") if "spans servers" in p]


def test_a_torch_interleaved_plan_torch_would_run_in_another_order_is_refused() -> None:
    """K = 2 ranks at M = 3: torch's round of 3 warms rank 0 up with more chunk micro-batches than the simulated
    (Megatron) order holds (the search skipped such M; a written plan ran with more memory than predicted)."""
    def chunked(m: int) -> ir.Plan:
        base = _plan(batch=2 * m, m=m, widths=(1, 1))
        devices = [base.stages[0].devices, base.stages[1].devices] * 2
        stages = tuple(ir.Stage((i, i + 1), devices[i], ("dp",), 0) for i in range(4))
        return dataclasses.replace(base, schedule="interleaved", virtual_stages=2, stages=stages)

    assert any("warms up in rounds of 3 micro-batches, not 2" in p for p in problems(chunked(3), "torch"))
    assert not any("rounds" in p for p in problems(chunked(3), "any"))
    assert not any("rounds" in p for p in problems(chunked(4), "torch"))


def test_an_engine_answers_which_zero_stages_and_modes_it_runs_under_a_split_backward() -> None:
    """One home for zb-h1's narrower set (search's options and the runnable check both ask the engine): torch runs
    ZeRO 0-3 and every mode, under a split backward ZeRO 0-2 and none/full; torchtitan 0/2/3, there 0/2."""
    from planner.runnable import ENGINES

    torch, titan = ENGINES["torch"], ENGINES["torchtitan"]
    assert torch.zero_stages() == (0, 1, 2, 3) and torch.zero_stages(split_backward=True) == (0, 1, 2)
    assert torch.recompute_modes(split_backward=True) == ("none", "full")
    assert titan.zero_stages(split_backward=True) == (0, 2) and titan.recompute_modes() == titan.recompute


def test_a_micro_batch_below_the_models_min_batch_is_not_runnable() -> None:
    """A batch norm over (N, C) refuses one sample in training: a plan giving a rank fewer samples than the
    profile's min_batch would fail in a worker, so it is refused before (and a tensor group splitting them too)."""
    plan = _plan(batch=8, m=4)  # 1 sample per micro-batch on each of the 2 data-parallel ranks
    needy = dataclasses.replace(plan, profile=dataclasses.replace(plan.profile, min_batch=2))
    assert problems(plan) == []
    found = problems(needy)
    assert any("stage 0: a micro-batch of 1 sample(s) per data-parallel rank" in p and "min_batch" in p
               for p in found), found
    assert problems(dataclasses.replace(needy, microbatches=2)) == []
    split = _plan(batch=8, m=2, tp=2)  # 4 samples per micro-batch, split over the tensor group of 2: 2 each
    assert problems(dataclasses.replace(split, profile=dataclasses.replace(split.profile, min_batch=2))) == []
    found = problems(dataclasses.replace(split, profile=dataclasses.replace(split.profile, min_batch=4)))
    assert any("2 per rank, and the model trains on 4 or more" in p for p in found), found


@given(st.integers(1, 2), st.integers(1, 4), st.sampled_from([4, 8, 12, 16]), st.integers(1, 8),
       st.sampled_from(["any", "torch", "deepspeed"]))
@settings(max_examples=15, deadline=None)
def test_search_and_compare_keep_every_micro_batch_at_the_models_min_batch(
        nodes: int, gpus: int, batch: int, least: int, engine: str) -> None:
    from planner.errors import InfeasibleError

    profile = ir.ModelProfile.from_dict(make_profile_dict(5, batch_size=batch, min_batch=min(least, batch)))
    cluster = cluster_from_dict(make_cluster_dict(nodes, gpus))
    try:
        plan = search(profile, cluster, engine=engine, candidates=2)
    except InfeasibleError:  # e.g. torch's 1F1B on a batch too small for a micro-batch per stage
        return
    assert problems(plan, engine) == []
    assert all(plan.micro_batch_size(s) >= profile.min_batch * (s.tp if "dp" in s.forms else 1) for s in plan.stages)
    for row in compare(profile, cluster, rerank=2).strategies:
        if row.plan is not None and row.fits:
            assert all(row.plan.micro_batch_size(s) >= profile.min_batch for s in row.plan.stages), row.name


def test_a_search_of_a_model_that_needs_two_samples_finds_a_plan_with_two() -> None:
    """The search space itself leaves out micro-batches below min_batch, so the best plan that runs is found
    (not a plan of one sample per rank, refused afterwards)."""
    profile = ir.ModelProfile.from_dict(make_profile_dict(3, batch_size=8, min_batch=2))
    cluster = cluster_from_dict(make_cluster_dict(1, 2))
    for engine in ("any", "torch", "deepspeed"):
        for config in (None, "2", "1-1"):
            plan = search(profile, cluster, engine=engine, config=config, candidates=1)
            assert all(plan.micro_batch_size(s) >= 2 for s in plan.stages), (engine, config, plan.config)


def test_deepspeed_bf16_without_zero_needs_a_weight_of_the_stages_own_beside_tie_copies() -> None:
    """DeepSpeed builds a tie group as one module on every stage holding a member and counts its weights on the first
    such stage only; its bf16 optimizer without ZeRO then found no gradient on a later stage holding nothing else
    ("stack expects a non-empty TensorList": GPT-2's tied head alone on the last stage, measured)."""
    plan = _plan()
    tie = ir.Tie("w", (0, 3), 10, 40)
    frozen2 = tuple(dataclasses.replace(x, trainable_count=0) if i == 2 else x
                    for i, x in enumerate(plan.profile.layers))
    tied = dataclasses.replace(plan, precision="bf16",
                               profile=dataclasses.replace(plan.profile, layers=frozen2, ties=(tie,)))
    assert [p for p in problems(tied, "deepspeed") if "share a weight" in p] == [
        "stage 1 trains only layers that share a weight with an earlier stage (layer 3); deepspeed counts such a "
        "layer's every weight on the earlier stage, and its bf16 optimizer without ZeRO cannot step a stage left with "
        "none (use --zero 1, --precision fp32, or another --config)"]
    for fine in (dataclasses.replace(tied, precision="fp32"),  # its fp32 optimizer and ZeRO-1 ran such a stage
                 dataclasses.replace(tied, stages=tuple(dataclasses.replace(s, zero=1) for s in tied.stages)),
                 dataclasses.replace(tied, profile=dataclasses.replace(tied.profile, layers=plan.profile.layers))):
        assert not [p for p in problems(fine, "deepspeed") if "share a weight" in p]
    assert not [p for p in problems(tied, "torch") if "share a weight" in p]


@pytest.mark.parametrize("layers", [((0, 2), (2, 4), (4, 6)), ((0, 2), (3, 4))])
def test_stages_past_the_model_or_with_a_gap_are_reported_not_an_index_error(layers: tuple) -> None:
    """A hand-built plan whose stages run past the model's 4 layers (or skip one) raised IndexError in the per-layer
    form checks; the cover problem is the answer, and check_runnable a PlanError."""
    base = _plan(widths=(1,) * len(layers))
    stages = tuple(dataclasses.replace(st, layers=rng, forms=("dp",) * (rng[1] - rng[0]))
                   for st, rng in zip(base.stages, layers, strict=True))
    plan = dataclasses.replace(base, stages=stages)
    found = problems(plan, "torch")
    assert len(found) == 1 and ("cover layers" in found[0] or "contiguous" in found[0])
    with pytest.raises(PlanError):
        check_runnable(plan, "torch")


def test_a_plan_another_engine_refuses_names_the_engine_that_runs_it() -> None:
    """A DeepSpeed plan in fp16, which torch does not train (no loss scale): `planner run` (torch for another
    engine's plan) refused it only with "search ... --engine torch", not that DeepSpeed runs it."""
    plan = dataclasses.replace(_plan(), precision="fp16", engine="deepspeed")
    assert is_runnable(plan) and not is_runnable(plan, "torch")
    with pytest.raises(PlanError) as err:
        check_runnable(plan, "torch")
    assert "fp16" in str(err.value)
    assert "searched for deepspeed, which runs it (`planner export --to deepspeed`)" in err.value.hint
    assert "--engine torch" in err.value.hint
    bad = dataclasses.replace(plan, microbatches=3)  # its own engine refuses it too: no such claim
    with pytest.raises(PlanError) as err:
        check_runnable(bad, "torch")
    assert "which runs it" not in err.value.hint


def _with_sequence(profile: ir.ModelProfile, seq: int) -> ir.ModelProfile:
    return dataclasses.replace(profile, layers=tuple(
        dataclasses.replace(lp, block=dataclasses.replace(lp.block, seq_len=seq)) if lp.block else lp
        for lp in profile.layers))


def test_sequence_parallelism_needs_a_sequence_the_tensor_group_divides() -> None:
    """Megatron-LM's scatter along the sequence asserts whole shares and the torch export refuses uneven ones: a
    plan that cuts 7 tokens over tp 2 is not runnable on any engine; 8 tokens are."""
    plan = titan_plan([0, 8], tp=2, sequence_parallel=True)
    odd = dataclasses.replace(plan, profile=_with_sequence(plan.profile, 7))
    found = [p for p in problems(odd, "any") if "sequence of 7 tokens over tp 2" in p]
    assert len(found) == 1 and found[0].startswith("stage 0:"), problems(odd, "any")
    assert problems(dataclasses.replace(plan, profile=_with_sequence(plan.profile, 8)), "any") == []
    flat = dataclasses.replace(odd, stages=(dataclasses.replace(odd.stages[0], sequence_parallel=False),))
    assert problems(flat, "any") == []


@given(st.sampled_from([5, 6, 7, 8]), st.sampled_from([2, 4]), st.sampled_from(["torch", "any"]),
       st.sampled_from(["auto", "selective", "full"]), st.sampled_from(["1f1b", "zb-h1", "interleaved"]))
@settings(max_examples=16, deadline=None)
def test_a_search_shards_the_sequence_only_where_the_tensor_group_divides_it(seq: int, tp: int, engine: str,
                                                                              recompute: str, schedule: str) -> None:
    """``search --tp T --micro-batch-size 1`` of a Llama whose sequence T may not divide (7 tokens, tp 2): every plan
    it emits runs (a torch search planned sequence parallelism over 7 tokens, which the export refuses), and a stage
    shards the sequence only where it divides."""
    profile = _with_sequence(dataclasses.replace(llama_profile(blocks=2, hidden=64, heads=4, kv_heads=4),
                                                 batch_size=8), seq)
    cluster = cluster_from_dict(make_cluster_dict(1, 4))
    plan = search(profile, cluster, engine=engine, tp=tp, micro_batch_size=1, recompute=recompute,
                  schedule=schedule, candidates=2)
    assert problems(plan) == [], problems(plan)
    assert all(seq % s.tp == 0 for s in plan.stages if s.sequence_parallel)
    assert any(s.sequence_parallel for s in plan.stages) or seq % tp or engine == "any" or recompute == "full"


def test_torchtitan_runs_a_sequence_of_a_multiple_of_twice_the_tensor_degree() -> None:
    """torchtitan 0.2.0's parallelize_llama asserts ``seq_len % (tp * 2 * cp) == 0`` (ParallelDims.seq_len_divisor)
    at every tensor degree: 6 tokens run at tp 1, not at tp 2; 7 tokens at none; torch runs 6 tokens at tp 2."""
    plan = titan_plan([0, 8], tp=2, sequence_parallel=True)
    six = dataclasses.replace(plan, profile=_with_sequence(plan.profile, 6))
    assert [p for p in problems(six) if "multiple of 4 (tp 2)" in p], problems(six)
    assert not [p for p in problems(six, "torch") if "sequence" in p], problems(six, "torch")
    one = titan_plan([0, 8], dp=2)
    assert problems(dataclasses.replace(one, profile=_with_sequence(one.profile, 6))) == []
    seven = dataclasses.replace(one, profile=_with_sequence(one.profile, 7))
    assert [p for p in problems(seven) if "7 tokens are not a multiple of 2 (tp 1)" in p], problems(seven)


@pytest.mark.parametrize("seq", [6, 7, 12])
def test_a_torchtitan_search_keeps_the_tensor_degree_its_sequence_runs_at(seq: int) -> None:
    """A torchtitan search of a sequence of 6 tokens keeps to tp 1 (it emitted tp 2, which torchtitan's assertion
    stops); --tp 2 is refused before searching; 7 tokens run at no degree, refused too; 12 run at tp 2."""
    profile = _with_sequence(dataclasses.replace(llama_profile(blocks=2, hidden=64, heads=4, kv_heads=4),
                                                 batch_size=8), seq)
    cluster = cluster_from_dict(make_cluster_dict(1, 4))
    if seq == 7:
        with pytest.raises(UsageError, match="7 tokens are not a multiple of 2"):
            search(profile, cluster, engine="torchtitan", optimizer="adam", candidates=2)
        return
    for tp in (None, 2, 4):
        if seq % (2 * tp if tp else 1):
            with pytest.raises(UsageError, match=f"not a multiple of {2 * tp}"):
                search(profile, cluster, engine="torchtitan", optimizer="adam", tp=tp, candidates=2)
            continue
        plan = search(profile, cluster, engine="torchtitan", optimizer="adam", tp=tp, micro_batch_size=1,
                      candidates=2)
        assert problems(plan) == [] and all(seq % (2 * s.tp) == 0 for s in plan.stages), plan.stages

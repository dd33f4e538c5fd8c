"""export.deepspeed: the plan's exact stage boundaries, its config, and what DeepSpeed cannot run."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import tempfile
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from planner.errors import ExportError
from planner.export import deepspeed as dsx
from planner.export.data import data_spec, sub_batch
from planner.export.layers import load_layers
from planner.export.partition import boundaries
from planner.runner import max_rel_diff, run_plan
from tests.conftest import weights_agree
from tests.test_export_parallel_runs import measured_plan
from tests.test_export_quoting import HOSTILE, check_script
from tests.test_export_torch import TRANSPOSED
from tests.test_runner import tiny_plan

pytest.importorskip("deepspeed")


def test_config_micro_batch_accumulation_and_optimizer() -> None:
    plan = tiny_plan("tiny_mlp", [0, 2, -1], width=2, microbatches=2, batch=8, optimizer="adam")
    cfg = dsx.ds_config(plan)
    assert cfg["train_batch_size"] == 8
    assert cfg["train_micro_batch_size_per_gpu"] == 2  # 8 / (2 micro-batches x 2 replicas)
    assert cfg["gradient_accumulation_steps"] == 2
    assert cfg["optimizer"]["type"] == "Adam" and cfg["optimizer"]["params"]["torch_adam"] is True  # no FusedAdam
    assert cfg["gradient_clipping"] == 0.0
    assert cfg["zero_optimization"] == {"stage": 0} and "bf16" not in cfg


def test_torchs_fused_adam_runs_unless_told_otherwise() -> None:
    plan = tiny_plan("tiny_mlp", [0, 2, -1], width=2, microbatches=2, batch=8, optimizer="adam")
    fused = dsx.with_fused_adam(dsx.ds_config(plan))["optimizer"]["params"]
    assert fused["fused"] is True and fused["torch_adam"] is True  # torch's fused kernel, not DeepSpeed's op
    told = dsx.ds_config(plan)
    told["optimizer"]["params"]["fused"] = False
    assert dsx.with_fused_adam(told)["optimizer"]["params"]["fused"] is False
    sgd = dsx.ds_config(dataclasses.replace(plan, optimizer="sgd"))
    assert "fused" not in dsx.with_fused_adam(sgd)["optimizer"]["params"]


def test_config_carries_zero_1_and_bf16() -> None:
    plan = tiny_plan("tiny_mlp", [0, 2, -1], width=2)
    plan = dataclasses.replace(plan, precision="bf16",
                               stages=tuple(dataclasses.replace(s, zero=1) for s in plan.stages))
    cfg = dsx.ds_config(plan)
    assert cfg["bf16"] == {"enabled": True}
    # ZeRO-1's two fp32 reduction buffers bounded by the model (DeepSpeed's 5e8 elements: 3.8 GB a rank)
    assert cfg["zero_optimization"] == {"stage": 1, "reduce_bucket_size": plan.profile.param_count}


def test_stage_inputs_are_cast_to_the_compute_dtype_and_token_ids_stay_integers() -> None:
    """DeepSpeed's bf16/fp16 weights meet float inputs in their dtype (a float MLP input once met bf16 weights:
    "mat1 and mat2 must have the same dtype"); token ids and fp32 plans are left alone."""
    x, ids = torch.randn(2, 3), torch.randint(0, 5, (2, 3))
    assert dsx.to_compute_dtype(x, dsx.COMPUTE_DTYPES["bf16"]).dtype == torch.bfloat16
    assert dsx.to_compute_dtype(x, dsx.COMPUTE_DTYPES["fp16"]).dtype == torch.float16
    assert dsx.to_compute_dtype(ids, torch.bfloat16).dtype == torch.int64
    assert dsx.to_compute_dtype(x, dsx.COMPUTE_DTYPES.get("fp32")) is x
    pair = dsx.to_compute_dtype((x, ids), torch.bfloat16)
    assert isinstance(pair, tuple) and [t.dtype for t in pair] == [torch.bfloat16, torch.int64]
    grad = x.clone().requires_grad_()
    dsx.to_compute_dtype(grad, torch.bfloat16).sum().backward()  # the cast stays in the graph
    assert grad.grad is not None and grad.grad.dtype == torch.float32


def test_zero_1s_buffers_are_bounded_and_charged_as_the_export_writes_them() -> None:
    """The cost model charges a DeepSpeed ZeRO-1 stage the two fp32 buffers of the reduce_bucket_size the
    export writes: at most the model's parameters, at most 5e7 elements (and, for fp32 weights, its fp32
    copy of the partition, ``W / d``)."""
    from planner import grad_buffers
    from planner.costmodel import stage_cost_values

    assert grad_buffers.deepspeed_bucket_params(10**6) == 10**6
    assert grad_buffers.deepspeed_bucket_params(10**10) == grad_buffers.DEEPSPEED_ZERO1_BUCKET_PARAMS == 5 * 10**7
    plan = tiny_plan("tiny_mlp", [0, 2, -1], width=2)
    one = dataclasses.replace(plan.stages[0], zero=1)
    zero = dataclasses.replace(plan.stages[0], zero=0)
    costs = {e: [stage_cost_values(plan.profile, plan.cluster, st, 2, "sgd", None, engine=e).static_bytes
                 for st in (zero, one)] for e in ("deepspeed", "any")}
    buffers = 2 * 4 * dsx.ds_config(dataclasses.replace(plan, stages=tuple(
        dataclasses.replace(s, zero=1) for s in plan.stages)))["zero_optimization"]["reduce_bucket_size"]
    partition = stage_cost_values(plan.profile, plan.cluster, one, 2, "sgd", None).weight_bytes / one.dp
    assert costs["deepspeed"][1] - costs["any"][1] == pytest.approx(buffers + partition, abs=1)
    assert costs["deepspeed"][0] == costs["any"][0]


def test_zero_above_1_selective_recompute_and_tensor_parallel_stages_are_refused() -> None:
    base = tiny_plan("tiny_mlp", [0, 2, -1], width=2)
    for change, words in (({"zero": 2}, "ZeRO stage 2"), ({"recompute": "selective"}, "recomputes 'selective'"),
                          ({"tp": 2, "forms": ("split_out", "split_in")}, "tensor parallel (tp 2")):
        plan = dataclasses.replace(base, stages=tuple(dataclasses.replace(s, **change) for s in base.stages))
        with pytest.raises(ExportError, match=words.replace("(", r"\(")) as err:
            dsx.check_plan(plan)
        assert "--engine deepspeed" in err.value.hint


def test_split_forms_are_refused_naming_the_stage() -> None:
    plan = tiny_plan("tiny_mlp", [0, 2, -1], width=2, forms=[["dp", "dp"], ["split_out", "dp"]])
    with pytest.raises(ExportError) as err:
        dsx.check_plan(plan)
    assert "stage 1" in err.value.cause and "--engine deepspeed" in err.value.hint


def test_unequal_widths_are_refused() -> None:
    plan = tiny_plan("tiny_mlp", [0, 2, -1], width=1)
    stages = (plan.stages[0], type(plan.stages[1])(plan.stages[1].layers, ("n0.g1", "n0.g2"), plan.stages[1].forms, 0))
    bad = dataclasses.replace(plan, stages=stages)
    with pytest.raises(ExportError, match="stage 1 is a tp 1 x dp 2 grid"):
        dsx.check_plan(bad)


def test_schedule_without_deepspeed_equivalent_is_refused() -> None:
    with pytest.raises(ExportError, match="pipedream"):
        dsx.check_plan(tiny_plan("tiny_mlp", [0, 2, -1], schedule="pipedream"))


def test_micro_batches_that_do_not_divide_are_refused() -> None:
    with pytest.raises(ExportError, match="not 3 micro-batches x 2 data-parallel ranks"):
        dsx.check_plan(tiny_plan("tiny_mlp", [0, 2, -1], width=2, microbatches=3, batch=9))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _partition_worker(rank: int, world: int, port: int, plan_json: str, out: str) -> None:
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "DS_ACCELERATOR": "cpu"})
    import sys

    import deepspeed
    import deepspeed.comm.torch

    from planner import ir

    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo")
    plan = ir.Plan.from_dict(json.loads(plan_json))
    torch.manual_seed(0)
    from tests.test_runner import tiny_mlp

    model, example = tiny_mlp()
    module = dsx.build_pipeline_module(model, plan, "cross_entropy", example_input=example)
    local = sorted(int(n.split(".")[0]) for n, _ in module.named_parameters())
    interval = module.activation_checkpoint_interval
    chunks = [module.forward_funcs[i:i + interval] for i in range(0, len(module.forward_funcs), interval or 1)]
    Path(out, f"rank{rank}.json").write_text(json.dumps({
        "parts": list(module.parts), "start": module._local_start, "stop": module._local_stop,
        "layers": sorted(set(local)), "interval": interval,
        "checkpointed": [module._is_checkpointable(c) for c in chunks] if interval else []}))
    torch.distributed.barrier()


@pytest.mark.slow
def test_each_rank_builds_exactly_the_plans_layer_range() -> None:
    """DeepSpeed's own methods would split 4 layers 2/1/1 or by parameters; the plan says [0,1) [1,3) [3,4).
    Under full recomputation a model without transformer blocks checkpoints each stage as one chunk (GPipe), as
    the cost model counts it (``ModelProfile.blockwise_recompute``)."""
    plan = tiny_plan("tiny_mlp", [0, 1, 3, 4])
    plan = dataclasses.replace(plan, stages=tuple(dataclasses.replace(s, recompute="full") for s in plan.stages))
    assert boundaries(plan) == [0, 1, 3, 4] and not plan.profile.blockwise_recompute
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_partition_worker, args=(3, _free_port(), json.dumps(plan.to_dict()), out), nprocs=3,
                           join=True, start_method="spawn")
        got = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(3)]
    assert [g["parts"] for g in got] == [[0, 1, 3, 4]] * 3
    assert [(g["start"], g["stop"]) for g in got] == [(0, 1), (1, 3), (3, 4)]
    assert [g["layers"] for g in got] == [[0], [1, 2], [3]]
    assert [(g["interval"], g["checkpointed"]) for g in got] == [(1, [True]), (2, [True]), (1, [True])]


def test_script_explains_itself_and_names_both_launchers() -> None:
    text = dsx.script_text(tiny_plan("tiny_mlp", [0, 2, -1], width=2))
    assert "torchrun --standalone --nproc_per_node 4" in text and "deepspeed --num_gpus 4" in text
    assert "[0, 2), [2, 4)" in text
    compile(text, "train.py", "exec")


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_model_name_stays_text(name: str) -> None:
    """Quotes, triple quotes, backslashes or newlines in the plan's model name once broke train.py (or ran code)."""
    plan = tiny_plan("tiny_mlp", [0, 2, -1], width=2)
    hostile = dataclasses.replace(plan, profile=dataclasses.replace(plan.profile, model=name))
    check_script(dsx.script_text(hostile), dsx.script_text(plan), name)


def _grid_worker(rank: int, world: int, port: int, plan_json: str, out: str) -> None:
    """Build the engine for a tiny GPT-2 plan, train 3 steps; write the losses and what DeepSpeed runs."""
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "DS_ACCELERATOR": "cpu"})
    import deepspeed

    from planner import ir
    from planner.export.layers import load_layers

    dsx.skip_shm_build()
    deepspeed.init_distributed(dist_backend="gloo")
    torch.set_num_threads(1)
    plan = ir.Plan.from_dict(json.loads(plan_json))
    layers, example = load_layers(plan.model, plan, 0)
    spec = data_spec(layers, example, "cross_entropy")
    module = dsx.build_pipeline_module(list(layers), plan, "cross_entropy")
    engine, _, _, _ = deepspeed.initialize(model=module, config=dsx.ds_config(plan, 0.3),
                                           model_parameters=dsx.optimizer_params(module))
    m, width = plan.microbatches, engine.grid.get_data_parallel_world_size()
    replica = engine.grid.get_data_parallel_rank()
    losses = []
    for s in range(3):
        x, y = spec.batch(s, plan.batch_size, 0)
        data = [(sub_batch(x, i, replica, m, width), sub_batch(y, i, replica, m, width))
                for i in range(m)]
        losses.append(float(engine.train_batch(data_iter=iter(data))))
    Path(out, f"rank{rank}.json").write_text(json.dumps({
        "pp": engine.grid.get_pipe_parallel_rank(), "dp": replica, "layers": [module._local_start, module._local_stop],
        "zero": engine.zero_optimization_stage(), "bf16": engine.bfloat16_enabled(),
        "weights": str(next(module.parameters()).dtype), "optimizer": type(engine.optimizer).__name__,
        "checkpoint_interval": module.activation_checkpoint_interval,
        "checkpointed": list(module.is_checkpointable_results), "losses": losses}))
    torch.distributed.barrier()


@pytest.mark.slow
def test_pipe_by_data_grid_with_zero1_bf16_and_full_recompute_trains_like_one_process() -> None:
    """pp 2 x dp 2 on a tied tiny GPT-2: each rank's coordinates, layers, ZeRO stage, bf16 weights with
    DeepSpeed's BF16 optimizer (fp32 master weights) and checkpoint interval are the plan's; the losses are
    single-process fp32 training's within the bf16 tolerance of tests/test_export_grids.py."""
    from tests.test_export_grids import BF16_TOL, grid_plan, reference

    plan = grid_plan("tiny_gpt2", [0, 2, 6], dp=2, zero=1, recompute="full", precision="bf16")
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_grid_worker, args=(4, _free_port(), json.dumps(plan.to_dict()), out), nprocs=4,
                           join=True, start_method="spawn")
        got = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(4)]
    assert [(g["pp"], g["dp"], g["layers"]) for g in got] == [(0, 0, [0, 2]), (0, 1, [0, 2]), (1, 0, [2, 6]),
                                                             (1, 1, [2, 6])]
    assert {(g["zero"], g["bf16"], g["weights"], g["optimizer"]) for g in got} == {
        (1, True, "torch.bfloat16", "DeepSpeedZeroOptimizer")}  # ZeRO-1 keeps fp32 master partitions
    # full recomputation checkpoints each layer up to the last block (a model with blocks, as the cost model
    # counts it: ModelProfile.blockwise_recompute); the head runs as it is
    assert [g["checkpoint_interval"] for g in got] == [1, 1, 1, 1]
    assert [g["checkpointed"] for g in got] == [[True, True], [True, True], [True, True, True, False],
                                                [True, True, True, False]]
    diff = max_rel_diff(got[-1]["losses"], reference(plan))
    print(f"deepspeed pp2 x dp2 zero1 bf16 full recompute: max relative loss difference {diff:.2e}")
    assert diff < BF16_TOL


@pytest.mark.slow
def test_a_first_stage_whose_weights_are_all_frozen_trains_like_one_process() -> None:
    """Fine-tuning with frozen embeddings as stage 0 of 2: DeepSpeed's optimizer gets an empty group there (torch's
    refuse an empty list) and its backward runs through an output that needed no gradient."""
    from tests.test_export_grids import grid_plan, reference

    plan = grid_plan("tiny_gpt2_frozen", [0, 1, 6])
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_grid_worker, args=(2, _free_port(), json.dumps(plan.to_dict()), out), nprocs=2,
                           join=True, start_method="spawn")
        got = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(2)]
    assert max_rel_diff(got[-1]["losses"], reference(plan)) < 1e-5


def test_a_stage_without_trainable_weights_is_refused_in_bf16_and_under_zero_naming_it() -> None:
    """DeepSpeed's bf16 and fp16 optimizers fail on a stage with nothing to step ("stack expects a non-empty
    TensorList"), its ZeRO-1 too ("list index out of range"); fp32 without ZeRO runs it (the test above)."""
    from tests.test_export_grids import grid_plan

    plan = grid_plan("tiny_gpt2_frozen", [0, 1, 6], precision="bf16")
    layers, _ = load_layers(plan.model, plan, 0)
    with pytest.raises(ExportError, match=r"stage 0 \(layer 0\) has no trainable weights.*bf16 optimizer"):
        dsx.check_trainable(layers, plan)
    with pytest.raises(ExportError, match=r"stage 0 \(layer 0\) has no trainable weights.*ZeRO stage 1 optimizer"):
        dsx.check_trainable(layers, grid_plan("tiny_gpt2_frozen", [0, 1, 6], dp=2, zero=1))
    dsx.check_trainable(layers, dataclasses.replace(plan, precision="fp32"))


@pytest.mark.slow
def test_a_stage_whose_output_is_not_contiguous_sends_it_and_trains_like_one_process() -> None:
    """Cut after a transpose: gloo's send refused the stage's non-contiguous output; it is sent contiguous."""
    plan = measured_plan(TRANSPOSED, [0, 2, 3], engine="deepspeed")
    doc = run_plan(plan, TRANSPOSED, engine="deepspeed", steps=3, warmup=1, check=True)
    assert doc["world_size"] == 2 and doc["max_rel_loss_diff"] < 1e-5 and weights_agree(doc), doc

"""export.deepspeed: the plan's exact stage boundaries, its config, and what DeepSpeed cannot run."""

from __future__ import annotations

import json
import os
import socket
import tempfile
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from planner.errors import ExportError
from planner.export import deepspeed as dsx
from planner.export.partition import boundaries
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


def test_split_forms_are_refused_naming_the_stage() -> None:
    plan = tiny_plan("tiny_mlp", [0, 2, -1], width=2, forms=[["dp", "dp"], ["split_out", "dp"]])
    with pytest.raises(ExportError) as err:
        dsx.check_plan(plan)
    assert "stage 1" in err.value.cause and "--engine deepspeed" in err.value.hint


def test_unequal_widths_are_refused() -> None:
    plan = tiny_plan("tiny_mlp", [0, 2, -1], width=1)
    stages = (plan.stages[0], type(plan.stages[1])(plan.stages[1].layers, ("n0.g1", "n0.g2"), plan.stages[1].forms, 0))
    import dataclasses

    bad = dataclasses.replace(plan, stages=stages)
    with pytest.raises(ExportError, match="stage 1 has 2 devices"):
        dsx.check_plan(bad)


def test_schedule_without_deepspeed_equivalent_is_refused() -> None:
    with pytest.raises(ExportError, match="pipedream"):
        dsx.check_plan(tiny_plan("tiny_mlp", [0, 2, -1], schedule="pipedream"))


def test_micro_batches_that_do_not_divide_are_refused() -> None:
    with pytest.raises(ExportError, match="equal size"):
        dsx.check_plan(tiny_plan("tiny_mlp", [0, 2, -1], width=2, microbatches=3, batch=9))


def test_tied_layers_become_tied_layer_specs() -> None:
    from deepspeed.pipe import TiedLayerSpec

    from tests.test_runner import tiny_tied

    torch.manual_seed(0)
    model, _ = tiny_tied()
    layers = list(model.children())
    specs = dsx.layer_specs(layers)
    tied = [i for i, s in enumerate(specs) if isinstance(s, TiedLayerSpec)]
    assert tied == [0, 3]
    assert specs[0].key == specs[3].key
    holder = specs[0].build()
    assert holder.members[0] is layers[0] and holder.members[1] is layers[3]
    (attr,) = specs[0].tied_weight_attr
    assert dsx.TieHolder.get_parameter(holder, attr) is layers[0].emb.weight
    assert [isinstance(s, nn.Module) for s in specs] == [False, True, True, False]


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
    Path(out, f"rank{rank}.json").write_text(json.dumps({
        "parts": list(module.parts), "start": module._local_start, "stop": module._local_stop,
        "layers": sorted(set(local))}))
    torch.distributed.barrier()


@pytest.mark.slow
def test_each_rank_builds_exactly_the_plans_layer_range() -> None:
    """DeepSpeed's own methods would split 4 layers 2/1/1 or by parameters; the plan says [0,1) [1,3) [3,4)."""
    plan = tiny_plan("tiny_mlp", [0, 1, 3, 4])
    assert boundaries(plan) == [0, 1, 3, 4]
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_partition_worker, args=(3, _free_port(), json.dumps(plan.to_dict()), out), nprocs=3,
                           join=True, start_method="spawn")
        got = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(3)]
    assert [g["parts"] for g in got] == [[0, 1, 3, 4]] * 3
    assert [(g["start"], g["stop"]) for g in got] == [(0, 1), (1, 3), (3, 4)]
    assert [g["layers"] for g in got] == [[0], [1, 2], [3]]


def test_script_explains_itself_and_names_both_launchers() -> None:
    text = dsx.script_text(tiny_plan("tiny_mlp", [0, 2, -1], width=2))
    assert "torchrun --standalone --nproc_per_node 4" in text and "deepspeed --num_gpus 4" in text
    assert "[0, 2), [2, 4)" in text
    compile(text, "train.py", "exec")

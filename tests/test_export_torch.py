"""export.torch: pipelining stages, schedule classes, DTensor split forms, refusals."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from planner import ir
from planner.errors import ExportError
from planner.export import torch as tx
from planner.runner import run_plan
from tests.conftest import weights_agree
from tests.test_export_parallel_runs import measured_plan
from tests.test_export_quoting import HOSTILE, check_script
from tests.test_runner import tiny_plan


class TokenMix(nn.Module):
    """Mixes the tokens of each feature (a Linear over the sequence): its output is a transpose, not contiguous."""

    def __init__(self, seq: int) -> None:
        super().__init__()
        self.mix = nn.Linear(seq, seq)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.mix(x.transpose(1, 2))).transpose(1, 2)


def tiny_transposed() -> tuple[nn.Module, torch.Tensor]:
    """A token model whose second layer's output is non-contiguous (as an LSTM's with batch_first)."""
    return nn.Sequential(nn.Embedding(20, 16), TokenMix(6), nn.Linear(16, 20)), torch.randint(0, 20, (8, 6))


TRANSPOSED = "tests.test_export_torch:tiny_transposed"


def tiny_frozen_first() -> tuple[nn.Module, torch.Tensor]:
    """An MLP whose first two layers are frozen (fine-tuning its head): a first stage of them trains nothing."""
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    for param in model[:3].parameters():
        param.requires_grad_(False)
    return model, torch.randn(8, 8)


FROZEN_FIRST = "tests.test_export_torch:tiny_frozen_first"


def test_schedule_classes_exist_in_this_torch() -> None:
    from torch.distributed import pipelining

    for name in tx.SCHEDULES.values():
        assert hasattr(pipelining, name)


def test_pipedream_has_no_torch_equivalent() -> None:
    with pytest.raises(ExportError) as err:
        tx.check_plan(tiny_plan("tiny_mlp", [0, 2, -1], schedule="pipedream"))
    assert "--engine torch" in err.value.hint


def test_unequal_widths_are_refused() -> None:
    plan = tiny_plan("tiny_mlp", [0, 2, -1])
    stages = (plan.stages[0], ir.Stage(plan.stages[1].layers, ("n0.g1", "n0.g2"), plan.stages[1].forms, 0))
    with pytest.raises(ExportError, match="stage 1 is a tp 1 x dp 2 grid") as err:
        tx.check_plan(dataclasses.replace(plan, stages=stages))
    assert "--engine torch" in err.value.hint


def test_split_form_on_a_convolution_is_refused_naming_stage_and_layer() -> None:
    plan = tiny_plan("tiny_mlp", [0, 2, -1], width=2, forms=[["dp", "split_out"], ["split_out", "dp"]])
    layers = [nn.Linear(16, 32), nn.Linear(32, 32), nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()), nn.Linear(4, 10)]
    with pytest.raises(ExportError) as err:
        tx.check_plan(plan, layers)
    assert "stage 1: layer 2" in err.value.cause and "Conv2d" in err.value.cause


def test_split_needs_features_divisible_by_width() -> None:
    plan = tiny_plan("tiny_mlp", [0, 2, -1], width=2, forms=[["split_out", "dp"], ["dp", "split_in"]])
    layers = [nn.Linear(16, 33), nn.Linear(33, 32), nn.Linear(32, 32), nn.Linear(32, 10)]
    with pytest.raises(ExportError, match="33 output features"):
        tx.check_plan(plan, layers)


def test_dp_forms_in_a_tensor_group_need_samples_it_divides() -> None:
    """A dp-form layer in a tensor group of 2 computes half of each micro-batch: one sample per rank cannot split."""
    plan = tiny_plan("tiny_mlp", [0, 2, -1], width=2, batch=2, forms=[["split_out", "split_in"], ["split_out", "dp"]])
    with pytest.raises(ExportError, match=r"layer 3 runs the dp form, which splits a micro-batch's 1 samples over "
                                          r"the tensor group of 2") as err:  # planner.runnable's shared rule
        tx.check_plan(plan)
    assert "micro-batch size divisible by 2" in str(err.value)


def test_batch_norm_in_a_dp_form_inside_a_tensor_group_is_refused() -> None:
    """Splitting the samples would change a batch norm's statistics: refused, not silently replicated."""
    plan = tiny_plan("tiny_mlp", [0, 2, -1], width=2, forms=[["split_out", "split_in"], ["split_out", "dp"]])
    layers = [nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 32), nn.Sequential(nn.BatchNorm1d(32),
                                                                                     nn.Linear(32, 10))]
    with pytest.raises(ExportError, match=r"stage 1: layer 3 .* its batch norm takes statistics"):
        tx.check_plan(plan, layers)
    tx.check_plan(tiny_plan("tiny_mlp", [0, 2, -1], width=2), layers)  # plain data parallelism splits nothing more


def test_data_parallel_degree_is_the_grids_dp() -> None:
    assert tx.check_plan(tiny_plan("tiny_mlp", [0, 2, -1], width=2)) == 2
    split = tiny_plan("tiny_mlp", [0, 2, -1], width=2, forms=[["split_out", "split_in"], ["split_out", "dp"]])
    assert tx.check_plan(split) == 1 and tx.tensor_parallel(split)


def test_fp16_is_refused_with_the_reason() -> None:
    plan = dataclasses.replace(tiny_plan("tiny_mlp", [0, 2, -1]), precision="fp16")
    with pytest.raises(ExportError, match="torch trains in fp32, bf16, not fp16") as err:
        tx.check_plan(plan)
    assert "--engine torch" in err.value.hint


def test_script_names_the_schedule_class() -> None:
    text = tx.script_text(tiny_plan("tiny_mlp", [0, 2, -1], schedule="gpipe"))
    assert "ScheduleGPipe" in text and "torchrun --standalone --nproc_per_node 2" in text
    compile(text, "train.py", "exec")



@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_model_name_stays_text(name: str) -> None:
    """Quotes, triple quotes, backslashes or newlines in the plan's model name once broke train.py (or ran code)."""
    plan = tiny_plan("tiny_mlp", [0, 2, -1])
    hostile = dataclasses.replace(plan, profile=dataclasses.replace(plan.profile, model=name))
    check_script(tx.script_text(hostile), tx.script_text(plan), name)

@pytest.mark.slow
def test_torch_split_forms_match_single_process() -> None:
    """2 stages x 2 devices; Colwise/Rowwise sharded Linears (DTensor), GPipe schedule; losses equal."""
    plan = tiny_plan("tiny_mlp", [0, 2, -1], width=2, schedule="gpipe",
                     forms=[["split_out", "split_in"], ["split_out", "dp"]])
    doc = run_plan(plan, "tests.test_runner:tiny_mlp", engine="torch", steps=3, warmup=1, check=True)
    assert doc["world_size"] == 4 and doc["max_rel_loss_diff"] < 1e-5 and weights_agree(doc), doc


@pytest.mark.slow
def test_torch_data_parallel_pipelines_with_tied_weights_match_single_process() -> None:
    plan = tiny_plan("tiny_tied", [0, 1, -1], width=2, schedule="1f1b")
    doc = run_plan(plan, "tests.test_runner:tiny_tied", engine="torch", steps=3, warmup=1, check=True)
    assert doc["engine"] == "torch" and doc["max_rel_loss_diff"] < 1e-5 and weights_agree(doc), doc
    assert torch.isfinite(torch.tensor(doc["losses"])).all()


@pytest.mark.slow
def test_interleaved_virtual_stages_match_single_process() -> None:
    """4 chunks on 2 devices (chunk c on device c mod 2) with ScheduleInterleaved1F1B."""
    p = tiny_plan("tiny_mlp", [0, 1, 2, 3, 4], microbatches=4)
    stages = tuple(dataclasses.replace(s, devices=("n0.g0",) if i % 2 == 0 else ("n0.g1",))
                   for i, s in enumerate(p.stages))
    plan = dataclasses.replace(p, stages=stages, virtual_stages=2, schedule="interleaved")
    doc = run_plan(plan, "tests.test_runner:tiny_mlp", engine="torch", steps=3, warmup=1, check=True)
    assert doc["world_size"] == 2 and doc["max_rel_loss_diff"] < 1e-5 and weights_agree(doc), doc


@pytest.mark.slow
def test_a_stage_whose_output_is_not_contiguous_sends_it_and_trains_like_one_process() -> None:
    """Cut after a transpose: torch pipelining once received into a buffer with the sender's strides ("input
    tensor has to be contiguous"); every stage but the last now sends its output contiguous."""
    plan = measured_plan(TRANSPOSED, [0, 2, 3])
    doc = run_plan(plan, TRANSPOSED, engine="torch", steps=3, warmup=1, check=True)
    assert doc["world_size"] == 2 and doc["max_rel_loss_diff"] < 1e-5 and weights_agree(doc), doc


@pytest.mark.slow
def test_zero_bubble_after_a_frozen_first_stage_trains_like_one_process() -> None:
    """zb-h1 computes a stage's weight gradients from the paths between its input and its weights; behind a
    stage whose weights are all frozen the input needed no gradient, and the head never trained (6e-4 apart)."""
    plan = dataclasses.replace(measured_plan(FROZEN_FIRST, [0, 2, 3]), schedule="zb-h1")
    assert not any(lp.trainable_params for lp in plan.profile.layers[:2])
    doc = run_plan(plan, FROZEN_FIRST, engine="torch", steps=3, warmup=1, check=True)
    assert doc["world_size"] == 2 and doc["max_rel_loss_diff"] < 1e-5 and weights_agree(doc), doc


@pytest.mark.parametrize(("first", "last"), [(True, True), (True, False), (False, True), (False, False)])
def test_a_step_keeps_no_micro_batch_outputs(first: bool, last: bool) -> None:
    """torch's schedules keep every micro-batch's output on the last stage unless told not to (GPT-2's logits at
    M = 4 held 206 MB more than the plan predicted); the step asks for none, on every rank."""
    calls: list[dict[str, object]] = []

    class Recording:
        def step(self, *args: object, **kwargs: object) -> None:
            calls.append(kwargs)

    tx._run_schedule(Recording(), first, last, torch.zeros(2, 1), torch.zeros(2))
    assert len(calls) == 1 and calls[0]["return_outputs"] is False

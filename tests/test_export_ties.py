"""export.ties: the export's one tie value (the profiler's ir.Tie in the runnable layers), DeepSpeed's groups, torch's
sums."""

from __future__ import annotations

import dataclasses

import pytest

from planner import ir
from planner.export.layers import layer_param_counts
from planner.export.ties import LayerTie, find_ties, tie_groups
from planner.runner import run_plan
from tests.conftest import weights_agree
from tests.test_runner import tiny_plan, tiny_tied


def test_ties_are_found_and_counted_once() -> None:
    model, _ = tiny_tied()
    layers = tuple(model.children())
    (tie,) = find_ties(layers)
    assert tie.tie == ir.Tie("0.emb.weight", (0, 3), 320, 1280)  # the profiler's value, from its accounting
    assert tie.layers == (0, 3) and tie.paths == ("emb.weight", "emb.weight")
    assert tie.param(layers, 1) is layers[3].emb.weight
    assert layer_param_counts(layers) == [320, 272, 0, 32]  # the embedding counted in layer 0 only


def test_ties_that_share_a_layer_form_one_deepspeed_group() -> None:
    """DeepSpeed gives a layer one tied-module key: ties connected through a layer share a holder."""
    a = find_ties(tuple(tiny_tied()[0].children()))[0]
    b = LayerTie(ir.Tie("other", (3, 5), 4, 16), ("bias", "weight"))
    assert tie_groups([a, b]) == [([0, 3, 5], ["members.0.emb.weight", "members.1.bias"])]
    assert tie_groups([a]) == [([0, 3], ["members.0.emb.weight"])]


@pytest.mark.slow
@pytest.mark.parametrize("zero", [0, 2, 3])
def test_interleaved_chunks_of_one_group_sharing_a_tied_weight_train_like_one_process(zero: int) -> None:
    """Both chunks of one device group hold the tie (K = 1, v = 2: the embedding in chunk 0, the head in chunk 1):
    FSDP shards each chunk's copy of it apart on the same ranks, which then stepped on their own gradients and
    untied after the first step (a GPT-2 searched as such: 5.6e-5 apart, step 1); now summed as one parameter.
    Without FSDP both chunks hold one parameter, which torch's schedule divided by M per chunk, once before the
    other chunk's backwards ended (1.3e-3 apart at step 2; GPT-2 searched with --schedule interleaved
    --micro-batch-size 1 on 2 processes: 6.4e-6, growing); now divided once (planner.export.sharding.unscaled)."""
    p = tiny_plan("tiny_tied", [0, 1, -1], width=2, microbatches=2)
    stages = tuple(dataclasses.replace(s, devices=p.stages[0].devices, zero=zero) for s in p.stages)
    plan = dataclasses.replace(p, stages=stages, virtual_stages=2, schedule="interleaved")
    assert plan.pipeline_stages == 1 and plan.stages[0].devices == plan.stages[1].devices
    doc = run_plan(plan, "tests.test_runner:tiny_tied", engine="torch", steps=3, warmup=1, check=True)
    assert doc["world_size"] == 2 and doc["max_rel_loss_diff"] < 1e-5 and weights_agree(doc), doc

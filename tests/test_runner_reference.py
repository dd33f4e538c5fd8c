"""runner.reference: the single-process losses that a pipeline must reproduce."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from planner.export.data import data_spec
from planner.runner.reference import max_rel_diff, reference_losses
from tests.test_runner import tiny_mlp, tiny_plan


def test_max_rel_diff() -> None:
    assert max_rel_diff([1.0, 2.0], [1.0, 2.0]) == 0.0
    assert max_rel_diff([1.1], [1.0]) == pytest.approx(0.1)


def test_reference_equals_full_batch_training_for_a_model_without_batch_statistics() -> None:
    """Mean loss over equal micro-batches x replicas = the full batch's mean loss: the same SGD steps."""
    plan = tiny_plan("tiny_mlp", [0, 2, -1], width=2, microbatches=2)
    torch.manual_seed(0)
    model, example = tiny_mlp()
    layers = tuple(model.children())
    spec = data_spec(layers, example, "cross_entropy")
    twin = copy.deepcopy(nn.Sequential(*layers))
    ref = reference_losses(layers, plan, spec, 3, 0, 2)
    opt = torch.optim.SGD(twin.parameters(), lr=0.01)
    full = []
    for step in range(3):
        x, y = spec.batch(step, plan.batch_size, 0)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(twin(x), y)
        loss.backward()
        opt.step()
        full.append(float(loss.detach()))
    assert max_rel_diff(ref, full) < 1e-5


def test_check_warns_of_an_fp32_plan_whose_losses_depart_and_not_of_16_bit_rounding() -> None:
    """``planner run --check`` warns where an fp32 plan's losses depart by more than 1e-5 (DESIGN.md section 5)."""
    import dataclasses

    from planner import ir
    from planner.cluster import cluster_from_dict
    from planner.runner.reference import CHECK_RTOL, check_warning
    from tests.conftest import make_cluster_dict, make_profile_dict

    profile = ir.ModelProfile.from_dict(make_profile_dict(2, batch_size=4))
    cluster = cluster_from_dict(make_cluster_dict(1, 1))
    stage = ir.Stage((0, 2), (cluster.gpus[0].name,), ("dp", "dp"), 0)
    plan = ir.Plan(profile, cluster, "1f1b", 1, "sgd", (stage,), ir.Prediction(1, 1, 0, 0))
    assert check_warning(plan, CHECK_RTOL) is None
    message = check_warning(plan, 3.7e-4)
    assert message is not None and "0.00037" in message and "1e-05" in message
    assert check_warning(dataclasses.replace(plan, precision="bf16"), 3.7e-4) is None

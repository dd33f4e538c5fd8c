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

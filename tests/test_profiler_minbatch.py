"""The fewest samples a model trains on at a time: probed on the layers, recorded in the profile."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from planner.profiler import profile_model
from planner.profiler.layers import split_model
from planner.profiler.loader import load_model
from planner.profiler.minbatch import smallest_batch


class _FixedBatch(nn.Module):
    """A model whose forward fixes the batch to 8 (``view(8, -1)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.view(8, -1))


def norm_head() -> tuple[nn.Module, torch.Tensor]:
    """A factory: a classifier ending in a batch norm over (N, C), which refuses one sample in training."""
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4), nn.BatchNorm1d(4)), torch.randn(2, 6)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_the_smallest_batch_is_the_first_power_of_two_the_layers_take(device: str) -> None:
    with torch.device(device):
        plain = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4))
        normed = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4), nn.BatchNorm1d(4))
        image = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))  # statistics over N x H x W: one sample does
        fixed = _FixedBatch()
        x, pixels = torch.randn(8, 6), torch.randn(8, 3, 5, 5)
    assert smallest_batch(split_model(plain, x).layers, x, "fx") == 1
    assert smallest_batch(split_model(normed, x).layers, x, "fx") == 2
    assert smallest_batch(split_model(image, pixels).layers, pixels, "fx") == 1
    assert smallest_batch([fixed], torch.randn(8, 4, device=device), "fx") == 8
    assert smallest_batch(split_model(normed, x).layers, x, "structure:gpt2") == 1  # transformers take any batch


@pytest.mark.parametrize("mode", ["measured", "analytic"])
def test_a_profile_records_that_a_batch_norm_needs_two_samples(mode: str) -> None:
    """Before, the profile said nothing, the search cut the batch to one sample per rank, and `planner run`
    failed in a worker: "Expected more than 1 value per channel when training"."""
    loaded = load_model("tests.test_profiler_minbatch:norm_head", 8, device="meta" if mode == "analytic" else "cpu")
    prof = profile_model(loaded, mode=mode, repeats=1, warmup=0)
    assert prof.min_batch == 2
    assert prof.to_dict()["min_batch"] == 2 and type(prof).from_dict(prof.to_dict()).min_batch == 2
    plain = profile_model(load_model("mlp", 8, device="meta"), mode="analytic")
    assert plain.min_batch == 1 and "min_batch" not in plain.to_dict()

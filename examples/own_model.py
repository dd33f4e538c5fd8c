"""Your own model for ``planner profile``: a module with a factory function.

    planner profile examples.own_model:build --input-shape 3,32,32 --batch-size 16 -o mine.json

``build`` is called with no arguments and returns an ``nn.Module`` (then ``--input-shape``
gives the input without batch) or ``(module, example_input)``. The profiler traces the module
with torch.fx and cuts it where exactly one tensor crosses, so write ``forward`` as plain
tensor code (no data-dependent Python control flow); each block below becomes a layer.
"""

from __future__ import annotations

import torch
from torch import nn


class SmallConvNet(nn.Module):
    """A CIFAR-sized network: three conv blocks, then a classifier (10 classes)."""

    def __init__(self, width: int = 16, classes: int = 10) -> None:
        super().__init__()
        self.block1 = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.block2 = nn.Sequential(nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.block3 = nn.Sequential(nn.Conv2d(2 * width, 4 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(4 * width * 4 * 4, 128), nn.ReLU(), nn.Linear(128, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block3(self.block2(self.block1(x))))


def build() -> nn.Module:
    """The factory ``planner profile examples.own_model:build`` calls."""
    return SmallConvNet()

"""export.outputs: a stage's output made contiguous before another stage receives it."""

from __future__ import annotations

import torch
from torch import nn

from planner.export.outputs import contiguous, contiguous_output


def test_tensors_alone_and_nested_come_back_contiguous_and_equal() -> None:
    x = torch.arange(24.0).reshape(2, 3, 4).transpose(1, 2)
    assert not x.is_contiguous()
    got = contiguous((x, [x, 3], "tag"))
    assert isinstance(got, tuple) and isinstance(got[1], list) and got[2] == "tag" and got[1][1] == 3
    for t in (got[0], got[1][0]):
        assert t.is_contiguous() and torch.equal(t, x)
    already = torch.ones(3)
    assert contiguous(already) is already  # no copy where there is nothing to do


def test_the_hook_makes_a_module_output_contiguous_and_keeps_its_gradient() -> None:
    class Transpose(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.transpose(0, 1)

    module = Transpose()
    module.register_forward_hook(contiguous_output)
    x = torch.randn(2, 3, requires_grad=True)
    y = module(x)
    assert y.is_contiguous()
    y.sum().backward()
    assert x.grad is not None and torch.equal(x.grad, torch.ones(2, 3))

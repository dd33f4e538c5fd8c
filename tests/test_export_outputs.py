"""export.outputs: a stage's output made contiguous before another stage receives it."""

from __future__ import annotations

import torch
from torch import nn

from planner.export.outputs import contiguous, contiguous_output, differentiable, sent_output


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


def test_an_output_that_needs_no_gradient_is_sent_as_a_leaf_that_does() -> None:
    """A frozen first stage on data that needs no gradient: the next stage's zb-h1 backward finds its weights from
    its input, and trained none when the input needed no gradient."""
    frozen = nn.Linear(3, 3).requires_grad_(False)
    frozen.register_forward_hook(sent_output)
    y = frozen(torch.randn(2, 3))
    assert y.requires_grad and y.is_leaf and y.is_contiguous()
    ids = torch.arange(3)
    got = differentiable((y.detach(), [ids], "tag"))
    assert got[0].requires_grad and got[1][0] is ids and got[2] == "tag"
    x = torch.randn(2, 3, requires_grad=True)
    kept = x * 2
    assert differentiable(kept) is kept  # already on the graph: unchanged
    with torch.no_grad():
        assert not differentiable(torch.ones(2)).requires_grad  # no gradients recorded: nothing to do

"""Synthetic training data of a profile's input shape, the same on every process, and its split.

Batch arithmetic (both engines): the plan's batch ``B`` is cut into ``M`` micro-batches;
a stage of width ``W`` running ``dp`` forms splits each micro-batch over its ``W``
devices, so every pipeline replica runs micro-batches of ``B / (M * W)`` samples
(:func:`sub_batch`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from planner.errors import RunError


def token_vocab(layers: Iterable[nn.Module]) -> int | None:
    """The vocabulary of a token model: the first embedding's size."""
    for layer in layers:
        for m in layer.modules():
            if isinstance(m, nn.Embedding):
                return int(m.num_embeddings)
    return None


@dataclass(frozen=True)
class DataSpec:
    """How to make one synthetic batch: input shape and kind, target shape and kind."""

    input_shape: tuple[int, ...]
    input_high: int | None  # token ids in [0, input_high), or None for float inputs
    output_shape: tuple[int, ...]  # model output without the batch dimension
    loss: str

    def batch(self, step: int, size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The global batch of ``step``: the same on every process for the same seed."""
        g = torch.Generator().manual_seed(seed * 100_003 + step)
        if self.input_high is None:
            x = torch.randn(size, *self.input_shape, generator=g)
        else:
            x = torch.randint(0, self.input_high, (size, *self.input_shape), generator=g)
        if self.loss == "cross_entropy":
            classes = self.output_shape[-1]
            y = torch.randint(0, classes, (size, *self.output_shape[:-1]), generator=g)
        else:
            y = torch.randn(size, *self.output_shape, generator=g)
        return x, y


def eval_forward(layers: Sequence[nn.Module], x: Any) -> Any:
    """``x`` through ``layers`` in turn, in eval mode without gradients (no running statistic or weight moves),
    each layer's mode restored after."""
    modes = [layer.training for layer in layers]
    try:
        with torch.no_grad():
            for layer in layers:
                layer.eval()
            for layer in layers:
                x = layer(x)
        return x
    finally:
        for layer, mode in zip(layers, modes, strict=True):
            layer.train(mode)


def _input_vocabs(layers: Sequence[nn.Module], x: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    """The sizes of the embeddings fed the input itself (its storage: not position ids or another table's
    indices), and the output, from one forward of ``x`` (eval mode, no grad)."""
    fed: list[int] = []

    def hook(mod: nn.Module, args: tuple[Any, ...]) -> None:
        arg = args[0] if args else None
        if isinstance(arg, torch.Tensor) and arg.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
            fed.append(int(mod.num_embeddings))

    handles = [m.register_forward_pre_hook(hook) for layer in layers for m in layer.modules()
               if isinstance(m, nn.Embedding)]
    try:
        y = eval_forward(layers, x)
    except Exception as exc:
        raise RunError(f"the model's layers fail on its example input: {type(exc).__name__}: {exc}",
                       "check --model and the plan's input shape") from None
    finally:
        for handle in handles:
            handle.remove()
    return fed, y


def data_spec(layers: Sequence[nn.Module], example_input: torch.Tensor, loss: str) -> DataSpec:
    """Infer the synthetic data from one forward of two samples (eval mode, no grad). Token ids are drawn
    below the smallest embedding the input feeds (else the first embedding's size, else the example's
    largest id + 1): a position table found first may be larger than the vocabulary."""
    x = example_input[:2]
    fed, y = _input_vocabs(layers, x)
    high = None
    if not x.is_floating_point():
        high = min(fed, default=None) or token_vocab(layers) or int(example_input.max()) + 1
    if isinstance(y, (tuple, list)):
        y = y[0]
    out_shape = tuple(y.shape[1:])
    if loss == "cross_entropy" and (not out_shape or not y.is_floating_point()):
        raise RunError(f"the model's output {tuple(y.shape)} does not fit a cross-entropy loss",
                       "use --loss mse")
    if loss == "cross_entropy" and out_shape[-1] < 2:  # a regression head (num_labels=1): log-softmax of one is 0
        raise RunError(f"the model's output {tuple(y.shape)} has {out_shape[-1]} classes (its last dimension): a "
                       "cross-entropy loss over fewer than 2 is 0 whatever the weights, so nothing would train (and "
                       "--check would compare zeros)", "use --loss mse")
    return DataSpec(tuple(example_input.shape[1:]), high, out_shape, loss)


def sub_batch(x: torch.Tensor, micro: int, replica: int, microbatches: int, width: int) -> torch.Tensor:
    """Samples of micro-batch ``micro`` for data-parallel replica ``replica``."""
    size = x.shape[0] // (microbatches * width)
    start = micro * size * width + replica * size
    return x[start:start + size]

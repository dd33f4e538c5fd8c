"""What both engines share: the model's layers, tied weights, the loss, synthetic data, checks.

An exported plan runs EXACTLY the layers the profile measured (``planner.profiler.layers.
split_model``), in order, with the plan's stage boundaries. This module turns a model (or
an ``nn.Sequential``, or a ready list of layers) into that list, finds the parameters that
several layers share (GPT-2's ``wte``/``lm_head``), checks the layers against the plan's
profile, and makes the loss and the synthetic batches that ``planner run`` trains on.

Batch arithmetic (both engines): the plan's batch ``B`` is cut into ``M`` micro-batches;
a stage of width ``W`` running ``dp`` forms splits each micro-batch over its ``W``
devices, so every pipeline replica runs micro-batches of ``B / (M * W)`` samples.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from planner import ir
from planner.errors import ExportError, RunError

LOSSES = ("cross_entropy", "mse")
ENGINES = ("deepspeed", "torch")


# ----------------------------------------------------------------------------- generated scripts


def script_args(doc: str | None, model: str, local_rank: bool = False) -> argparse.Namespace:
    """The command line of a generated ``train.py``: ``--model``, ``--steps``, ``--loss``, ``--seed``.

    ``local_rank`` also accepts the ``--local_rank`` the DeepSpeed launcher passes.
    """
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=model)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--loss", default="cross_entropy", choices=LOSSES)
    ap.add_argument("--seed", type=int, default=0)
    if local_rank:
        ap.add_argument("--local_rank", type=int, default=-1)
    return ap.parse_args()


# ----------------------------------------------------------------------------- layers and ties


@dataclass(frozen=True)
class TiedParam:
    """One parameter object used by several layers: ``paths[i]`` is its name inside ``layers[i]``."""

    name: str
    layers: tuple[int, ...]
    paths: tuple[str, ...]


def as_layers(model_or_layers: Any, example_input: torch.Tensor | None = None) -> tuple[nn.Module, ...]:
    """The runnable layers of a model: ``x = layer(x)`` in order equals the model.

    Accepts a ``LayeredModel`` (anything with a ``layers`` tuple), a list of modules, an
    ``nn.Sequential`` (its children), or any module, which is split with the profiler's
    ``split_model`` (the same split the profile was made with).
    """
    layers = getattr(model_or_layers, "layers", None)
    if layers is not None and not isinstance(model_or_layers, nn.Module):
        return tuple(layers)
    if isinstance(model_or_layers, (list, tuple)):
        if not all(isinstance(m, nn.Module) for m in model_or_layers):
            raise ExportError("the layer list holds something that is not an nn.Module", "pass nn.Module layers")
        return tuple(model_or_layers)
    if isinstance(model_or_layers, nn.Module):
        if example_input is not None:
            from planner.profiler.layers import split_model

            return tuple(split_model(model_or_layers, example_input).layers)
        if isinstance(model_or_layers, nn.Sequential):
            return tuple(model_or_layers.children())
        raise ExportError(f"cannot split {type(model_or_layers).__name__} into layers without the profiler",
                          "pass the layers (split_model(...).layers) or an nn.Sequential")
    raise ExportError(f"expected a model or a list of layers, got {type(model_or_layers).__name__}",
                      "pass an nn.Module or its layers")


def find_ties(layers: Sequence[nn.Module]) -> tuple[TiedParam, ...]:
    """Parameters that more than one layer holds (the same object), e.g. GPT-2's wte/lm_head."""
    seen: dict[int, list[tuple[int, str]]] = {}
    names: dict[int, str] = {}
    for i, layer in enumerate(layers):
        for path, p in layer.named_parameters():
            uses = seen.setdefault(id(p), [])
            if not uses or uses[-1][0] != i:
                uses.append((i, path))
                names.setdefault(id(p), path)
    return tuple(TiedParam(names[k].replace(".", "_"), tuple(i for i, _ in v), tuple(p for _, p in v))
                 for k, v in seen.items() if len(v) > 1)


def layer_param_counts(layers: Sequence[nn.Module]) -> list[int]:
    """Parameters per layer, a shared parameter counted once, in its first layer (as profiles do)."""
    counted: set[int] = set()
    out = []
    for layer in layers:
        n = 0
        for p in layer.parameters():
            if id(p) not in counted:
                counted.add(id(p))
                n += p.numel()
        out.append(n)
    return out


def check_layers_match(layers: Sequence[nn.Module], profile: ir.ModelProfile, error: type = RunError) -> None:
    """The layers must be the profile's: same count, same parameters per layer."""
    if len(layers) != len(profile.layers):
        raise error(f"the model has {len(layers)} layers but the plan's profile ({profile.model}) has "
                    f"{len(profile.layers)}", "run the plan with the model it was profiled from, or "
                    "profile and search this model again")
    counts = layer_param_counts(layers)
    for i, (n, lp) in enumerate(zip(counts, profile.layers, strict=False)):
        if n != lp.param_count:
            raise error(f"layer {i} ({lp.name}) has {n} parameters in the model but {lp.param_count} in the "
                        f"plan's profile", "the model's shapes differ from the profiled one: profile it again")


def disable_dropout(module: nn.Module) -> None:
    """Set every dropout probability to 0 (equivalence checks need a deterministic forward)."""
    for m in module.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):
            m.p = 0.0


def ranges(plan: ir.Plan) -> list[tuple[int, int]]:
    """Layer range [first, end) of each plan stage."""
    return [tuple(s.layers) for s in plan.stages]  # type: ignore[misc]


def boundaries(plan: ir.Plan) -> list[int]:
    """Stage boundaries as DeepSpeed's ``parts``: [0, b1, ..., N]."""
    return [s.layers[0] for s in plan.stages] + [plan.stages[-1].layers[1]]


def check_common(plan: ir.Plan, engine: str) -> int:
    """Checks every engine needs; returns the common stage width.

    An interleaved plan (``virtual_stages`` v > 1) lists K*v chunks on K device groups.
    """
    n = len(plan.profile.layers)
    expect = 0
    for i, st in enumerate(plan.stages):
        if st.layers[0] != expect:
            raise ExportError(f"stage {i} starts at layer {st.layers[0]}, expected {expect}: stages must be "
                              "contiguous", "re-run planner search")
        expect = st.layers[1]
    if expect != n:
        raise ExportError(f"the stages cover layers 0..{expect} of {n}", "re-run planner search")
    widths = [s.width for s in plan.stages]
    for i, w in enumerate(widths):
        if w != widths[0]:
            raise ExportError(f"stage {i} has {w} devices but stage 0 has {widths[0]}: {engine} runs a "
                              "pipeline x data-parallel grid with every stage the same width (config "
                              f"{plan.config})", f"search a runnable plan with `planner search --engine {engine}`")
    groups = len(plan.stages) // max(plan.virtual_stages, 1)
    if plan.world_size != groups * widths[0]:
        raise ExportError(f"the plan's stages share devices ({plan.world_size} distinct for {groups} "
                          f"stages of width {widths[0]})", f"search with `planner search --engine {engine}`")
    w = widths[0]
    b, m = plan.batch_size, plan.microbatches
    if b % (m * w):
        raise ExportError(f"batch {b} cannot be cut into {m} micro-batches over {w} data-parallel devices "
                          "of equal size", "choose --microbatches so that batch / (microbatches x width) is whole")
    return w


def micro_batch_size(plan: ir.Plan, width: int) -> int:
    return plan.batch_size // (plan.microbatches * width)


# ----------------------------------------------------------------------------- loss and data


def make_loss(name: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The loss: ``cross_entropy`` over the last dimension (classes or vocabulary), or ``mse``."""
    if name == "cross_entropy":
        return cross_entropy_loss
    if name == "mse":
        return mse_loss
    raise ExportError(f"unknown loss {name!r}", f"use one of {', '.join(LOSSES)}")


def cross_entropy_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy; a [B, T, V] output (a language model) is flattened over tokens."""
    if isinstance(output, (tuple, list)):
        output = output[0]
    return nn.functional.cross_entropy(output.reshape(-1, output.shape[-1]).float(), target.reshape(-1))


def mse_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if isinstance(output, (tuple, list)):
        output = output[0]
    return nn.functional.mse_loss(output.float(), target)


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


def data_spec(layers: Sequence[nn.Module], example_input: torch.Tensor, loss: str) -> DataSpec:
    """Infer the synthetic data from one forward of two samples (eval mode, no grad)."""
    x = example_input[:2]
    high = None
    if not x.is_floating_point():
        high = token_vocab(layers) or int(example_input.max()) + 1
    modes = [m.training for m in layers]
    try:
        with torch.no_grad():
            for layer in layers:
                layer.eval()
            y = x
            for layer in layers:
                y = layer(y)
    except Exception as exc:
        raise RunError(f"the model's layers fail on its example input: {type(exc).__name__}: {exc}",
                       "check --model and the plan's input shape") from None
    finally:
        for layer, mode in zip(layers, modes, strict=False):
            layer.train(mode)
    if isinstance(y, (tuple, list)):
        y = y[0]
    out_shape = tuple(y.shape[1:])
    if loss == "cross_entropy" and (not out_shape or not y.is_floating_point()):
        raise RunError(f"the model's output {tuple(y.shape)} does not fit a cross-entropy loss",
                       "use --loss mse")
    return DataSpec(tuple(example_input.shape[1:]), high, out_shape, loss)


def sub_batch(x: torch.Tensor, micro: int, replica: int, microbatches: int, width: int) -> torch.Tensor:
    """Samples of micro-batch ``micro`` for data-parallel replica ``replica``."""
    size = x.shape[0] // (microbatches * width)
    start = micro * size * width + replica * size
    return x[start:start + size]


# ----------------------------------------------------------------------------- optimizer


def torch_optimizer(name: str, params: Iterable[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """The plan's optimizer as the torch class DeepSpeed's config also selects."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "momentum":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=lr)
    raise ExportError(f"unknown optimizer {name!r}", f"use one of {', '.join(ir.OPTIMIZERS)}")


DEFAULT_LR = {"sgd": 0.01, "momentum": 0.01, "adam": 1e-3, "rmsprop": 1e-3}


# ----------------------------------------------------------------------------- hand-made plans


def manual_plan(profile: ir.ModelProfile, cluster: ir.Cluster, parts: Sequence[int], width: int = 1, *,
                microbatches: int = 1, schedule: str = "1f1b", optimizer: str = "sgd",
                forms: Sequence[Sequence[str]] | None = None,
                predicted: ir.Prediction | None = None) -> ir.Plan:
    """A plan with given stage boundaries ``parts`` ([0, b1, ..., N]) on ``width`` devices per stage.

    For comparisons with engines' own partitions (DeepSpeed's ``partition_method``) and
    for tests. Devices are taken from the cluster in order; the prediction is a
    placeholder unless given (``planner.simulate`` can predict it).
    """
    devices = [g.name for g in cluster.gpus]
    k = len(parts) - 1
    if k * width > len(devices):
        raise ExportError(f"{k} stages x {width} devices need {k * width} devices; the cluster has "
                          f"{len(devices)}", "use a larger cluster")
    stages = tuple(
        ir.Stage((parts[s], parts[s + 1]), tuple(devices[s * width:(s + 1) * width]),
                 tuple(forms[s]) if forms else ("dp",) * (parts[s + 1] - parts[s]), 0)
        for s in range(k))
    pred = predicted or ir.Prediction(0.0, 0.0, 0.0, 0)
    return ir.Plan(profile=profile, cluster=cluster, schedule=schedule, microbatches=microbatches,
                   optimizer=optimizer, stages=stages, predicted=pred)

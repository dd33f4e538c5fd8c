"""The model as the profiled layers: build it, split it, find its ties, check it against the plan.

An exported plan runs EXACTLY the layers the profile measured (``planner.profiler.layers.
split_model``), in order, with the plan's stage boundaries. :func:`load_layers` builds a
model spec (zoo name or ``package.module:factory``) and splits it; :func:`as_layers` turns
a model (or an ``nn.Sequential``, or a ready list of layers) into that list;
:func:`param_accounting_of` counts their parameters and finds their ties with the profiler's own
accounting (``planner.ir.Tie``; planner.export.ties makes them runnable);
:func:`check_layers_match` checks the layers against the plan's profile (parameters per layer, ties).
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from planner import ir
from planner.errors import ExportError, ModelLoadError, PlanError, ProfileError, RunError, UsageError
from planner.profiler.layered import param_accounting
from planner.profiler.layers import split_model
from planner.profiler.loader import load_model, overrides_for, overrides_note


def load_layers(spec: str, plan: ir.Plan, seed: int | None = None) -> tuple[tuple[nn.Module, ...], torch.Tensor]:
    """Build ``spec`` (zoo name or package.module:factory) and split it into the profiled layers.

    The profiled zoo model is built with the profile's ``--set`` overrides (``meta.overrides``; another
    model without them). The layers are checked against the plan's profile (count and parameters per
    layer); ``seed`` seeds torch first, so every process builds the same weights.
    """
    overrides = overrides_for(spec, plan.profile.model, plan.profile.meta)
    if spec != plan.profile.model:
        _check_on_meta(spec, plan, overrides)
    if seed is not None:
        torch.manual_seed(seed)
    try:
        loaded = load_model(spec, plan.batch_size, plan.profile.input_shape, overrides=overrides)
        layers = as_layers(loaded.module, loaded.example_input)
    except UsageError as exc:
        if not overrides:
            raise
        raise PlanError(f"the plan's profile.meta.overrides do not build {spec}: {exc.cause}",
                        "re-create the profile with planner profile --set (and the plan from it)") from None
    except ProfileError as exc:
        if spec == plan.profile.model or isinstance(exc, ModelLoadError):  # the model's own fault, or not found
            raise
        raise RunError(f"{spec} is not the plan's model ({plan.profile.model}): {exc.cause}",
                       f"run the plan with --model {plan.profile.model}, or profile and search {spec}") from None
    check_layers_match(layers, plan.profile, RunError)
    return layers, loaded.example_input


def _check_on_meta(spec: str, plan: ir.Plan, overrides: dict[str, Any]) -> None:
    """RunError when ``spec``, another model than the profiled one, built on the meta device (no weights, no
    compute), does not split into the plan's layers: checked before its weights are made, as the wrong model for
    a plan of a small one may be a large one (``--model llama2-7b`` for a plan of a two-block GPT-2: 27 GB of fp32
    weights in every process, killed out of memory before any check). A model the meta device cannot build or
    split is left to the real build, which says what fails."""
    try:
        loaded = load_model(spec, plan.batch_size, plan.profile.input_shape, device="meta", overrides=overrides)
        layers = as_layers(loaded.module, loaded.example_input)
    except Exception:  # the real build reports it (or builds what the meta device cannot)
        return
    check_layers_match(layers, plan.profile, RunError)


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
            return tuple(split_model(model_or_layers, example_input).layers)
        if isinstance(model_or_layers, nn.Sequential):
            return tuple(model_or_layers.children())
        raise ExportError(f"cannot split {type(model_or_layers).__name__} into layers without an example input",
                          "pass example_input, the layers (split_model(...).layers) or an nn.Sequential")
    raise ExportError(f"expected a model or a list of layers, got {type(model_or_layers).__name__}",
                      "pass an nn.Module or its layers")


def param_accounting_of(layers: Sequence[nn.Module]) -> tuple[tuple[int, ...], tuple[ir.Tie, ...]]:
    """The profiler's parameter accounting of the layers: parameters per layer (a shared one counted
    in its first layer) and the ties (named as in ``nn.Sequential(*layers)``)."""
    counts, _, ties = param_accounting(nn.Sequential(*layers), [list(layer.named_parameters()) for layer in layers])
    return counts, ties


def layer_param_counts(layers: Sequence[nn.Module]) -> list[int]:
    """Parameters per layer, a shared parameter counted once, in its first layer (as profiles do)."""
    return list(param_accounting_of(layers)[0])


def check_layers_match(layers: Sequence[nn.Module], profile: ir.ModelProfile, error: type = RunError) -> None:
    """The layers must be the profile's: same count, same parameters per layer (errors name the
    profile's ``--set`` overrides, if it has any)."""
    note = overrides_note(profile.model, profile.meta)
    again = (f"run the plan with --model {profile.model}, which builds it with those overrides, or a "
             "package.module:factory returning that model") if note else ""
    if len(layers) != len(profile.layers):
        raise error(f"the model has {len(layers)} layers but the plan's profile ({profile.model}) has "
                    f"{len(profile.layers)}{note}", again or "run the plan with the model it was profiled from, "
                    "or profile and search this model again")
    counts, ties = param_accounting_of(layers)
    for i, (n, lp) in enumerate(zip(counts, profile.layers, strict=False)):
        if n != lp.param_count:
            raise error(f"layer {i} ({lp.name}) has {n} parameters in the model but {lp.param_count} in the "
                        f"plan's profile{note}", again or "the model's shapes differ from the profiled one: "
                        "profile it again")
    found, recorded = sorted(t.layers for t in ties), sorted(t.layers for t in profile.ties)
    if profile.ties and found != recorded:
        raise error(f"the model's tied weights ({_groups(found)}) are not the plan's profile's ({_groups(recorded)})"
                    f"{note}", again or "run the plan with the model it was profiled from, or profile it again")


def _groups(layer_sets: Sequence[tuple[int, ...]]) -> str:
    return "; ".join("layers " + ", ".join(map(str, s)) for s in layer_sets) or "none"


_NOISE = ("jitter_noise", "input_jitter_noise")
"""The numbers a mixture of experts' router scales its input by a random draw with while training: Mixtral's
``jitter_noise`` (its ``router_jitter_noise``), PhiMoE's ``input_jitter_noise``. (PhiMoE's ``router_jitter_noise`` is
no draw: a threshold its sparse mixer reads in training and evaluation alike.)"""

_SAMPLERS = ("sparsemixer",)
"""Functions a router's forward calls that sample its experts while training (PhiMoE's sparse mixer: Gumbel noise
and a coin per token), whatever its numbers."""


def disable_dropout(module: nn.Module) -> None:
    """Make every random draw of the forward deterministic (equivalence checks need a deterministic forward): every
    dropout probability 0, ``nn.Dropout`` modules, and the probabilities modules keep as numbers,
    ``nn.MultiheadAttention.dropout`` or a transformers attention's ``attention_dropout`` (any float attribute named
    ``*dropout*``: each rank would draw its own masks, and the split model would train on other masks than the
    reference); a mixture of experts' router noise (:data:`_NOISE`) 0; and a router that samples its experts while
    training (:data:`_SAMPLERS`) routed as in evaluation, however its model is put to train."""
    for m in module.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):
            m.p = 0.0
        for name, value in list(vars(m).items()):
            if ("dropout" in name.lower() or name in _NOISE) and isinstance(value, float):
                setattr(m, name, 0.0)
        if _samples(type(m)):
            m.train = types.MethodType(_evaluating, m)
            m.training = False


def _samples(cls: type) -> bool:
    """Whether ``cls``'s forward calls a function of :data:`_SAMPLERS` (read off its code's names)."""
    code = getattr(getattr(cls, "forward", None), "__code__", None)
    return code is not None and any(name in code.co_names for name in _SAMPLERS)


def _evaluating(self: nn.Module, mode: bool = True) -> nn.Module:
    """``nn.Module.train`` for a module that stays in evaluation (its routing without samples) whatever ``mode``."""
    return nn.Module.train(self, False)  # type: ignore[no-any-return]

"""Split a model into layers: contiguous blocks between cut points where one tensor crosses.

The entry point: ``split_model`` tries the structural split of known ``transformers``
classes first (``planner.profiler.hfsplit``: GPT-2, BERT, the Llama family), then torch.fx
(``planner.profiler.fxsplit``); another ``transformers`` class, which fx cannot trace, gets a
hint naming the classes split by structure, and a mixture of experts not among them is refused as one. Every
layer is a plain ``nn.Module`` taking one tensor and returning one, using the model's own
parameter objects (no copies): ``x = layer(x)`` in order equals ``module(x)``. The value
returned (``LayeredModel``) and the weight accounting live in ``planner.profiler.layered``;
``verify_cuts`` (``planner.profiler.verify``) checks a structural split against the model's
exported data flow. Export imports ``split_model`` from here, so a profile and an exported
plan cut the model the same way.
"""

from __future__ import annotations

import torch
from torch import nn

from planner.errors import ProfileError, TraceError
from planner.profiler.fxsplit import split_fx
from planner.profiler.hfchecks import EXPERT_FIELDS
from planner.profiler.hfsplit import MIXTURES, STRUCTURED, split_hf
from planner.profiler.layered import LayeredModel, primary_output
from planner.profiler.verify import verify_cuts

__all__ = ["LayeredModel", "primary_output", "split_model", "verify_cuts"]


def split_model(module: nn.Module, example_input: torch.Tensor) -> LayeredModel:
    """Cut ``module`` into layers at the points where one activation tensor crosses.

    Raises TraceError when the model cannot be traced (with why and what to do), and
    ProfileError when the model rejects ``example_input`` or computes nothing from it.
    """
    hf = split_hf(module, example_input)
    if hf is not None:
        return hf
    _check_experts(module)
    try:
        layered = split_fx(module, example_input)
    except TraceError as exc:
        model = _transformers_model(type(module))
        if model is None:
            raise
        if model is not type(module):
            raise TraceError(f"{type(module).__name__} subclasses transformers' {model.__name__}, and planner splits "
                             "by their structure only transformers' own classes (a subclass may change what they "
                             f"compute); torch.fx cannot trace it: {exc.cause}",
                             f"have the factory return the {model.__name__} itself (your additions outside it); "
                             f"planner splits these transformers classes by their structure: {STRUCTURED}") from None
        raise TraceError(f"{type(module).__name__} is a transformers class planner does not split by its structure, "
                         f"and torch.fx cannot trace it: {exc.cause}",
                         f"planner splits these transformers classes by their structure: {STRUCTURED}; "
                         "build the model as one of them") from None
    if len(layered) == 0:
        raise ProfileError(f"{type(module).__name__} computes nothing: its forward returns its input unchanged "
                           "(0 layers to place)", "profile a model with at least one layer")
    return layered


def _transformers_model(cls: type) -> type | None:
    """The first class of ``cls``'s that transformers defines for a model (``transformers.models``), or None."""
    return next((c for c in cls.__mro__ if c.__module__.startswith("transformers.models.")), None)


def _check_experts(module: nn.Module) -> None:
    """A transformers mixture-of-experts model that is not one split by its structure (``hfsplit.MIXTURES``; or a
    user's subclass of one) is refused with why: torch.fx cannot trace its routing into layers, and its blocks'
    steps are not known here."""
    if _transformers_model(type(module)) is None:
        return
    config = getattr(module, "config", None)
    for field in EXPERT_FIELDS:
        experts = getattr(config, field, None)
        if isinstance(experts, int) and experts > 1:
            known = ", ".join(prefix for prefix, _ in MIXTURES)
            raise TraceError(f"{type(module).__name__} is a mixture of experts ({field}={experts}) that planner does "
                             f"not split: it splits these mixtures by their structure: {known}",
                             "build the model as one of those transformers classes (the class itself, not a "
                             "subclass), or split it yourself as an nn.Sequential")

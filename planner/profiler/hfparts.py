"""The pieces a structural split (``planner.profiler.hfsplit``) is built of: :class:`Part`, one layer of the split;
:func:`block_parts`, a part per block; :func:`unwrap` and :func:`stack`, a language model's or bare model's layers
laid out; :func:`is_causal_lm`; :func:`layer_type`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from planner.profiler.hfmodules import Chain
from planner.profiler.layered import dominant


@dataclass(frozen=True)
class Part:
    """One layer of a structural split: its name, type, runnable module, dominant weight, module paths."""

    name: str
    type: str
    module: nn.Module
    weight: nn.Module | None
    scope: tuple[str, ...]
    is_block: bool = False


Wrap = Callable[[nn.Module, nn.Module | None], nn.Module]
"""Wraps one block (and the final norm after it, or None) into a one-tensor layer."""


def block_parts(blocks: Sequence[nn.Module], path: str, wrap: Wrap,
                 after: Sequence[tuple[str, nn.Module]] = ()) -> list[Part]:
    """One part per block at ``path.i``; the modules ``after`` (path, module: the final norm of a model without LM
    head, and OPT's ``project_out``) run after the last block."""
    parts = []
    for i, block in enumerate(blocks):
        tail = after if i == len(blocks) - 1 else ()
        post = None if not tail else tail[0][1] if len(tail) == 1 else Chain(*(m for _, m in tail))
        parts.append(Part(f"{path}.{i}", type(block).__name__, wrap(block, post), dominant([block]),
                           (f"{path}.{i}", *(name for name, _ in tail)), is_block=True))
    return parts


def unwrap(model: nn.Module, inner: str) -> tuple[Any, str, nn.Module | None]:
    """(the bare model, the path prefix of its modules, the LM head or None) of ``model``: a language model
    (:func:`is_causal_lm`) holding its bare model at ``inner``, or the bare model itself."""
    if is_causal_lm(model):
        return getattr(model, inner), f"{inner}.", model.lm_head
    return model, "", None


def stack(first: Part, blocks: Sequence[nn.Module], path: str, wrap: Wrap, norm: tuple[str, nn.Module],
           head: nn.Module | None) -> list[Part]:
    """A decoder's layers: ``first`` (its embeddings), one part per block at ``path.i``, and the final ``norm``
    (path, module) with the LM ``head`` as the last layer, or after the last block of a bare model (``head`` None)."""
    parts = [first, *block_parts(blocks, path, wrap, [norm] if head is None else [])]
    if head is not None:
        parts.append(Part("lm_head", "Linear", Chain(norm[1], head), head, (norm[0], "lm_head")))
    return parts


def is_causal_lm(model: nn.Module) -> bool:
    """Whether ``model`` is a causal LM (``...ForCausalLM``, GPT-2's ``GPT2LMHeadModel``: its bare model and an LM
    head), not the bare model."""
    return type(model).__name__.endswith("ForCausalLM") or type(model).__name__ == "GPT2LMHeadModel"


def layer_type(part: Part) -> str:
    """``part``'s type as the profile records it: "Linear" names a layer the torch export's split forms may shard
    (exactly one ``nn.Linear``: ``planner.engines.FormRules.split_types``), so a head chaining more than one (BERT's
    pooler and classifier, OPT's ``project_out`` and LM head) is a "Head"."""
    if part.type != "Linear":
        return part.type
    linears = sum(isinstance(m, nn.Linear) for m in part.module.modules())
    return "Linear" if linears == 1 else "Head"


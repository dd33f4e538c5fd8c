"""Which other transformers decoders run the forwards of a family hfsplit knows: compared as code.

transformers writes most new decoders from Llama's code ("modular" files), so many classes the planner has never
named compute exactly what a known family computes: the embedding, each decoder layer given the rotary position
embeddings and the causal mask, the final norm, the head. A model whose ``...Model.forward`` (and, for a causal
LM, ``...ForCausalLM.forward``) is, as code, that of a known family is split as that family
(``planner.profiler.hfsplit``): the two functions' syntax trees are compared without docstrings, decorators and
annotations, each class's own name prefix read as one placeholder (``SmolLM3Model`` as ``LlamaModel``) and keyword
arguments in name order. The comparison is made against the transformers installed, so it follows its version:
what is recognised is what that version's code says. A forward that adds anything (a logit scale, an embedding
dropout, a mask per layer type the family does not build) differs and is not recognised.

What the blocks are is read the same way: the MLP is gated when it has a ``gate_proj`` (or fused ``gate_up_proj``);
the planner's tensor parallelism shards a block only when its decoder layer's, attention's and MLP's forwards are
also one shardable family's code and every projection it shards is an ``nn.Linear`` (the export's
``planner.export.parallel`` finds them by name and relies on the attention reading its head count from the
sharded width).
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from torch import nn

_PLACEHOLDER = "Family_"
_PROJECTIONS = (("self_attn", ("q_proj", "k_proj", "v_proj", "o_proj")), ("mlp", ("up_proj", "down_proj")))


@dataclass(frozen=True)
class Match:
    """A model recognised as running ``family``'s forwards; whether its MLP is gated and its blocks shardable."""

    family: str
    gated: bool
    shardable: bool


class _Normalise(ast.NodeTransformer):
    """Drop what does not compute (docstrings, decorators, annotations); one name for the class prefix; keywords
    in name order."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        node.decorator_list, node.returns = [], None
        first = node.body[0] if node.body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            node.body = node.body[1:] or [ast.Pass()]
        self.generic_visit(node)
        return node

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.annotation = None
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST | None:
        if node.value is None:
            return None
        return ast.copy_location(ast.Assign(targets=[node.target], value=self.visit(node.value)), node)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = node.id.replace(self.prefix, _PLACEHOLDER)
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        node.keywords = sorted(node.keywords, key=lambda k: k.arg or "")
        return node


@functools.lru_cache(maxsize=512)
def code_of(fn: Callable[..., Any], prefix: str) -> str | None:
    """``fn``'s code, normalised (module doc), with ``prefix`` read as the placeholder; None without source."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return None
    tree = _Normalise(prefix).visit(ast.parse(source))
    return ast.dump(ast.fix_missing_locations(tree), annotate_fields=False)


def _prefix(cls: type) -> str:
    """A transformers class's family prefix (``SmolLM3ForCausalLM`` -> ``SmolLM3``)."""
    for suffix in ("ForCausalLM", "DecoderLayer", "Attention", "Model", "MLP"):
        if cls.__name__.endswith(suffix):
            return cls.__name__[: -len(suffix)]
    return cls.__name__


def _forward(cls: type[nn.Module]) -> str | None:
    return code_of(cls.forward, _prefix(cls))


def _reference(family: str, suffix: str) -> type | None:
    """transformers' ``<family><suffix>`` class (from its modeling module for block parts), or None."""
    import transformers

    found = getattr(transformers, f"{family}{suffix}", None)
    if found is not None:
        return found if isinstance(found, type) else None
    try:
        module = importlib.import_module(f"transformers.models.{family.lower()}.modeling_{family.lower()}")
    except ImportError:
        return None
    found = getattr(module, f"{family}{suffix}", None)
    return found if isinstance(found, type) else None


def _same(cls: type[nn.Module], family: str, suffix: str) -> bool:
    ref = _reference(family, suffix)
    own = _forward(cls)
    return ref is not None and own is not None and own == _forward(ref)


def family_of(model: nn.Module, families: Iterable[str]) -> str | None:
    """The first of ``families`` whose model (and causal-LM) forward ``model``'s are, as code; None if none.

    ``model`` is a transformers ``...ForCausalLM`` (with its ``model``) or ``...Model`` (module doc)."""
    import transformers

    if not isinstance(model, transformers.PreTrainedModel):
        return None
    causal = type(model).__name__.endswith("ForCausalLM")
    base = getattr(model, "model", None) if causal else model
    if not isinstance(base, nn.Module) or not type(base).__name__.endswith("Model"):
        return None
    for family in families:
        if _same(type(base), family, "Model") and (not causal or _same(type(model), family, "ForCausalLM")):
            return family
    return None


def blocks_of(model: nn.Module, family: str, shardable_families: Iterable[str]) -> Match:
    """What ``model``'s decoder blocks are (module doc); ``model`` runs ``family``'s forwards."""
    base: Any = model.model if type(model).__name__.endswith("ForCausalLM") else model
    layer = base.layers[0] if len(base.layers) else None
    mlp = getattr(layer, "mlp", None)
    gated = any(isinstance(getattr(mlp, name, None), nn.Module) for name in ("gate_proj", "gate_up_proj"))
    return Match(family, gated, layer is not None and _shardable(layer, shardable_families))


def _shardable(layer: nn.Module, families: Iterable[str]) -> bool:
    """Whether ``layer``'s decoder layer, attention and MLP run one shardable family's code (its projections being
    plain Linears in every block is hfsplit's check, for every family: :func:`plain_linears`)."""
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if not isinstance(attn, nn.Module) or not isinstance(mlp, nn.Module):
        return False
    parts = ((type(layer), "DecoderLayer"), (type(attn), "Attention"), (type(mlp), "MLP"))
    return any(all(_same(cls, family, suffix) for cls, suffix in parts) for family in families)


def plain_linears(layer: nn.Module) -> bool:
    """Every projection the export shards (``planner.export.parallel``) is an ``nn.Linear`` itself."""
    names = [f"{part}.{name}" for part, group in _PROJECTIONS for name in group]
    names += ["mlp.gate_proj"] if hasattr(layer.mlp, "gate_proj") else []
    try:
        return all(type(layer.get_submodule(name)) is nn.Linear for name in names)
    except AttributeError:
        return False

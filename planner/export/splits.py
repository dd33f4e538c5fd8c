"""The split forms of a stage's layers over its tensor group (DTensor; planner.export.parallel applies them).

``split_out`` / ``split_in`` shard one ``nn.Linear`` in the layer, or the ``nn.Embedding`` of a layer the
profile types ``Embedding`` (the table of the profile's weight shape: GPT-2's token table, not its position
one): ``ColwiseParallel`` / ``RowwiseParallel`` (an embedding over its width, or over its vocabulary with the
token ids replicated and the partial rows all-reduced: Megatron's vocabulary-parallel embedding). A Linear's
``split_out`` followed by a Linear's ``split_in`` keeps the activation sharded between them where the ops between
the two are feature-wise (planner.export.featurewise: no norm, softmax or residual sum); otherwise outputs are
gathered (column) or all-reduced (row). The sharded features must be a multiple of ``tp`` (uneven shards fail in
DTensor's styles), and an embedding DTensor cannot shard (``max_norm``, ``sparse``) is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from planner.errors import ExportError
from planner.export.featurewise import keeps_features_sharded
from planner.profiler.layered import unshardable_embedding

SPLIT_MODULES: dict[str, type[nn.Module]] = {"Linear": nn.Linear, "Embedding": nn.Embedding}
"""The module a split form shards, by the profile's layer type (``planner.engines`` torch's ``split_types``)."""


def split_target(layer: nn.Module, stage: int, index: int, form: str, kind: str = "Linear",
                 shape: tuple[int | None, int | None] = (None, None)) -> str:
    """The dotted name of the one module a split form shards in ``layer``: its ``nn.Linear``, or for a layer the
    profile types ``Embedding`` its ``nn.Embedding`` of the profile's weight ``shape`` (vocabulary, width): GPT-2's
    token table beside its position one, whichever has more rows (:func:`_embedding`)."""
    cls = SPLIT_MODULES.get(kind, nn.Linear)
    found = [(name, m) for name, m in layer.named_modules() if isinstance(m, cls)]
    if cls is nn.Embedding and len(found) > 1:
        found = _embedding(found, shape)
    if len(found) != 1:
        kinds = sorted({type(m).__name__ for m in layer.modules() if any(True for _ in m.parameters(recurse=False))})
        raise ExportError(
            f"stage {stage}: layer {index} ({type(layer).__name__}, weights in {', '.join(kinds) or 'none'}) "
            f"cannot run the {form} form: the torch export shards exactly one {cls.__name__} in a layer of type "
            f"{kind} (DTensor has no parallel style for convolutions or other layers)",
            "search with `planner search --engine torch` (it splits only what the export shards), or keep this "
            "layer dp")
    return found[0][0]


def _embedding(found: list[tuple[str, nn.Module]], shape: tuple[int | None, int | None]) -> list[tuple[str, nn.Module]]:
    """The embeddings of the profile's weight ``shape`` (the first of equal tables: the one the profiler takes, GPT-2's
    token table before its position one), or without a shape known the largest vocabulary."""
    same = [(name, m) for name, m in found if (m.num_embeddings, m.embedding_dim) == shape]
    if same:
        return same[:1]
    most = max(m.num_embeddings for _, m in found)
    return [(name, m) for name, m in found if m.num_embeddings == most]


def _split_width(module: nn.Module, form: str) -> tuple[int, str]:
    """The features ``form`` shards in ``module`` (an nn.Linear or nn.Embedding) and what they are."""
    if isinstance(module, nn.Embedding):
        return ((module.embedding_dim, "embedding") if form == "split_out" else (module.num_embeddings, "vocabulary"))
    return (module.out_features, "output") if form == "split_out" else (module.in_features, "input")


def check_split(layer: nn.Module, tp: int, stage: int, index: int, form: str, kind: str = "Linear",
                shape: tuple[int | None, int | None] = (None, None)) -> None:
    """A split form needs one module to shard (:func:`split_target`) whose sharded features ``tp`` divides."""
    module = layer.get_submodule(split_target(layer, stage, index, form, kind, shape))
    why = unshardable_embedding(module) if isinstance(module, nn.Embedding) else None
    if why:
        raise ExportError(f"stage {stage}: layer {index}'s embedding cannot run the {form} form: {why}, which "
                          "DTensor does not shard", "profile the model again (its layer then runs dp only), or keep "
                          "the layer dp")
    n, what = _split_width(module, form)
    if n % tp:
        raise ExportError(f"stage {stage}: layer {index}'s {n} {what} features do not split over {tp} devices",
                          "search with `planner search --engine torch` (it splits only what tp divides), or use a "
                          "tp that divides them")


def _split_style(form: str, sharded_in: bool, sharded_out: bool) -> Any:
    """The DTensor style of one split: column-parallel (``split_out``) or row-parallel (``split_in``; an nn.Embedding
    so over its vocabulary, its token ids replicated and its partial rows all-reduced: Megatron's
    vocabulary-parallel embedding), its output or input kept sharded inside a :func:`sharded_pair`."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if form == "split_out":
        return ColwiseParallel(output_layouts=Shard(-1) if sharded_out else Replicate())
    return RowwiseParallel(input_layouts=Shard(-1) if sharded_in else Replicate())


def shard_splits(module: nn.Sequential, forms: Sequence[str], mesh: Any, stage: int, first: int,
                 kinds: Sequence[tuple[str, tuple[int | None, int | None]]] = ()) -> None:
    """Column/row-parallel Linears (and Embeddings) for the ``split_out``/``split_in`` layers of a stage; ``kinds``:
    the profile's type and weight shape of each layer (:func:`split_target`). A column-parallel Linear hands a
    row-parallel one its output still sharded where :func:`sharded_pair` says so; every other split gathers or
    all-reduces its output."""
    targets = {j: split_target(module[j], stage, first + j, form, *(kinds[j] if j < len(kinds) else ("Linear",)))
               for j, form in enumerate(forms) if form in ("split_out", "split_in")}
    plan: dict[str, Any] = {}
    for j, target in targets.items():
        plan[f"{j}.{target}"] = _split_style(forms[j], sharded_pair(module, forms, targets, j - 1),
                                             sharded_pair(module, forms, targets, j))
    if plan:
        parallelize(module, mesh, plan)


def parallelize(module: nn.Module, mesh: Any, styles: Any) -> None:
    """torch's ``parallelize_module``, with every frozen parameter still frozen after it: ``SequenceParallel``
    registers a norm's weights again as new Parameters that require gradients, so a frozen norm was trained
    (torch 2.13; found by ``planner run --check``'s weights, where the losses passed)."""
    from torch.distributed.tensor.parallel import parallelize_module

    frozen = {name for name, p in module.named_parameters() if not p.requires_grad}
    parallelize_module(module, mesh, styles)
    for name, p in module.named_parameters():
        if name in frozen:
            p.requires_grad_(False)


def sharded_pair(module: nn.Sequential, forms: Sequence[str], targets: dict[int, str], j: int) -> bool:
    """Whether layer ``j`` hands its output to layer ``j + 1`` sharded over the features: a ``split_out`` Linear
    followed by a ``split_in`` Linear (``targets``: layer -> the module it shards; not an embedding), the ops
    between their Linears feature-wise (planner.export.featurewise); else the column layer gathers its output and
    the row layer slices its input."""
    if j < 0 or j + 1 >= len(forms) or (forms[j], forms[j + 1]) != ("split_out", "split_in"):
        return False
    linears = all(isinstance(module[i].get_submodule(targets[i]), nn.Linear) for i in (j, j + 1))
    return linears and (keeps_features_sharded(module[j], targets[j], "out")
            and keeps_features_sharded(module[j + 1], targets[j + 1], "in"))

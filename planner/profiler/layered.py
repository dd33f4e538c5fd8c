"""A model cut into runnable layers (``LayeredModel``) and the weight facts every split shares.

Owns: the ``LayeredModel`` value the splitters return (``planner.profiler.fxsplit`` for
models torch.fx traces, ``planner.profiler.hfsplit`` for transformers split by structure),
which module carries a layer's main weight and its features, and the parameter accounting:
each parameter counted once, in the first layer that uses it, a parameter used by several
layers recorded as a ``planner.ir.Tie``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from planner import ir
from planner.errors import ProfileError
from planner.profiler.guards import is_out_of_memory, out_of_memory

HEAVY_TYPES: tuple[type[nn.Module], ...] = (
    nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d,
    nn.Linear, nn.Bilinear, nn.Embedding, nn.EmbeddingBag, nn.MultiheadAttention, nn.RNNBase,
)
"""Module types that carry a layer's main weight; other modules join a neighbouring layer."""




@dataclass(frozen=True)
class LayeredModel:
    """A model cut into runnable layers, with names, types and weight facts per layer.

    ``param_counts``/``param_bytes`` count each parameter once, in the first layer that uses
    it (tied parameters appear in ``ties``); they add up to the model's parameter count.
    ``in_features``/``out_features`` are those of the layer's dominant weight (channels for
    a convolution), None for a layer without weights.
    """

    layers: tuple[nn.Module, ...]
    names: tuple[str, ...]
    types: tuple[str, ...]
    in_features: tuple[int | None, ...]
    out_features: tuple[int | None, ...]
    param_counts: tuple[int, ...]
    param_bytes: tuple[int, ...]
    ties: tuple[ir.Tie, ...]
    method: str
    """How the split was found: ``fx``, ``fx-children`` or ``structure:<architecture>``."""
    scopes: tuple[tuple[str, ...], ...] = ()
    """For structural splits: the model's module paths each layer runs (for ``verify_cuts``)."""
    blocks: tuple[ir.BlockShape | None, ...] = ()
    """For structural splits: each transformer block's shape (tensor parallelism needs it), else None."""

    def __len__(self) -> int:
        return len(self.layers)

    def block(self, i: int) -> ir.BlockShape | None:
        """Layer ``i``'s transformer block shape, None for other layers (and for fx splits)."""
        return self.blocks[i] if self.blocks else None

    def run(self, x: torch.Tensor) -> torch.Tensor:
        """Run every layer in order: equal to running the whole model."""
        for layer in self.layers:
            x = layer(x)
        return x


def primary_output(out: Any) -> torch.Tensor:
    """The main tensor a model returns (HF outputs: ``logits`` or ``last_hidden_state``)."""
    if isinstance(out, torch.Tensor):
        return out
    for key in ("logits", "last_hidden_state"):
        value = getattr(out, key, None)
        if isinstance(value, torch.Tensor):
            return value
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise ProfileError(f"the model returned {type(out).__name__}, not a tensor",
                       "make forward() return one tensor (the output the loss is computed from)")



def rejects_input(example_input: torch.Tensor, exc: BaseException) -> ProfileError:
    """The error for a model that fails on ``example_input``: its own first message line."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("While executing")] or [type(exc).__name__]
    shape = tuple(example_input.shape[1:])
    if is_out_of_memory(exc):  # not the input's fault: "pass the --input-shape" would mislead
        return out_of_memory(f"running the model on input of shape {shape} (batch {example_input.shape[0]})",
                             example_input.device, exc)
    if example_input.device.type == "meta" and _NEEDS_VALUES.search(lines[0]):
        return ProfileError(f"the model cannot run on the meta device, where analytic mode counts without values, at "
                            f"input of shape {shape} (batch {example_input.shape[0]}): {lines[0][:300]}",
                            "an op whose output shape depends on the values (nonzero, boolean indexing, .item(), "
                            "as a mixture of experts routes its tokens) needs them: use --mode measured (at small "
                            "widths on this machine), or write the model without such ops")
    hint = "pass the --input-shape (without batch) the model expects"
    if _NEEDS_SAMPLES.search(lines[0]):
        hint = ("a batch norm takes statistics over the samples, and in training needs two or more per channel: "
                "use a --batch-size of 2 or more")
    elif example_input.is_floating_point() and _WANTS_INDICES.search(lines[0]):
        hint = ("the model takes integer indices (token ids), not floats: have your factory return "
                "(model, example_input) with a torch.long example, e.g. torch.randint(0, vocab_size, (1, seq_len))")
    return ProfileError(f"the model rejects input of shape {shape} (batch {example_input.shape[0]}): {lines[0][:300]}",
                        hint)


_NEEDS_VALUES = re.compile(r"\bmeta\b|data-independent|no data", re.IGNORECASE)
"""torch's messages for an op the meta device cannot run without the tensors' values."""


_NEEDS_SAMPLES = re.compile(r"more than 1 value per channel", re.IGNORECASE)
"""torch's message for a batch norm in training given one value per channel (one sample of (N, C))."""


_WANTS_INDICES = re.compile(r"indices|Long, Int|scalar type Long", re.IGNORECASE)
"""torch's messages for a float tensor given to an embedding or an index op."""


def weight_features(module: nn.Module) -> tuple[int | None, int | None]:
    """(input, output) features or channels of a module's weight, or (None, None): also for an embedding no tensor
    parallelism shards (:func:`unshardable_embedding`), so that its layer runs dp (``LayerProfile.splittable``)."""
    if isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
                           nn.ConvTranspose3d)):
        return module.in_channels, module.out_channels
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    if isinstance(module, nn.Embedding):
        return (None, None) if unshardable_embedding(module) else (module.num_embeddings, module.embedding_dim)
    if isinstance(module, nn.MultiheadAttention):
        return module.embed_dim, module.embed_dim
    weight = getattr(module, "weight", None)
    if type(module).__name__ == "Conv1D" and isinstance(weight, torch.Tensor) and weight.dim() == 2:
        return int(weight.shape[0]), int(weight.shape[1])  # HF Conv1D stores (in, out)
    return None, None


def unshardable_embedding(module: nn.Embedding) -> str | None:
    """Why DTensor cannot shard ``module`` (torch's ColwiseParallel / RowwiseParallel), or None: ``max_norm``
    renormalises the looked-up rows in place (``aten.embedding_renorm_`` has no sharding strategy), ``sparse``
    gradients have none either."""
    if module.max_norm is not None:
        return f"max_norm={module.max_norm:g} renormalises its rows in place"
    return "sparse=True makes sparse gradients" if module.sparse else None


def is_heavy(module: nn.Module) -> bool:
    return isinstance(module, HEAVY_TYPES) or type(module).__name__ == "Conv1D"


def dominant(modules: Iterable[nn.Module]) -> nn.Module | None:
    """The weighted module with the most parameters among ``modules`` and their children."""
    best: nn.Module | None = None
    best_n = -1
    for top in modules:
        for sub in top.modules():
            if is_heavy(sub):
                n = sum(p.numel() for p in sub.parameters(recurse=False))
                if n > best_n:
                    best, best_n = sub, n
    return best


def trainable_counts(layers: Sequence[nn.Module], counts: Sequence[int]) -> tuple[int | None, ...]:
    """Per layer, how many of the ``counts`` parameters it is counted with (each in the first layer using it)
    train (``requires_grad``); None where none of them is frozen."""
    seen: set[int] = set()
    out: list[int | None] = []
    for layer, count in zip(layers, counts, strict=True):
        own = [p for p in layer.parameters() if id(p) not in seen]
        seen.update(id(p) for p in own)
        frozen = sum(p.numel() for p in own if not p.requires_grad)
        out.append(None if frozen == 0 else max(0, count - frozen))
    return tuple(out)


def tensor_counts(layers: Sequence[nn.Module], counts: Sequence[int], trainable: Sequence[int | None]
                  ) -> tuple[tuple[int, ...], ...]:
    """Per layer, the elements of each trainable parameter tensor it is counted with (each tensor in the first
    layer using it), largest first; all empty (unknown) where a layer's do not add up to its trainable count
    (``trainable``, or ``counts`` where None: :func:`trainable_counts`), as in a split whose layers are not the
    modules owning their parameters."""
    seen: set[int] = set()
    out: list[tuple[int, ...]] = []
    for layer in layers:
        own = [p for p in layer.parameters() if id(p) not in seen]
        seen.update(id(p) for p in own)
        out.append(tuple(sorted((p.numel() for p in own if p.requires_grad and p.numel() > 0), reverse=True)))
    wanted = [n if t is None else t for n, t in zip(counts, trainable, strict=True)]
    if any(sum(tensors) != n for tensors, n in zip(out, wanted, strict=True)):
        return tuple(() for _ in layers)
    return tuple(out)


def batch_stats(layer: nn.Module) -> bool:
    """Whether ``layer`` takes statistics over the samples it sees (a batch norm in training mode does): its
    result changes when its samples are split over devices that do not share them."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in layer.modules())


def param_accounting(model: nn.Module, layer_params: Sequence[list[tuple[str, nn.Parameter]]]
                      ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[ir.Tie, ...]]:
    """Count each parameter once (first layer using it) and find ties.

    A parameter no layer uses (a module the forward never calls, BertModel's pooler) is counted in none:
    the layers are what every engine runs and trains, and export checks its layers' counts against these.
    """
    users: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    params: dict[int, nn.Parameter] = {}
    for i, plist in enumerate(layer_params):
        for name, p in plist:
            users.setdefault(id(p), [])
            if i not in users[id(p)]:
                users[id(p)].append(i)
            names.setdefault(id(p), name)
            params[id(p)] = p
    counts = [0] * len(layer_params)
    nbytes = [0] * len(layer_params)
    for key, p in params.items():
        first = users[key][0]
        counts[first] += p.numel()
        nbytes[first] += p.numel() * p.element_size()
    qualified: dict[int, str] = {}
    for qname, p in model.named_parameters(remove_duplicate=False):
        qualified.setdefault(id(p), qname)
    names = {key: qualified.get(key, name) for key, name in names.items()}
    ties = tuple(
        ir.Tie(names[key], tuple(users[key]), params[key].numel(), params[key].numel() * params[key].element_size())
        for key in params if len(users[key]) > 1
    )
    return tuple(counts), tuple(nbytes), ties


"""Split a model into layers: contiguous blocks between cut points where one tensor crosses.

How: ``torch.fx`` traces the model (standard ``torch.nn`` modules are leaves); if that fails,
it is traced again with the model's direct children as leaves (so a model written as an
``nn.Sequential`` of blocks always traces). The traced nodes and their data edges become a
``networkx`` graph. A cut after node *k* is valid when exactly one value computed from the
input crosses it and that value is a tensor; values that do not depend on the input
(parameters, constants, masks built from static shapes) are rebuilt inside every layer that
needs them, so they never count. The pieces between valid cuts are merged so that every
layer holds a weighted operation (convolution, linear, embedding, attention): parameter-free
or normalisation pieces (ReLU, pooling, flatten, batch norm, dropout) join the layer before
them. A residual block is one piece, so one layer.

HF transformers (GPT-2, BERT) cannot be traced by ``torch.fx`` (their forward branches on
caches and masks), and ``torch.export`` gives aten graphs specialised to one batch size,
which a pipeline engine cannot run on micro-batches. For those the split follows the
model's own structure, the only one-tensor cuts there are: embeddings, each transformer
block, final norm and head. The position ids are rebuilt inside the embedding layer from
the sequence length and the causal mask inside each block by SDPA's ``is_causal``, so
only the hidden states cross a cut. ``verify_cuts`` checks such a split against the
model's real data flow: ``torch.export`` (non-strict) traces the model to aten ops, the
ops go into a ``networkx`` graph, each is attributed to a layer by its module path, and
every cut must be crossed by exactly one value computed from the input (the tests run it
on GPT-2 and BERT; it takes seconds, so profiling does not).

Every layer is a plain ``nn.Module`` taking one tensor and returning one tensor, using the
model's own parameter objects (no copies): ``x = layer(x)`` in order equals ``module(x)``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import networkx as nx
import torch
from torch import fx, nn

from planner.errors import ProfileError, TraceError

HEAVY_TYPES: tuple[type[nn.Module], ...] = (
    nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d,
    nn.Linear, nn.Bilinear, nn.Embedding, nn.EmbeddingBag, nn.MultiheadAttention, nn.RNNBase,
)
"""Module types that carry a layer's main weight; other modules join a neighbouring layer."""


@dataclass(frozen=True)
class LayerTie:
    """A parameter used by several layers; counted once, in ``layers[0]``."""

    name: str
    layers: tuple[int, ...]
    param_count: int
    param_bytes: int


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
    ties: tuple[LayerTie, ...]
    method: str
    """How the split was found: ``fx``, ``fx-children`` or ``structure:<architecture>``."""
    scopes: tuple[tuple[str, ...], ...] = ()
    """For structural splits: the model's module paths each layer runs (for ``verify_cuts``)."""

    def __len__(self) -> int:
        return len(self.layers)

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


# ----------------------------------------------------------------------------- weight facts


def weight_features(module: nn.Module) -> tuple[int | None, int | None]:
    """(input, output) features or channels of a module's weight, or (None, None)."""
    if isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
                           nn.ConvTranspose3d)):
        return module.in_channels, module.out_channels
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    if isinstance(module, nn.Embedding):
        return module.num_embeddings, module.embedding_dim
    if isinstance(module, nn.MultiheadAttention):
        return module.embed_dim, module.embed_dim
    weight = getattr(module, "weight", None)
    if type(module).__name__ == "Conv1D" and isinstance(weight, torch.Tensor) and weight.dim() == 2:
        return int(weight.shape[0]), int(weight.shape[1])  # HF Conv1D stores (in, out)
    return None, None


def _is_heavy(module: nn.Module) -> bool:
    return isinstance(module, HEAVY_TYPES) or type(module).__name__ == "Conv1D"


def _dominant(modules: Iterable[nn.Module]) -> nn.Module | None:
    """The weighted module with the most parameters among ``modules`` and their children."""
    best: nn.Module | None = None
    best_n = -1
    for top in modules:
        for sub in top.modules():
            if _is_heavy(sub):
                n = sum(p.numel() for p in sub.parameters(recurse=False))
                if n > best_n:
                    best, best_n = sub, n
    return best


def _param_accounting(model: nn.Module, layer_params: Sequence[list[tuple[str, nn.Parameter]]]
                      ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[LayerTie, ...]]:
    """Count each parameter once (first layer using it), find ties, give unused ones to the last layer."""
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
    full = dict(model.named_parameters())
    qualified: dict[int, str] = {}
    for qname, p in model.named_parameters(remove_duplicate=False):
        qualified.setdefault(id(p), qname)
    names = {key: qualified.get(key, name) for key, name in names.items()}
    for p in full.values():
        if id(p) not in params and counts:
            counts[-1] += p.numel()
            nbytes[-1] += p.numel() * p.element_size()
    ties = tuple(
        LayerTie(names[key], tuple(users[key]), params[key].numel(), params[key].numel() * params[key].element_size())
        for key in params if len(users[key]) > 1
    )
    return tuple(counts), tuple(nbytes), ties


# ----------------------------------------------------------------------------- fx path


class _Tracer(fx.Tracer):  # type: ignore[misc]
    def __init__(self, leaves: Sequence[nn.Module] = ()) -> None:
        super().__init__()
        self._leaves = {id(m) for m in leaves}

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return id(m) in self._leaves or super().is_leaf_module(m, module_qualified_name)


def _trace(module: nn.Module) -> tuple[fx.GraphModule, str]:
    errors: list[str] = []
    attempts: list[tuple[str, list[nn.Module]]] = [("fx", [])]
    children = list(module.children())
    if children:
        attempts.append(("fx-children", children))
    for method, leaves in attempts:
        try:
            graph = _Tracer(leaves).trace(module)
            return fx.GraphModule(module, graph, class_name=type(module).__name__), method
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            errors.append(f"{type(exc).__name__}: {first}")
    raise TraceError(
        f"cannot trace {type(module).__name__} into layers with torch.fx ({errors[0][:200]})",
        "remove input-dependent control flow from forward(), or give the model as an nn.Sequential of "
        "blocks that each take and return one tensor",
    )


class _ShapeRecorder(fx.Interpreter):  # type: ignore[misc]
    """Runs the traced graph and records each tensor-valued node's shape in ``node.meta``."""

    def run_node(self, n: fx.Node) -> Any:
        result = super().run_node(n)
        if isinstance(result, torch.Tensor):
            n.meta[_SHAPE] = tuple(result.shape)
        return result


_SHAPE = "planner_shape"


def _shape_prop(gm: fx.GraphModule, example_input: torch.Tensor) -> None:
    """Record every node's output shape; on fake tensors first (no compute), for real if that fails."""
    import logging

    from torch._subclasses.fake_tensor import FakeTensorMode

    if example_input.device.type != "meta":
        log = logging.getLogger("torch._subclasses.fake_tensor")
        level = log.level
        log.setLevel(logging.CRITICAL)
        try:
            fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
            fake_x = fake_mode.from_tensor(example_input)
            with torch.no_grad(), fake_mode:
                _ShapeRecorder(gm).run(fake_x)
            return
        except Exception:  # run it for real: the model's own error message, or an op fake tensors lack
            logging.getLogger(__name__).debug("fake-tensor shape propagation failed; running the model for real")
        finally:
            log.setLevel(level)
    try:
        with torch.no_grad():
            _ShapeRecorder(gm).run(example_input)
    except Exception as exc:
        raise _rejects(example_input, exc) from None


def _rejects(example_input: torch.Tensor, exc: BaseException) -> ProfileError:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("While executing")] or [type(exc).__name__]
    msg = lines[0]
    shape = tuple(example_input.shape[1:])
    return ProfileError(f"the model rejects input of shape {shape} (batch {example_input.shape[0]}): {msg[:300]}",
                        "pass the --input-shape (without batch) the model expects")


def _data_graph(gm: fx.GraphModule) -> nx.DiGraph:
    g = nx.DiGraph()
    for n in gm.graph.nodes:
        g.add_node(n)
        for a in n.all_input_nodes:
            g.add_edge(a, n)
    return g


@dataclass(frozen=True)
class _Traced:
    """A model traced to one fx graph taking and returning one tensor, with its data flow."""

    gm: fx.GraphModule
    method: str
    nodes: list[fx.Node]
    index: dict[fx.Node, int]
    """Each node's position in ``nodes``."""
    dep: set[fx.Node]
    """Nodes computed from the input (the input included, the output node not)."""
    inp: fx.Node
    result: fx.Node


_Piece = tuple[fx.Node, fx.Node, list[fx.Node]]
"""What runs between two consecutive cuts: (value crossing in, value crossing out, nodes computing it)."""


@dataclass(frozen=True)
class _FxLayer:
    """One layer of an fx split with its name, type and dominant weight's features."""

    module: fx.GraphModule
    name: str
    type: str
    in_features: int | None
    out_features: int | None


def _trace_one_tensor(module: nn.Module, example_input: torch.Tensor) -> _Traced:
    """Trace ``module``, record shapes, check it maps one tensor to one tensor."""
    gm, method = _trace(module)
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    if len(placeholders) != 1:
        raise TraceError(f"{type(module).__name__}.forward takes {len(placeholders)} inputs, planner needs one tensor",
                         "wrap the model so forward() takes a single tensor")
    _shape_prop(gm, example_input)
    (out_node,) = [n for n in nodes if n.op == "output"]
    result = out_node.args[0]
    if not isinstance(result, fx.Node) or _SHAPE not in result.meta:
        raise TraceError(f"{type(module).__name__}.forward returns {type(result).__name__}, not one tensor",
                         "wrap the model so forward() returns the tensor the loss is computed from")
    ph = placeholders[0]
    dep = nx.descendants(_data_graph(gm), ph) | {ph}
    dep.discard(out_node)
    return _Traced(gm, method, nodes, {n: i for i, n in enumerate(nodes)}, dep, ph, result)


def _valid_cuts(t: _Traced) -> list[tuple[int, fx.Node]]:
    """(position, crossing value) of every cut: after the nodes where exactly one tensor is live."""
    last_use = {n: max((t.index[u] for u in n.users), default=t.index[n]) for n in t.dep}
    cuts: list[tuple[int, fx.Node]] = []
    for k, n in enumerate(t.nodes):
        if n not in t.dep:
            continue
        live = [u for u in t.dep if t.index[u] <= k < last_use[u]]
        if len(live) == 1 and _SHAPE in live[0].meta:
            cuts.append((k, live[0]))
    if not cuts or cuts[0][1] is not t.inp:
        raise TraceError("the model's input is not used as a single tensor", "check the model's forward()")
    if cuts[-1][1] is not t.result:
        cuts.append((t.index[t.result], t.result))
    return cuts


def _pieces(t: _Traced, cuts: list[tuple[int, fx.Node]]) -> list[_Piece]:
    """The non-empty pieces between consecutive cuts."""
    pieces: list[_Piece] = []
    for (k0, n0), (k1, n1) in itertools.pairwise(cuts):
        body = [n for n in t.nodes[k0 + 1:k1 + 1] if n in t.dep]
        if body:
            pieces.append((n0, n1, body))
    return pieces


def _heavy_targets(t: _Traced, body: list[fx.Node]) -> list[str]:
    """Module paths of the weighted operations among ``body`` (empty for a light piece)."""
    out = []
    for n in body:
        if n.op == "call_module":
            sub = t.gm.get_submodule(str(n.target))
            if _is_heavy(sub) or (t.method == "fx-children" and any(True for _ in sub.parameters())
                                  and _dominant([sub]) is not None):
                out.append(str(n.target))
        for a in n.all_input_nodes:
            if a.op == "get_attr" and isinstance(_get_attr(t.gm, str(a.target)), nn.Parameter) \
                    and n.op in ("call_function", "call_method"):
                out.append(str(a.target).rsplit(".", 1)[0])
    return out


def _merge_light(t: _Traced, pieces: list[_Piece]) -> list[list[int]]:
    """Group piece indices: light pieces (no weighted op) join the layer before them (the first ones the next)."""
    groups: list[list[int]] = []
    pending: list[int] = []
    for i, (_, _, body) in enumerate(pieces):
        if _heavy_targets(t, body):
            groups.append([*pending, i])
            pending = []
        elif groups:
            groups[-1].append(i)
        else:
            pending.append(i)
    if pending:
        if groups:
            groups[-1].extend(pending)
        else:
            groups = [[i] for i in pending]
    return groups


def _fx_layer(module: nn.Module, t: _Traced, group: list[_Piece], class_name: str) -> _FxLayer:
    """The runnable layer for consecutive pieces, named after its weighted modules."""
    body = [n for piece in group for n in piece[2]]
    layer = _segment(t.gm, t.nodes, t.index, t.dep, group[0][0], group[-1][1], body, class_name)
    targets = _heavy_targets(t, body) or [str(n.target) for n in body if n.op == "call_module"]
    name, type_ = _name_and_type(module, targets, body)
    dom = _dominant([module.get_submodule(x) for x in dict.fromkeys(targets) if _has_submodule(module, x)])
    fin, fout = weight_features(dom) if dom is not None else (None, None)
    return _FxLayer(layer, name, type_, fin, fout)


def _split_fx(module: nn.Module, example_input: torch.Tensor) -> LayeredModel:
    t = _trace_one_tensor(module, example_input)
    pieces = _pieces(t, _valid_cuts(t))
    built = [_fx_layer(module, t, [pieces[i] for i in group], f"Layer{k}")
             for k, group in enumerate(_merge_light(t, pieces))]
    layers = tuple(b.module for b in built)
    counts, nbytes, ties = _param_accounting(module, [_params_of(t.gm, layer) for layer in layers])
    return LayeredModel(layers, tuple(b.name for b in built), tuple(b.type for b in built),
                        tuple(b.in_features for b in built), tuple(b.out_features for b in built), counts, nbytes,
                        ties, t.method)


def _has_submodule(gm: nn.Module, target: str) -> bool:
    try:
        gm.get_submodule(target)
        return True
    except AttributeError:
        return False


def _get_attr(gm: nn.Module, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _name_and_type(gm: nn.Module, targets: list[str], body: list[fx.Node]) -> tuple[str, str]:
    targets = list(dict.fromkeys(targets))
    if not targets:
        n = body[0]
        return str(n.name), str(getattr(n.target, "__name__", n.target))
    if len(targets) == 1:
        t = targets[0]
        return t, type(gm.get_submodule(t)).__name__ if _has_submodule(gm, t) else "Function"
    parts = [t.split(".") for t in targets]
    common: list[str] = []
    for level in zip(*parts, strict=False):
        if len(set(level)) != 1:
            break
        common.append(level[0])
    prefix = ".".join(common)
    if prefix and _has_submodule(gm, prefix):
        return prefix, type(gm.get_submodule(prefix)).__name__
    return f"{targets[0]}..{targets[-1]}", "Block"


def _segment(gm: fx.GraphModule, nodes: list[fx.Node], index: dict[fx.Node, int], dep: set[fx.Node],
             inp: fx.Node, out: fx.Node, body: list[fx.Node], class_name: str) -> fx.GraphModule:
    """A GraphModule computing ``out`` from ``inp`` with the nodes of ``body`` (and rebuilt constants)."""
    keep = set(body)
    stack = [a for n in body for a in n.all_input_nodes]
    while stack:
        a = stack.pop()
        if a in keep or a is inp:
            continue
        if a in dep:
            raise TraceError(f"internal: value {a.name} crosses a cut", "please report this model")
        keep.add(a)
        stack.extend(a.all_input_nodes)
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {inp: g.placeholder("x")}
    for n in sorted(keep, key=lambda n: index[n]):
        env[n] = g.node_copy(n, lambda a: env[a])
    g.output(env[out])
    g.lint()
    return fx.GraphModule(gm, g, class_name=class_name)


def _params_of(root: fx.GraphModule, layer: fx.GraphModule) -> list[tuple[str, nn.Parameter]]:
    out: list[tuple[str, nn.Parameter]] = []
    for n in layer.graph.nodes:
        if n.op == "call_module":
            sub = root.get_submodule(str(n.target))
            out += [(f"{n.target}.{k}", p) for k, p in sub.named_parameters()]
        elif n.op == "get_attr":
            value = _get_attr(root, str(n.target))
            if isinstance(value, nn.Parameter):
                out.append((str(n.target), value))
            elif isinstance(value, nn.Module):
                out += [(f"{n.target}.{k}", p) for k, p in value.named_parameters()]
    return out


# ----------------------------------------------------------------------------- HF transformers


class GPT2Embedding(nn.Module):  # type: ignore[misc]
    """Token plus position embeddings, then dropout; position ids rebuilt from the sequence length."""

    def __init__(self, wte: nn.Embedding, wpe: nn.Embedding, drop: nn.Module) -> None:
        super().__init__()
        self.wte, self.wpe, self.drop = wte, wpe, drop

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        return self.drop(self.wte(input_ids) + self.wpe(pos))


class TransformerBlock(nn.Module):  # type: ignore[misc]
    """One HF transformer block on hidden states only (causal masking by SDPA's ``is_causal``)."""

    def __init__(self, block: nn.Module, post: nn.Module | None = None) -> None:
        super().__init__()
        self.block = block
        self.post = post

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        out = self.block(hidden)
        if isinstance(out, (tuple, list)):
            out = out[0]
        return out if self.post is None else self.post(out)


class Chain(nn.Module):  # type: ignore[misc]
    """Modules applied one after the other (e.g. final norm then LM head)."""

    def __init__(self, *mods: nn.Module) -> None:
        super().__init__()
        self.mods = nn.ModuleList(mods)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for m in self.mods:
            x = m(x)
        return x


class BertEmbedding(nn.Module):  # type: ignore[misc]
    """BERT's embeddings (word, position, token type, norm, dropout) from token ids alone."""

    def __init__(self, embeddings: nn.Module) -> None:
        super().__init__()
        self.embeddings = embeddings

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embeddings(input_ids=input_ids)


def _check_sdpa(model: nn.Module) -> None:
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if impl not in ("sdpa", None):
        raise TraceError(f"{type(model).__name__} uses attn_implementation={impl!r}; its causal mask is built "
                         "outside the blocks", "build the model with attn_implementation='sdpa'")


_HfLayer = tuple[str, str, nn.Module, nn.Module | None]
"""One layer of a structural split: (name, type, runnable layer, dominant weighted module)."""


def _gpt2_layers(model: nn.Module) -> tuple[list[_HfLayer], list[tuple[str, ...]]]:
    """GPT-2's layers (embeddings, blocks, final norm with the LM head) and each one's module paths."""
    cls = type(model).__name__
    _check_sdpa(model)
    tr: Any = model.transformer if cls == "GPT2LMHeadModel" else model
    pre = "transformer." if cls == "GPT2LMHeadModel" else ""
    mods: list[_HfLayer] = [(f"{pre}wte", "Embedding", GPT2Embedding(tr.wte, tr.wpe, tr.drop), tr.wte)]
    scopes: list[tuple[str, ...]] = [(f"{pre}wte", f"{pre}wpe", f"{pre}drop")]
    blocks = list(tr.h)
    for i, block in enumerate(blocks):
        last = i == len(blocks) - 1 and cls == "GPT2Model"
        mods.append((f"{pre}h.{i}", type(block).__name__,
                     TransformerBlock(block, tr.ln_f if last else None), _dominant([block])))
        scopes.append((f"{pre}h.{i}", f"{pre}ln_f") if last else (f"{pre}h.{i}",))
    if cls == "GPT2LMHeadModel":
        mods.append(("lm_head", "Linear", Chain(tr.ln_f, model.lm_head), model.lm_head))
        scopes.append((f"{pre}ln_f", "lm_head"))
    return mods, scopes


def _bert_layers(model: nn.Module) -> tuple[list[_HfLayer], list[tuple[str, ...]]]:
    """BERT's layers (embeddings, encoder blocks, MLM head) and each one's module paths."""
    cls = type(model).__name__
    _check_sdpa(model)
    bert: Any = model.bert if cls == "BertForMaskedLM" else model
    pre = "bert." if cls == "BertForMaskedLM" else ""
    mods: list[_HfLayer] = [(f"{pre}embeddings", "BertEmbeddings", BertEmbedding(bert.embeddings),
                             bert.embeddings.word_embeddings)]
    scopes: list[tuple[str, ...]] = [(f"{pre}embeddings",)]
    for i, block in enumerate(bert.encoder.layer):
        mods.append((f"{pre}encoder.layer.{i}", type(block).__name__, TransformerBlock(block),
                     _dominant([block])))
        scopes.append((f"{pre}encoder.layer.{i}",))
    if cls == "BertForMaskedLM":
        mods.append(("cls", type(model.cls).__name__, model.cls, model.cls.predictions.decoder))
        scopes.append(("cls",))
    return mods, scopes


def _split_hf(model: nn.Module) -> LayeredModel | None:
    cls = type(model).__name__
    if not type(model).__module__.startswith("transformers."):
        return None
    if cls in ("GPT2LMHeadModel", "GPT2Model"):
        arch, (mods, scopes) = "gpt2", _gpt2_layers(model)
    elif cls in ("BertForMaskedLM", "BertModel"):
        arch, (mods, scopes) = "bert", _bert_layers(model)
    else:
        return None
    layer_params = [[(f"{name}.{k}", p) for k, p in layer.named_parameters(remove_duplicate=False)]
                    for name, _, layer, _ in mods]
    counts, nbytes, ties = _param_accounting(model, layer_params)
    feats = [weight_features(d) if d is not None else (None, None) for *_, d in mods]
    return LayeredModel(tuple(m[2] for m in mods), tuple(m[0] for m in mods), tuple(m[1] for m in mods),
                        tuple(f[0] for f in feats), tuple(f[1] for f in feats), counts, nbytes, ties,
                        f"structure:{arch}", tuple(scopes))


class _OneOutput(nn.Module):  # type: ignore[misc]
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kwargs = {"use_cache": False} if type(self.model).__module__.startswith("transformers.") else {}
        return primary_output(self.model(x, **kwargs))


def _export_data_flow(module: nn.Module, example_input: torch.Tensor) -> tuple[list[fx.Node], fx.Node, set[fx.Node]]:
    """The model's aten nodes (``torch.export``, non-strict), its input node, and the nodes computed from it."""
    try:
        ep = torch.export.export(_OneOutput(module), (example_input,), strict=False)
    except Exception as exc:
        raise TraceError(f"torch.export failed: {str(exc).splitlines()[0][:200]}", "") from None
    user_inputs = set(ep.graph_signature.user_inputs)
    nodes = list(ep.graph.nodes)
    (inp,) = [n for n in nodes if n.op == "placeholder" and n.name in user_inputs]
    g = nx.DiGraph()
    for n in nodes:
        g.add_node(n)
        for a in n.all_input_nodes:
            g.add_edge(a, n)
    return nodes, inp, nx.descendants(g, inp)


def _scope_of(n: fx.Node, scopes: tuple[tuple[str, ...], ...]) -> int | None:
    """The layer whose module paths run node ``n`` (longest matching path), or None."""
    stack = n.meta.get("nn_module_stack") or {}
    best: tuple[int, int] | None = None
    for path, _ in stack.values():
        path = str(path).removeprefix("model.")
        for i, prefixes in enumerate(scopes):
            for p in prefixes:
                if (path == p or path.startswith(p + ".")) and (best is None or len(p) >= best[1]):
                    best = (i, len(p))
    return None if best is None else best[0]


def _attribute_layers(nodes: list[fx.Node], inp: fx.Node, dep: set[fx.Node], layered: LayeredModel
                      ) -> dict[fx.Node, int]:
    """Each input-dependent node's layer (-1: the input); code outside every scope follows its data."""
    layer: dict[fx.Node, int] = {inp: -1}
    for n in nodes:
        if n not in dep or n.op == "output":
            continue
        own = _scope_of(n, layered.scopes)
        ins = [layer[a] for a in n.all_input_nodes if a in layer]
        layer[n] = own if own is not None else max(ins, default=-1)
    for n in reversed(nodes):  # code on the raw input alone joins the first layer that uses it
        if n in dep and layer.get(n) == -1 and n.op != "output":
            users = [layer[u] for u in n.users if u in layer and layer[u] >= 0]
            layer[n] = min(users, default=len(layered) - 1)
    for a in nodes[-1].all_input_nodes:
        layer.setdefault(a, len(layered) - 1)
    return layer


def _crossing_counts(layer: dict[fx.Node, int], dep: set[fx.Node], out_node: fx.Node, n_layers: int) -> list[int]:
    """Per cut (after layer k), how many input-dependent values made at or before k are used after it."""
    counts = []
    for k in range(n_layers - 1):
        crossing = {v for v, lv in layer.items() if v in dep and lv <= k
                    and any(layer.get(u, n_layers) > k for u in v.users if u is not out_node)}
        crossing |= {v for v in out_node.all_input_nodes if v in dep and layer[v] <= k}
        counts.append(len(crossing))
    return counts


def verify_cuts(module: nn.Module, example_input: torch.Tensor, layered: LayeredModel) -> list[int]:
    """Check a structural split against the model's data flow, traced by ``torch.export`` (non-strict).

    Every aten node is attributed to the layer whose module paths (``layered.scopes``) run
    it; code outside those modules goes with the layer its data comes from. Returns, per
    cut, how many values computed from the input cross it; raises TraceError unless every
    count is 1 (values built from static shapes, like position ids and the causal mask, are
    not computed from the input and never count). Slow (seconds): tests and checks only.
    """
    if not layered.scopes:
        raise TraceError("verify_cuts needs a structural split (fx splits are valid by construction)", "")
    nodes, inp, dep = _export_data_flow(module, example_input)
    layer = _attribute_layers(nodes, inp, dep, layered)
    counts = _crossing_counts(layer, dep, nodes[-1], len(layered))
    bad = [(k, c) for k, c in enumerate(counts) if c != 1]
    if bad:
        k, c = bad[0]
        raise TraceError(f"{c} tensors cross the cut after layer {k} ({layered.names[k]})",
                         "this model's structure differs from the known one; give it as an nn.Sequential")
    return counts


# ----------------------------------------------------------------------------- entry point


def split_model(module: nn.Module, example_input: torch.Tensor) -> LayeredModel:
    """Cut ``module`` into layers at the points where one activation tensor crosses.

    Raises TraceError when the model cannot be traced (with why and what to do), and
    ProfileError when the model rejects ``example_input``.
    """
    hf = _split_hf(module)
    if hf is not None:
        return hf
    return _split_fx(module, example_input)

"""Cut a model torch.fx can trace into layers: contiguous blocks between points where one tensor crosses.

How: ``torch.fx`` traces the model (standard ``torch.nn`` modules are leaves, but a ``TransformerEncoder``
called without a mask, traced as its layers one after another); if that fails,
it is traced again with the model's direct children as leaves (so a model written as an
``nn.Sequential`` of blocks always traces). The traced nodes and their data edges become a
``networkx`` graph. A cut after node *k* is valid when exactly one value computed from the
input crosses it and that value is a tensor; values that do not depend on the input
(parameters, constants, masks built from static shapes) are rebuilt inside every layer that
needs them, so they never count. The pieces between valid cuts are merged so that every
layer holds a weighted operation (convolution, linear, embedding, attention): parameter-free
or normalisation pieces (ReLU, pooling, flatten, batch norm, dropout) join the layer before
them. A residual block is one piece, so one layer. Each layer is an ``fx.GraphModule``
taking one tensor and returning one, using the model's own parameter objects.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import networkx as nx
import torch
from torch import fx, nn

from planner.errors import TraceError
from planner.profiler.layered import LayeredModel, dominant, is_heavy, param_accounting, rejects_input, weight_features


class _Tracer(fx.Tracer):  # type: ignore[misc]
    def __init__(self, leaves: Sequence[nn.Module] = ()) -> None:
        super().__init__()
        self._leaves = {id(m) for m in leaves}

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return id(m) in self._leaves or super().is_leaf_module(m, module_qualified_name)

    def call_module(self, m: nn.Module, forward: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """torch.nn's ``TransformerEncoder`` called on its input alone (no mask) as the calls it makes: each of its
        layers on the output of the one before, then its norm, so that each layer is a layer of the profile (a
        leaf, it was one layer holding every block); in training it runs them so (its fast path is inference's)."""
        if isinstance(m, nn.TransformerEncoder) and id(m) not in self._leaves and len(args) == 1 \
                and all(v is None for v in kwargs.values()):
            x = args[0]
            for layer in m.layers:
                x = self.call_module(layer, layer.forward, (x,), {})
            return x if m.norm is None else self.call_module(m.norm, m.norm.forward, (x,), {})
        return super().call_module(m, forward, args, kwargs)


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
        raise rejects_input(example_input, exc) from None


def data_graph(nodes: Sequence[fx.Node]) -> nx.DiGraph:
    """The nodes and their data edges (argument -> user) as a networkx graph."""
    g = nx.DiGraph()
    for n in nodes:
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
        raise TraceError(f"{type(module).__name__}.forward returns {_returned(result)}, not one tensor",
                         "wrap the model so forward() returns the tensor the loss is computed from")
    ph = placeholders[0]
    dep = nx.descendants(data_graph(nodes), ph) | {ph}
    dep.discard(out_node)
    return _Traced(gm, method, nodes, {n: i for i, n in enumerate(nodes)}, dep, ph, result)


def _returned(result: Any) -> str:
    """What a traced forward returns, in the user's words: ``a dict (keys 'logits', 'hidden')``, ``a tuple of 2``
    (fx records a dict or list as its own immutable types)."""
    if isinstance(result, dict):
        return f"a dict (keys {', '.join(repr(k) for k in list(result)[:6])})"
    if isinstance(result, (tuple, list)):
        return f"a {'tuple' if isinstance(result, tuple) else 'list'} of {len(result)}"
    return type(result).__name__


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
            # a leaf holding weighted modules is weighted: a direct child (fx-children), or a torch.nn block
            # that fx keeps whole (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer, nn.Transformer)
            if is_heavy(sub) or (any(True for _ in sub.parameters()) and dominant([sub]) is not None):
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
    dom = dominant([module.get_submodule(x) for x in dict.fromkeys(targets) if _has_submodule(module, x)])
    fin, fout = weight_features(dom) if dom is not None else (None, None)
    return _FxLayer(layer, name, type_, fin, fout)


def split_fx(module: nn.Module, example_input: torch.Tensor) -> LayeredModel:
    """``module`` cut by torch.fx at every point where one tensor crosses (see the module docstring)."""
    t = _trace_one_tensor(module, example_input)
    pieces = _pieces(t, _valid_cuts(t))
    built = [_fx_layer(module, t, [pieces[i] for i in group], f"Layer{k}")
             for k, group in enumerate(_merge_light(t, pieces))]
    layers = tuple(b.module for b in built)
    counts, nbytes, ties = param_accounting(module, [_params_of(t.gm, layer) for layer in layers])
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

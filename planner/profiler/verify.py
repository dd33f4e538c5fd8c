"""Check a structural split against the model's real data flow, traced by ``torch.export``.

``torch.export`` (non-strict) traces the whole model to aten ops; the ops go into a
``networkx`` graph, each is attributed to a layer by its module path (``LayeredModel.scopes``),
and every cut must be crossed by exactly one value computed from the input. Values built
from static shapes (position ids, rotary tables, the causal mask) are not computed from the
input and never count. Slow (seconds): the tests and ``scripts/bench_profile.py`` run it,
profiling does not.
"""

from __future__ import annotations

import networkx as nx
import torch
from torch import fx, nn

from planner.errors import TraceError
from planner.profiler.fxsplit import data_graph
from planner.profiler.layered import LayeredModel, primary_output


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
    return nodes, inp, nx.descendants(data_graph(nodes), inp)


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


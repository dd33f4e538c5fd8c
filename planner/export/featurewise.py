"""Whether a split layer's features may stay sharded across its other operations (planner.export.parallel).

A ``split_out`` layer followed by a ``split_in`` one keeps the activation between them sharded over its
features (Megatron's column -> row pair: no all-gather). That holds only where the ops of the first layer after
its ``nn.Linear`` and those of the second before its own treat each feature on its own (an activation function, a
dropout, a scale by a number) and nothing else reads the sharded value: a norm over the features, a softmax, a
reshape or a residual sum with the layer's input needs them all. An fx-split layer (``fxsplit``) is read from
its graph; a bare ``nn.Linear`` has no other ops; any other module is taken as mixing its features. Where either
side mixes them, the pair gathers the activation (``output_layouts=Replicate()``), as the cost model prices a
``split_out`` layer anyway (planner.costmodel.layers: its output all-gathered).
"""

from __future__ import annotations

import numbers
import operator

from torch import fx, nn

FEATURE_LOCAL_MODULES: tuple[type[nn.Module], ...] = (
    nn.ReLU, nn.ReLU6, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.LeakyReLU, nn.ELU, nn.SELU, nn.CELU, nn.Mish,
    nn.Softplus, nn.Hardtanh, nn.Hardswish, nn.Hardsigmoid, nn.Dropout, nn.Identity,
)
"""Modules that compute each feature from that feature alone."""

FEATURE_LOCAL_NAMES = frozenset({
    "relu", "relu_", "relu6", "gelu", "silu", "tanh", "sigmoid", "leaky_relu", "elu", "selu", "celu", "mish",
    "softplus", "hardtanh", "hardswish", "hardsigmoid", "dropout", "contiguous", "neg", "abs", "exp",
})
"""Functions and tensor methods (by name) that compute each feature from that feature alone."""

_SCALAR_OPS = frozenset({operator.mul, operator.add, operator.sub, operator.truediv})
"""Arithmetic that is feature-wise when its other operand is a number."""


def _feature_local(gm: fx.GraphModule, node: fx.Node, source: fx.Node) -> bool:
    """Whether ``node`` computes each feature of its output from that feature of ``source`` alone (its only
    tensor input)."""
    tensors = node.all_input_nodes
    if tensors != [source]:
        return False
    if node.op == "call_module":
        return isinstance(gm.get_submodule(str(node.target)), FEATURE_LOCAL_MODULES)
    if node.op == "call_method":
        return str(node.target) in FEATURE_LOCAL_NAMES
    if node.op == "call_function":
        if node.target in _SCALAR_OPS:
            return all(a is source or isinstance(a, numbers.Number) for a in node.args)
        return getattr(node.target, "__name__", "") in FEATURE_LOCAL_NAMES
    return False


def _linear_node(gm: fx.GraphModule, target: str) -> fx.Node | None:
    calls = [n for n in gm.graph.nodes if n.op == "call_module" and str(n.target) == target]
    return calls[0] if len(calls) == 1 else None


def _chain(gm: fx.GraphModule, start: fx.Node, stop: fx.Node) -> bool:
    """Whether ``start`` reaches ``stop`` through feature-wise ops only, each value read by the next op alone."""
    node = start
    while node is not stop:
        users = list(node.users)
        if len(users) != 1:
            return False
        nxt = users[0]
        if nxt is not stop and not _feature_local(gm, nxt, node):
            return False
        if nxt is stop and stop.op != "output" and stop.all_input_nodes != [node]:
            return False
        node = nxt
    return True


def keeps_features_sharded(layer: nn.Module, linear: str, side: str) -> bool:
    """Whether ``layer``'s ops on ``side`` ("in": before its nn.Linear ``linear``, from the layer's input; "out":
    after it, to the layer's output) are feature-wise, so that the features may cross them sharded."""
    if isinstance(layer, nn.Linear):
        return True
    if not isinstance(layer, fx.GraphModule):
        return False
    node = _linear_node(layer, linear)
    if node is None:
        return False
    if side == "in":
        inputs = [n for n in layer.graph.nodes if n.op == "placeholder"]
        return len(inputs) == 1 and _chain(layer, inputs[0], node)
    (out,) = [n for n in layer.graph.nodes if n.op == "output"]
    return _chain(layer, node, out)

"""export.ties: the export's one tie value (the profiler's ir.Tie in the runnable layers) and DeepSpeed's groups."""

from __future__ import annotations

from planner import ir
from planner.export.layers import layer_param_counts
from planner.export.ties import LayerTie, find_ties, tie_groups
from tests.test_runner import tiny_tied


def test_ties_are_found_and_counted_once() -> None:
    model, _ = tiny_tied()
    layers = tuple(model.children())
    (tie,) = find_ties(layers)
    assert tie.tie == ir.Tie("0.emb.weight", (0, 3), 320, 1280)  # the profiler's value, from its accounting
    assert tie.layers == (0, 3) and tie.paths == ("emb.weight", "emb.weight")
    assert tie.param(layers, 1) is layers[3].emb.weight
    assert layer_param_counts(layers) == [320, 272, 0, 32]  # the embedding counted in layer 0 only


def test_ties_that_share_a_layer_form_one_deepspeed_group() -> None:
    """DeepSpeed gives a layer one tied-module key: ties connected through a layer share a holder."""
    a = find_ties(tuple(tiny_tied()[0].children()))[0]
    b = LayerTie(ir.Tie("other", (3, 5), 4, 16), ("bias", "weight"))
    assert tie_groups([a, b]) == [([0, 3, 5], ["members.0.emb.weight", "members.1.bias"])]
    assert tie_groups([a]) == [([0, 3], ["members.0.emb.weight"])]

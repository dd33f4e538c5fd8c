"""planner.export.deepspeed_ties: a tie group's layers become TiedLayerSpecs sharing one holder."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from planner.export import deepspeed_ties as ties

pytest.importorskip("deepspeed")


def test_tied_layers_become_tied_layer_specs() -> None:
    from deepspeed.pipe import TiedLayerSpec

    from tests.test_runner import tiny_tied

    torch.manual_seed(0)
    model, _ = tiny_tied()
    layers = list(model.children())
    specs = ties.layer_specs(layers)
    tied = [i for i, s in enumerate(specs) if isinstance(s, TiedLayerSpec)]
    assert tied == [0, 3]
    assert specs[0].key == specs[3].key
    holder = specs[0].build()
    assert holder.members[0] is layers[0] and holder.members[1] is layers[3]
    (attr,) = specs[0].tied_weight_attr
    assert ties.TieHolder.get_parameter(holder, attr) is layers[0].emb.weight
    assert [isinstance(s, nn.Module) for s in specs] == [False, True, True, False]

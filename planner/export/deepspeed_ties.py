"""Tied weights as DeepSpeed's pipeline sees them (``TiedLayerSpec``), for :mod:`planner.export.deepspeed`.

A parameter object used by several layers (GPT-2's ``wte``/``lm_head``) goes through ``TiedLayerSpec``: the
layers of one tie group (:func:`planner.export.ties.tie_groups`) live in one holder module that every stage
owning one of them builds; each position runs its own member, and DeepSpeed broadcasts the tied weights at
start and all-reduces their gradients between the stages (``allreduce_tied_weight_gradients``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from planner.export.ties import find_ties, tie_groups


class TieHolder(nn.Module):  # type: ignore[misc]
    """The layers of one tie group, built as one DeepSpeed tied module."""

    def __init__(self, members: Sequence[nn.Module]) -> None:
        super().__init__()
        self.members = nn.ModuleList(members)


class _RunMember:
    """DeepSpeed calls ``forward_fn(tied_module, x)``: run member ``j`` of the holder."""

    def __init__(self, j: int) -> None:
        self.j = j
        self.__name__ = f"tied_member_{j}"

    def __call__(self, holder: TieHolder, x: Any) -> Any:
        return holder.members[self.j](x)


def layer_specs(layers: Sequence[nn.Module]) -> list[Any]:
    """Layers as DeepSpeed sees them: plain modules, and TiedLayerSpec for tied ones."""
    from deepspeed.pipe import TiedLayerSpec

    specs: list[Any] = list(layers)
    for g, (members, attrs) in enumerate(tie_groups(find_ties(layers))):
        group = [layers[i] for i in members]
        for j, i in enumerate(members):
            specs[i] = TiedLayerSpec(f"tie{g}", TieHolder, group, forward_fn=_RunMember(j), tied_weight_attr=attrs)
    return specs

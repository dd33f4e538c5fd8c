"""Tied weights in the exported programs: one value, :class:`LayerTie`, and what each engine derives from it.

A tied weight is a parameter object several layers hold (GPT-2's ``wte``/``lm_head``, Llama with
``tie_word_embeddings``). The profiler records it as a :class:`planner.ir.Tie` (its name, the
layers that use it, its size; counted once, in its first layer); :func:`find_ties` finds the same
value in the runnable layers with the profiler's own accounting
(planner.export.layers.param_accounting_of, with which check_layers_match also holds the layers to
the plan's profile's ties) and adds each layer's name for the parameter. DeepSpeed builds one tied
module per group of ties that share a layer (:func:`tie_groups`, ``TiedLayerSpec``); torch sums a
tie's gradient over the pipeline ranks that hold it, per data and tensor coordinate, and over a rank's own
copies where FSDP sharded two of its interleaved chunks holding it apart (:func:`tie_sync`, :func:`sum_tie_grads`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from planner import ir
from planner.export.layers import param_accounting_of
from planner.export.sharding import local


@dataclass(frozen=True)
class LayerTie:
    """A tied weight in the runnable layers: the profile's :class:`planner.ir.Tie` (the shared
    parameter's name, the layers that use it, its size) and ``paths[k]``, its name inside layer
    ``tie.layers[k]``. The export's one tie value: DeepSpeed's tied modules (:func:`tie_groups`) and
    torch's gradient sums between stages (:func:`tie_sync`) are derived from it."""

    tie: ir.Tie
    paths: tuple[str, ...]

    @property
    def layers(self) -> tuple[int, ...]:
        return self.tie.layers

    def param(self, layers: Sequence[nn.Module], k: int) -> nn.Parameter:
        """The tied parameter as layer ``tie.layers[k]`` holds it (its own object once sharded)."""
        p: nn.Parameter = layers[self.tie.layers[k]].get_parameter(self.paths[k])
        return p


def find_ties(layers: Sequence[nn.Module]) -> tuple[LayerTie, ...]:
    """Parameters that more than one layer holds (the same object), e.g. GPT-2's wte/lm_head."""
    seq = nn.Sequential(*layers)
    out = []
    for tie in param_accounting_of(layers)[1]:
        shared = seq.get_parameter(tie.name)
        paths = tuple(next(path for path, p in layers[i].named_parameters() if p is shared) for i in tie.layers)
        out.append(LayerTie(tie, paths))
    return tuple(out)


def tie_groups(ties: Sequence[LayerTie]) -> list[tuple[list[int], list[str]]]:
    """DeepSpeed's tied modules: the layers of ties that share a layer (connected through it) form one
    holder (a layer has one ``TiedLayerSpec`` key), with each tie's parameter name in the holder."""
    parent: dict[int, int] = {}

    def find(i: int) -> int:
        while parent.setdefault(i, i) != i:
            i = parent[i]
        return i

    for t in ties:
        for i in t.layers[1:]:
            parent[find(i)] = find(t.layers[0])
    groups: dict[int, list[int]] = {}
    for t in ties:
        members = groups.setdefault(find(t.layers[0]), [])
        members.extend(i for i in t.layers if i not in members)
    out = []
    for root, members in sorted(groups.items()):
        members.sort()
        attrs = [f"members.{members.index(t.layers[0])}.{t.paths[0]}" for t in ties if find(t.layers[0]) == root]
        out.append((members, attrs))
    return out


@dataclass(frozen=True, eq=False)
class TieSync:
    """One tie as this rank sums its gradient each step: ``params``, this rank's copies of the parameter (one object
    where its chunks share it; under FSDP each chunk holding the tie has its own), and ``group``, the process group
    over the pipeline ranks holding it at this rank's data and tensor coordinates (None: this rank holds all)."""

    group: Any
    params: tuple[nn.Parameter, ...]


def tie_sync(layers: Sequence[nn.Module], ties: Sequence[LayerTie], plan: ir.Plan, mesh: Any) -> list[TieSync]:
    """Per tie held by two or more pipeline ranks, or by two or more parameter objects of this rank (an interleaved
    plan's chunks on one device group, each sharded by FSDP on its own): the process group (per data and tensor
    coordinate) over those ranks, and this rank's copies of the parameter. ``ties`` are found before sharding: FSDP
    and tensor parallelism give each stage its own parameter object, which ``LayerTie.param`` reads afterwards."""
    k = plan.pipeline_stages
    owner = {i: c % k for c, st in enumerate(plan.stages) for i in range(*st.layers)}
    pp_rank, dp_rank, tp_rank = mesh.get_coordinate()
    dp, tp = mesh["dp"].size(), mesh["tp"].size()
    out = []
    for tie in ties:
        pp_ranks = sorted({owner[i] for i in tie.layers})
        copies = tuple({id(p): p for p in (tie.param(layers, j) for j, i in enumerate(tie.layers)
                                           if owner[i] == pp_rank)}.values())
        group = None
        if len(pp_ranks) > 1:
            for d in range(dp):  # every rank creates every group, in the same order
                for t in range(tp):
                    made = torch.distributed.new_group([p * dp * tp + d * tp + t for p in pp_ranks])
                    group = made if (d, t) == (dp_rank, tp_rank) else group
        if copies and (group is not None or len(copies) > 1):
            out.append(TieSync(group, copies))
    return out


def align_ties(ties: Sequence[TieSync]) -> None:
    """Give every copy of each tied parameter the first pipeline rank's values (its first copy's)."""
    import torch.distributed as dist

    with torch.no_grad():
        for sync in ties:
            first = local(sync.params[0])
            if sync.group is not None:
                dist.broadcast(first, src=dist.get_global_rank(sync.group, 0), group=sync.group)
            for param in sync.params[1:]:
                local(param).copy_(first)


def sum_tie_grads(ties: Sequence[TieSync]) -> None:
    """Sum each tied parameter's gradient (its local shard) over this rank's copies and the stages holding it, and
    give every copy the sum: the copies step as one parameter."""
    import torch.distributed as dist

    for sync in ties:
        for param in sync.params:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
        total = local(sync.params[0].grad)
        for param in sync.params[1:]:
            total.add_(local(param.grad))
        if sync.group is not None:
            dist.all_reduce(total, group=sync.group)
        for param in sync.params[1:]:
            local(param.grad).copy_(total)

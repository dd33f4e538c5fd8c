"""Even servers: the sub-clusters an engine whose launcher starts as many processes on every server can use.

Pure (no torch, click or rich). torchrun (``--nproc-per-node``) and DeepSpeed's hostfile start the same
number of processes on every server a job uses (every engine of :data:`planner.engines.ENGINES`), so
on a cluster whose servers hold different numbers of GPUs a plan must leave some idle. The search's own
space does not hold that rule (its device groups follow the GPUs in order), so for such an engine it
searches each even sub-cluster instead (:func:`even_subclusters`) and keeps the fastest plan. On even servers
too its best plans can all place unevenly (5 one-GPU stages on two servers of 4); it then searches the even
layouts of fewer GPUs (:func:`even_layouts`).
"""

from __future__ import annotations

import dataclasses

from planner import ir

__all__ = ["even_layouts", "even_subclusters", "uneven"]


def uneven(cluster: ir.Cluster) -> bool:
    """Whether the cluster's servers hold different numbers of GPUs."""
    return len({len(node.gpus) for node in cluster.nodes}) > 1


def _cut(cluster: ir.Cluster, nodes: list[ir.Node], per_server: int) -> ir.Cluster:
    cut = tuple(dataclasses.replace(node, gpus=node.gpus[:per_server]) for node in nodes)
    return dataclasses.replace(cluster, nodes=cut)


def even_subclusters(cluster: ir.Cluster) -> list[ir.Cluster]:
    """For every server size n the cluster has: the servers of n or more GPUs, each using its first n
    (the servers of the largest size alone; every server at the smallest size; and those between),
    largest sub-cluster first. One: the cluster itself, when its servers are even already."""
    if not uneven(cluster):
        return [cluster]
    sizes = sorted({len(node.gpus) for node in cluster.nodes})
    subs = [_cut(cluster, [nd for nd in cluster.nodes if len(nd.gpus) >= n], n) for n in sizes]
    return sorted(subs, key=lambda c: -len(c.gpus))


def even_layouts(cluster: ir.Cluster) -> list[list[ir.Cluster]]:
    """The sub-clusters of an even cluster's first ``s`` servers using each its first ``n`` GPUs, the cluster
    itself left out, grouped by their GPU count ``s x n``, most GPUs first."""
    per = len(cluster.nodes[0].gpus) if cluster.nodes else 0
    groups: dict[int, list[ir.Cluster]] = {}
    for s in range(1, len(cluster.nodes) + 1):
        for n in range(1, per + 1):
            if (s, n) != (len(cluster.nodes), per):
                groups.setdefault(s * n, []).append(_cut(cluster, list(cluster.nodes[:s]), n))
    return [groups[k] for k in sorted(groups, reverse=True)]

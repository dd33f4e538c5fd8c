"""Clusters: loading presets and files, the device hierarchy, device groups and their links.

A cluster (``ir.Cluster``) is servers ("nodes") of GPUs; GPUs inside a server talk over the
``intra_node`` link, servers over the ``inter_node`` link (DESIGN.md section 4). This module

- loads a cluster from a preset name (``profiles/clusters/<name>.json``) or a JSON path and
  validates it (:func:`load_cluster`, :func:`validate_cluster`, :func:`list_presets`);
- builds the hierarchy as a networkx graph, GPU -> server -> network (:func:`hierarchy_graph`);
- describes a device group: how many devices, the slowest GPU, the smallest memory, the
  slowest link it spans, how many servers it spans (:func:`group_of`, :class:`Group`);
- names the link between two consecutive pipeline stages (:func:`link_between`);
- answers where a stage's devices sit: which tensor degrees keep every tensor group inside one server
  (:func:`server_share`), a tensor group that spans servers (:func:`spanning_tensor_group`), and how many
  of a plan's processes each server runs (:func:`processes_per_server`, :func:`uneven_servers`).

Pure: no torch, click or rich (networkx is imported only by :func:`hierarchy_graph`).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner import ir
from planner.errors import ClusterError, FormatError, shown_devices
from planner.jsonio import read_json

PRESET_DIR = Path(__file__).resolve().parent.parent / "profiles" / "clusters"
"""Where the shipped cluster presets live (one ``<name>.json`` per preset)."""


# ----------------------------------------------------------------------------- loading


def preset_names() -> list[str]:
    """Names of the shipped presets, sorted."""
    if not PRESET_DIR.is_dir():
        return []
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def preset_description(name: str) -> str:
    """The ``description`` a preset file carries (empty when none)."""
    import json

    try:
        doc = json.loads((PRESET_DIR / f"{name}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    desc = doc.get("description", "") if isinstance(doc, dict) else ""
    return desc if isinstance(desc, str) else ""


def list_presets() -> list[ir.Cluster]:
    """Every shipped preset, loaded and validated, sorted by name."""
    return [load_cluster(name) for name in preset_names()]


def load_cluster(name_or_path: str) -> ir.Cluster:
    """A cluster from a preset name or a cluster JSON file, validated.

    A value that names an existing file (or folder, refused as one) that is no preset's name, or ends in ``.json``,
    is read as a file;
    anything else must be a preset name (the error lists them).
    """
    path = Path(name_or_path)
    named = name_or_path.endswith(".json") or "/" in name_or_path
    if path.is_file() or named or (path.exists() and name_or_path not in preset_names()):  # a folder: says so
        doc = read_json(path, "cluster")
        source = str(path)
    else:
        names = preset_names()
        if name_or_path not in names:
            raise ClusterError(f"unknown cluster preset {name_or_path!r}",
                               f"use a cluster JSON file or one of: {', '.join(names) or '(none shipped)'}")
        source = str(PRESET_DIR / f"{name_or_path}.json")
        doc = read_json(source, "cluster")
    return cluster_from_dict(doc, source)


def cluster_from_dict(doc: Any, source: str = "cluster") -> ir.Cluster:
    """Parse and validate a cluster document (FormatError/ClusterError name the field)."""
    cluster = ir.Cluster.from_dict(doc, source)
    validate_cluster(cluster, source)
    return cluster


def validate_cluster(cluster: ir.Cluster, source: str = "cluster") -> None:
    """Check what ``ir.Cluster.from_dict`` cannot: GPUs present, finite positive links, names.

    Raises ClusterError naming the field and the value.
    """
    if not cluster.nodes or not cluster.gpus:
        raise ClusterError(f"{source}: the cluster has no GPUs", "list at least one node with one GPU")
    for i, node in enumerate(cluster.nodes):
        if not node.gpus:
            raise ClusterError(f"{source}: nodes[{i}] ({node.name}) has no GPUs", "give every node a GPU")
        for j, gpu in enumerate(node.gpus):
            if not (math.isfinite(gpu.flops) and gpu.flops > 0):
                raise ClusterError(f"{source}: nodes[{i}].gpus[{j}].flops is {gpu.flops!r}", "use a positive FLOP/s")
            if gpu.memory_bytes <= 0:
                raise ClusterError(f"{source}: nodes[{i}].gpus[{j}].memory_bytes is {gpu.memory_bytes!r}",
                                   "use a positive byte count")
    for level, link in cluster.links:
        if not (math.isfinite(link.bandwidth_Bps) and link.bandwidth_Bps > 0):
            raise ClusterError(f"{source}: links.{level}.bandwidth_Bps is {link.bandwidth_Bps!r}",
                               "a link needs a positive bandwidth in bytes per second")
        for field in ir.Link.BUS_FIELDS:
            bus = getattr(link, field)
            if bus is not None and not (math.isfinite(bus) and bus > 0):
                raise ClusterError(f"{source}: links.{level}.{field} is {bus!r}",
                                   "use the positive bus bandwidth the collective reaches (bytes/s), or leave it out")
        for field in ("latency_s", "collective_latency_s"):
            value = getattr(link, field)
            if not (math.isfinite(value) and value >= 0):
                raise ClusterError(f"{source}: links.{level}.{field} is {value!r}",
                                   "a link needs a non-negative latency in seconds")
    node_names = [n.name for n in cluster.nodes]
    if len(set(node_names)) != len(node_names):
        raise ClusterError(f"{source}: node names repeat: {node_names}", "give every node its own name")
    for level in ir.LINK_LEVELS:
        try:
            cluster.link(level)
        except KeyError:
            raise FormatError(f"{source}.links: missing field {level!r}", "define intra_node and inter_node") from None


# ----------------------------------------------------------------------------- hierarchy


def hierarchy_graph(cluster: ir.Cluster) -> Any:
    """The hierarchy as a networkx graph: ``network`` -> servers -> GPUs.

    Node attributes: ``level`` ("network", "node", "gpu"); GPUs carry ``flops`` and
    ``memory_bytes``. Edge attributes: ``level`` (the link level a message crossing the
    edge uses: ``intra_node`` for GPU-server edges, ``inter_node`` for server-network
    edges), ``bandwidth_Bps``, ``latency_s``, ``link`` (the level's ir.Link, for its collectives' bandwidths). The path
    between two GPUs crosses the slowest link of the pair (:func:`path_link`).
    """
    import networkx as nx

    g = nx.Graph()
    g.add_node("network", level="network")
    inter, intra = cluster.link("inter_node"), cluster.link("intra_node")
    for node in cluster.nodes:
        g.add_node(f"node:{node.name}", level="node")
        g.add_edge("network", f"node:{node.name}", level="inter_node", bandwidth_Bps=inter.bandwidth_Bps,
                   latency_s=inter.latency_s, link=inter)
        for gpu in node.gpus:
            g.add_node(gpu.name, level="gpu", flops=gpu.flops, memory_bytes=gpu.memory_bytes, server=node.name)
            g.add_edge(f"node:{node.name}", gpu.name, level="intra_node", bandwidth_Bps=intra.bandwidth_Bps,
                       latency_s=intra.latency_s, link=intra)
    return g


def path_link(graph: Any, a: str, b: str) -> ir.Link | None:
    """The slowest link on the graph path between GPUs ``a`` and ``b`` (None when a == b)."""
    import networkx as nx

    if a == b:
        return None
    path = nx.shortest_path(graph, a, b)
    edges = [graph.edges[u, v] for u, v in itertools.pairwise(path)]
    slow = min(edges, key=lambda e: e["bandwidth_Bps"])
    lat = max(e["latency_s"] for e in edges)
    ar, ag = (min(getattr(e["link"], kind) for e in edges) for kind in ("allreduce_Bps", "allgather_Bps"))
    fixed = max(e["link"].collective_latency_s for e in edges)
    bw = slow["bandwidth_Bps"]
    return ir.Link(bw, lat, None if ar == bw else ar, None if ag == bw else ag, fixed)


# ----------------------------------------------------------------------------- groups


@dataclass(frozen=True)
class Index:
    """Fast look-ups for one cluster: device order, device -> server."""

    names: tuple[str, ...]
    node_of: dict[str, int]
    gpu_of: dict[str, ir.GPU]
    node_start: tuple[int, ...]
    """Flat index of each server's first GPU (cluster order), plus the total at the end."""
    position: dict[str, int]
    """Each device's place in cluster order."""
    node_at: tuple[int, ...]
    """The server of each device, in cluster order."""

    def __hash__(self) -> int:
        return hash(self.names)


@functools.lru_cache(maxsize=64)
def index(cluster: ir.Cluster) -> Index:
    """Device order and device -> server map of ``cluster`` (cached)."""
    names: list[str] = []
    node_of: dict[str, int] = {}
    gpu_of: dict[str, ir.GPU] = {}
    starts = []
    for n, node in enumerate(cluster.nodes):
        starts.append(len(names))
        for gpu in node.gpus:
            names.append(gpu.name)
            node_of[gpu.name] = n
            gpu_of[gpu.name] = gpu
    starts.append(len(names))
    return Index(tuple(names), node_of, gpu_of, tuple(starts), {d: i for i, d in enumerate(names)},
                 tuple(node_of[d] for d in names))


def memory_bandwidth_Bps(cluster: ir.Cluster, devices: Sequence[str]) -> float | None:
    """The slowest memory bandwidth among ``devices``; None when any of them does not give one."""
    gpu_of = index(cluster).gpu_of
    values = [gpu_of[d].memory_bandwidth_Bps for d in devices if d in gpu_of]
    if not values or any(v is None for v in values):
        return None
    return min(v for v in values if v is not None)


@dataclass(frozen=True)
class Group:
    """A device group as the cost model sees it.

    ``n`` devices; ``peaks`` their distinct peaks, lowest first (the cost model times the group on
    the one its profile's times take longest on, as data parallel waits for it:
    ``planner.costmodel.precision.slowest_peak``); ``memory_bytes``
    the smallest memory; ``nodes`` how many servers it spans and ``per_node`` the fewest of its
    GPUs in one of them; ``link`` the slowest link the group spans (``intra_node`` inside one
    server, else ``inter_node``); ``intra`` and ``inter`` the cluster's two links (for the
    hierarchical all-reduce).
    """

    n: int
    peaks: tuple[float, ...]
    memory_bytes: int
    nodes: int
    per_node: int
    link: ir.Link
    intra: ir.Link
    inter: ir.Link

    @property
    def spans_servers(self) -> bool:
        return self.nodes > 1

    @property
    def level(self) -> str:
        return "inter_node" if self.nodes > 1 else "intra_node"

    def tensor_group(self, tp: int) -> Group:
        """One of the group's tensor-parallel groups of ``tp`` devices: inside one server (the
        search's rule), or the whole group when ``tp`` is all of it (a version-1 split stage)."""
        if tp >= self.n:
            return self
        return dataclasses.replace(self, n=tp, nodes=1, per_node=tp, link=self.intra)

    def data_group(self, tp: int) -> Group:
        """One of its data-parallel groups: the ``n / tp`` devices at the same tensor rank, one per
        tensor group, spread over the same servers (``per_node / tp`` of them in each)."""
        dp = max(self.n // tp, 1)
        nodes = min(self.nodes, dp)
        return dataclasses.replace(self, n=dp, nodes=nodes, per_node=max(dp // nodes, 1),
                                   link=self.inter if nodes > 1 else self.intra)


def group_of(cluster: ir.Cluster, devices: Sequence[str], number_format: str = "fp32") -> Group:
    """Describe the group of ``devices`` (names in ``cluster``); ClusterError for unknown names.

    ``peaks`` are its devices' distinct peaks in ``number_format`` (``ir.GPU.flops_for``).
    Memoised per (cluster, devices, format): judging plans asks for the same groups again and again.
    """
    return _group_of(cluster, tuple(devices), number_format)


@functools.lru_cache(maxsize=64)
def _peaks(cluster: ir.Cluster, number_format: str) -> tuple[list[float], list[int]]:
    """Per device in cluster order: its peak in ``number_format`` and its memory (for :func:`_run_group`)."""
    gpus = cluster.gpus
    return [g.flops_for(number_format) for g in gpus], [g.memory_bytes for g in gpus]


def _run_group(cluster: ir.Cluster, start: int, n: int, number_format: str) -> Group:
    """:func:`group_of` of the ``n`` consecutive devices from position ``start`` in cluster order, from
    slices (the search asks for every run of every width: 1024 GPUs, 136 widths)."""
    idx = index(cluster)
    flops, memory = _peaks(cluster, number_format)
    end, starts = start + n, idx.node_start
    first, last = idx.node_at[start], idx.node_at[end - 1]
    per_node = n if first == last else min([starts[first + 1] - start, end - starts[last]]
                                           + [starts[k + 1] - starts[k] for k in range(first + 1, last)])
    intra, inter = cluster.link("intra_node"), cluster.link("inter_node")
    return Group(n=n, peaks=tuple(sorted(set(flops[start:end]))), memory_bytes=min(memory[start:end]),
                 nodes=last - first + 1, per_node=per_node, link=inter if last > first else intra, intra=intra,
                 inter=inter)


@functools.lru_cache(maxsize=4096)
def _group_of(cluster: ir.Cluster, devices: tuple[str, ...], number_format: str) -> Group:
    idx = index(cluster)
    start = idx.position.get(devices[0]) if devices else None
    if start is not None and idx.names[start:start + len(devices)] == devices:
        return _run_group(cluster, start, len(devices), number_format)
    unknown = [d for d in devices if d not in idx.gpu_of]
    if unknown or not devices:
        raise ClusterError(f"devices {shown_devices(unknown or list(devices))} are not GPUs of cluster "
                           f"{cluster.name!r}",
                           "use device names from the cluster file")
    counts: dict[int, int] = {}
    for d in devices:
        counts[idx.node_of[d]] = counts.get(idx.node_of[d], 0) + 1
    gpus = [idx.gpu_of[d] for d in devices]
    intra, inter = cluster.link("intra_node"), cluster.link("inter_node")
    return Group(n=len(devices), peaks=tuple(sorted({g.flops_for(number_format) for g in gpus})),
                 memory_bytes=min(g.memory_bytes for g in gpus), nodes=len(counts), per_node=min(counts.values()),
                 link=inter if len(counts) > 1 else intra, intra=intra, inter=inter)


def link_between(cluster: ir.Cluster, a: Sequence[str], b: Sequence[str]) -> tuple[ir.Link, str]:
    """The link a stage on ``a`` uses to send to the next stage on ``b``, and its id.

    Point-to-point transfers go from the last device of ``a`` to ``b``: over
    ``intra_node`` when ``b`` lies entirely in that device's server, else ``inter_node``.
    The id names the physical link so that transfers on it share its bandwidth:
    ``intra_node:<server>`` or ``inter_node:<server>-><server>``.
    """
    idx = index(cluster)
    src = idx.node_of[a[-1]]
    dst_nodes = {idx.node_of[d] for d in b}
    if dst_nodes == {src}:
        return cluster.link("intra_node"), f"intra_node:{cluster.nodes[src].name}"
    dst = min(dst_nodes)
    return cluster.link("inter_node"), f"inter_node:{cluster.nodes[src].name}->{cluster.nodes[dst].name}"


def server_share(cluster: ir.Cluster, devices: Sequence[str]) -> int:
    """The greatest common divisor of the counts of ``devices`` in each server: consecutive tensor groups of
    ``tp`` of them, the devices listed server by server, stay inside one server exactly when ``tp`` divides it
    (3 + 3 GPUs over two servers split into pairs puts the middle pair on both)."""
    node_of = index(cluster).node_of
    counts: dict[int, int] = {}
    for d in devices:
        counts[node_of[d]] = counts.get(node_of[d], 0) + 1
    return math.gcd(*counts.values())


def spanning_tensor_group(cluster: ir.Cluster, stage: ir.Stage) -> tuple[tuple[str, ...], list[str]] | None:
    """The stage's first tensor group (``tp`` consecutive devices) whose devices lie in two or more servers, with
    those servers' names; None when every group stays inside one (devices listed in any order)."""
    node_of = index(cluster).node_of
    for group in stage.tensor_groups() if stage.tp > 1 else ():
        servers = sorted({cluster.nodes[node_of[d]].name for d in group if d in node_of})
        if len(servers) > 1:
            return group, servers
    return None


def processes_per_server(plan: ir.Plan) -> dict[str, int]:
    """The servers the plan uses, in the cluster's order, and how many of its processes (devices) each runs."""
    used = {d for st in plan.stages for d in st.devices}
    counts = {node.name: sum(g.name in used for g in node.gpus) for node in plan.cluster.nodes}
    return {name: n for name, n in counts.items() if n}


def uneven_servers(plan: ir.Plan) -> str | None:
    """``"s0: 4, s1: 2"`` when the plan's servers run different numbers of its processes (a launcher such as
    torchrun or DeepSpeed's starts as many on every server), else None."""
    per_server = processes_per_server(plan)
    if len(set(per_server.values())) <= 1:
        return None
    return ", ".join(f"{name}: {n}" for name, n in per_server.items())

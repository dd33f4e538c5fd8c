"""cluster.json as values: servers of GPUs and the links between them (GPU, Node, Link, Cluster)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from planner.errors import FormatError
from planner.ir._fields import _get, _int, _list, _need, _num, _opt_int, _opt_num, _str
from planner.ir.overheads import EngineOverhead, engine_overheads
from planner.jsonio import SUPPORTED_VERSION, check_kind


@dataclass(frozen=True)
class GPU:
    """One device: its name (unique in the cluster), peak FLOP/s and memory.

    ``flops`` is the peak the device reaches in fp32 (the default for plans of fp32
    profiles). ``peak_flops`` optionally gives the dense peak per number format (``fp32``,
    ``tf32``, ``bf16``, ``fp16``: tensor cores where the GPU has them); :meth:`flops_for`
    picks the one a precision computes in. ``memory_bandwidth_Bps``: the device memory
    bandwidth (optional); the cost model's memory-bound terms are 0 when it is None.
    """

    name: str
    flops: float
    memory_bytes: int
    memory_bandwidth_Bps: float | None = None
    peak_flops: tuple[tuple[str, float], ...] = ()

    def flops_for(self, number_format: str) -> float:
        """Peak FLOP/s in ``number_format`` (fp32, tf32, bf16, fp16); ``flops`` when not given."""
        for name, value in self.peak_flops:
            if name == number_format:
                return value
        return self.flops

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "flops": self.flops, "memory_bytes": self.memory_bytes}
        if self.memory_bandwidth_Bps is not None:
            d["memory_bandwidth_Bps"] = self.memory_bandwidth_Bps
        if self.peak_flops:
            d["peak_flops"] = dict(self.peak_flops)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> GPU:
        bw = _opt_num(d, "memory_bandwidth_Bps", where)
        if bw is not None and bw <= 0:
            raise FormatError(f"{where}.memory_bandwidth_Bps must be positive, got {bw!r}",
                              "e.g. 9e11, or leave it out")
        return cls(_str(d, "name", where), _num(d, "flops", where, positive=True),
                   _int(d, "memory_bytes", where, positive=True), bw, _peaks(d, where))


MAX_HEADROOM = 0.9
"""The largest share of every GPU's memory a search may keep free (``--memory-headroom``, ``memory_headroom``)."""

NUMBER_FORMATS = ("fp32", "tf32", "bf16", "fp16")


def _peaks(d: Mapping[str, Any], where: str) -> tuple[tuple[str, float], ...]:
    doc = _get(d, "peak_flops", where)
    if doc is None:
        return ()
    if not isinstance(doc, Mapping):
        raise FormatError(f"{where}.peak_flops must be an object of number format -> FLOP/s, got {doc!r:.60}",
                          f"e.g. {{\"bf16\": 312e12}} with formats {', '.join(NUMBER_FORMATS)}")
    bad = [k for k in doc if k not in NUMBER_FORMATS]
    if bad:
        raise FormatError(f"{where}.peak_flops has unknown number format {bad[0]!r}",
                          f"use {', '.join(NUMBER_FORMATS)}")
    return tuple((k, _num(doc, k, f"{where}.peak_flops", positive=True)) for k in NUMBER_FORMATS if k in doc)


MIN_SHARE = 1e-3
"""The least ``concurrent_devices`` and ``sharing_efficiency`` of a node: below them a device's core share
(concurrent / devices x efficiency) underflows to 0 (5e-324 of either was a division by zero in the simulator
and the cost model); ``planner calibrate`` writes at least 1 and about 0.8."""


MAX_THREADS = 4096
"""The most :attr:`Node.threads` a cluster file may give: more than any server's hardware threads (torch crashes
starting a million)."""


@dataclass(frozen=True)
class Node:
    """One server: GPUs joined by the ``intra_node`` link.

    ``concurrent_devices`` (optional): how many of its devices compute at full speed at once,
    when they share processors (CPU processes: cores / threads per process, set by ``planner
    calibrate``); their ``flops`` are then their speed when all compute at once, and the
    simulator speeds up those computing while others wait (:mod:`planner.simulate.cores`).
    ``sharing_efficiency`` (optional, in [:data:`MIN_SHARE`, 1], 1 when absent): the share of its fair share
    of the cores a device keeps while two or more of the node's devices compute at once (CPU
    processes share the last-level cache and the memory bus, and time-sliced ones lose
    switches; measured by ``planner calibrate``, :mod:`planner.calibrate_sharing`).
    ``handoff_s`` (optional, >= 0, 0 when absent): the CPU seconds each micro-batch handed
    from one of its devices to another costs, while all of them compute, beyond what it costs
    on idle cores (a process that blocks for its input and is woken on busy, time-sliced
    cores; measured by ``planner calibrate`` as well); :attr:`handoff_work_s` is what the cost
    model charges for it (:func:`planner.costmodel.engine.engine_overhead`).
    ``threads`` (optional, a positive integer): the torch threads each of its devices (CPU processes) was
    measured with (``planner calibrate --threads``), so that ``planner run`` and an exported launch script
    start each process with them and it computes as its ``flops`` say (a 1-thread device run on 2 threads
    was 1.4x faster than its prediction).
    """

    name: str
    gpus: tuple[GPU, ...]
    concurrent_devices: float | None = None
    sharing_efficiency: float | None = None
    handoff_s: float | None = None
    threads: int | None = None

    def fair_share(self, computing: float) -> float:
        """The share of a core each of ``computing`` devices of this node gets while they compute:
        ``min(1, concurrent_devices / computing)``; 1 on a node that shares nothing."""
        if self.concurrent_devices is None or computing <= 0:
            return 1.0
        return min(1.0, self.concurrent_devices / computing)

    def speed(self, computing: float) -> float:
        """Each device's speed, as a share of its speed alone, while ``computing`` devices of
        this node compute: its :meth:`fair_share`, times ``sharing_efficiency`` while two or
        more compute; 1 on a node that shares nothing."""
        if self.concurrent_devices is None:
            return 1.0
        efficiency = (self.sharing_efficiency or 1.0) if computing >= 2 else 1.0
        return self.fair_share(computing) * efficiency

    @property
    def shares_cores(self) -> bool:
        """Whether its devices are processes sharing its processors (``concurrent_devices`` set: CPU
        processes, as ``planner calibrate`` finds them), not devices with processors of their own (GPUs)."""
        return self.concurrent_devices is not None

    @property
    def core_share(self) -> float:
        """Each device's speed when all compute at once, as a share of its speed alone (1 when
        they share nothing): :meth:`speed` of all its devices."""
        return self.speed(len(self.gpus))

    @property
    def handoff_work_s(self) -> float:
        """:attr:`handoff_s` in the cost model's seconds, whose unit is a device's time while all
        compute: CPU seconds over the :meth:`fair_share` of a core each then has (the sharing
        efficiency does not enter, since these are CPU seconds)."""
        return (self.handoff_s or 0.0) / self.fair_share(len(self.gpus))

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "gpus": [g.to_dict() for g in self.gpus]}
        if self.concurrent_devices is not None:
            d["concurrent_devices"] = self.concurrent_devices
        if self.sharing_efficiency is not None:
            d["sharing_efficiency"] = self.sharing_efficiency
        if self.handoff_s is not None:
            d["handoff_s"] = self.handoff_s
        if self.threads is not None:
            d["threads"] = self.threads
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> Node:
        gpus = _list(d, "gpus", where)
        concurrent = _opt_num(d, "concurrent_devices", where)
        if concurrent is not None and concurrent < MIN_SHARE:
            raise FormatError(f"{where}.concurrent_devices must be at least {MIN_SHARE:g}, got {concurrent!r}",
                              "e.g. 2 (cores / threads per process), or leave it out")
        efficiency = _opt_num(d, "sharing_efficiency", where)
        if efficiency is not None and not MIN_SHARE <= efficiency <= 1:
            raise FormatError(f"{where}.sharing_efficiency must be in [{MIN_SHARE:g}, 1], got {efficiency!r}",
                              "e.g. 0.92 (what planner calibrate measured), or leave it out (1)")
        threads = _opt_int(d, "threads", where)
        if threads is not None and threads > MAX_THREADS:
            raise FormatError(f"{where}.threads must be at most {MAX_THREADS}, got {threads}",
                              "the torch threads per process planner calibrate measured with, e.g. 1")
        return cls(_str(d, "name", where), tuple(GPU.from_dict(g, f"{where}.gpus[{i}]") for i, g in enumerate(gpus)),
                   concurrent, efficiency, _opt_num(d, "handoff_s", where), threads)  # _num refuses a negative one


@dataclass(frozen=True)
class Link:
    """An alpha-beta link: ``latency_s`` per message plus bytes / ``bandwidth_Bps``.

    The bus bandwidth collectives reach over it, where it differs from a point-to-point transfer's
    (nccl-tests' ``busbw``: over n ranks an all-reduce of S bytes takes ``2(n-1)/n * S / busbw``, an
    all-gather or reduce-scatter ``(n-1)/n * S / busbw``): ``allreduce_bandwidth_Bps`` for
    all-reduces, ``allgather_bandwidth_Bps`` for all-gathers and reduce-scatters; None:
    ``bandwidth_Bps``. ``planner calibrate`` measures both (gloo's collectives on CPU reach a half to
    a fifth of its point-to-point bandwidth; NCCL's on NVLink most of it).

    ``collective_latency_s``: what one collective call costs beyond its ring's per-step latencies and its bytes,
    whatever its size (the library's own set-up of the call): the intercept of a collective's time over its
    size, which ``planner calibrate`` fits from all-reduces of several sizes (gloo on this project's 2-core VM:
    0.4-2.9 ms, where a 4-byte message takes 0.07 ms); 0 in the GPU presets (NCCL's few microseconds).
    """

    bandwidth_Bps: float
    latency_s: float
    allreduce_bandwidth_Bps: float | None = None
    allgather_bandwidth_Bps: float | None = None
    collective_latency_s: float = 0.0

    BUS_FIELDS = ("allreduce_bandwidth_Bps", "allgather_bandwidth_Bps")

    @property
    def allreduce_Bps(self) -> float:
        """The bandwidth the ring all-reduce's formula divides by."""
        return self.bandwidth_Bps if self.allreduce_bandwidth_Bps is None else self.allreduce_bandwidth_Bps

    @property
    def allgather_Bps(self) -> float:
        """The bandwidth the ring all-gather's and reduce-scatter's formula divides by."""
        return self.bandwidth_Bps if self.allgather_bandwidth_Bps is None else self.allgather_bandwidth_Bps

    def transfer_s(self, nbytes: float) -> float:
        """Time to move ``nbytes`` over this link (alpha + n/beta); 0 bytes cost nothing."""
        return 0.0 if nbytes <= 0 else self.latency_s + nbytes / self.bandwidth_Bps

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"bandwidth_Bps": self.bandwidth_Bps, "latency_s": self.latency_s}
        d.update({f: getattr(self, f) for f in self.BUS_FIELDS if getattr(self, f) is not None})
        if self.collective_latency_s:
            d["collective_latency_s"] = self.collective_latency_s
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> Link:
        allreduce, allgather = (_opt_num(d, f, where, positive=True) for f in cls.BUS_FIELDS)
        fixed = _opt_num(d, "collective_latency_s", where) or 0.0  # _num refuses a negative one
        return cls(_num(d, "bandwidth_Bps", where, positive=True), _num(d, "latency_s", where), allreduce, allgather,
                   fixed)


LINK_LEVELS = ("intra_node", "inter_node")
"""Link levels from the innermost out; a cluster file must define both."""


@dataclass(frozen=True)
class Cluster:
    """Servers of GPUs and the links at each level of the hierarchy (inner level first)."""

    name: str
    nodes: tuple[Node, ...]
    links: tuple[tuple[str, Link], ...]
    engine_overheads: tuple[tuple[str, EngineOverhead], ...] = ()
    memory_kept_free: float = 0.0
    """The share of every GPU's memory this cluster holds back (:meth:`keeping_free`; its GPUs' ``memory_bytes`` are
    what is left): a plan's cluster searched with ``--memory-headroom`` records it, so that what reads the plan
    judges its peak against the GPUs' whole memory (planner.explain's tight-memory warning)."""

    def __hash__(self) -> int:
        return self._hash

    @functools.cached_property
    def _hash(self) -> int:
        # a cheap hash, computed once (a 1024-GPU cluster is hashed for every cached look-up); equal clusters share it
        return hash((self.name, len(self.nodes), sum(len(n.gpus) for n in self.nodes)))

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Cluster):
            return NotImplemented
        return self._digest == other._digest

    @functools.cached_property
    def _digest(self) -> bytes:
        # every field, digested once: cached look-ups compare equal clusters that are different objects (a search
        # after another on an equal cluster), and comparing 1024 GPUs field by field each time took minutes
        return hashlib.sha256(repr(dataclasses.astuple(self)).encode()).digest()

    def link(self, level: str) -> Link:
        for name, link in self.links:
            if name == level:
                return link
        raise KeyError(level)

    def engine_overhead(self, engine: str) -> EngineOverhead | None:
        """What ``engine`` adds on this cluster (measured by ``planner calibrate``), or None if not known."""
        return next((o for name, o in self.engine_overheads if name == engine), None)

    @functools.cached_property
    def gpus(self) -> tuple[GPU, ...]:
        """Every GPU in cluster order (computed once: a frozen value)."""
        return tuple(g for node in self.nodes for g in node.gpus)

    def threads_for(self, devices: Iterable[str]) -> int | None:
        """The threads per process (:attr:`Node.threads`) of the nodes holding ``devices``, where they all give the
        same number; None where one gives none or they differ."""
        wanted = set(devices)
        found = {n.threads for n in self.nodes if any(g.name in wanted for g in n.gpus)}
        return found.pop() if len(found) == 1 else None

    def keeping_free(self, share: float) -> Cluster:
        """This cluster with ``share`` of every GPU's memory kept free (0 <= share < 1): what a plan may use where the
        runtime's own memory (a CUDA context, communication buffers) and the allocator's fragmentation, which the
        cost model does not count, need room (``planner search --memory-headroom``)."""
        if not 0.0 <= share < 1.0:
            raise FormatError(f"a share of memory kept free must be in [0, 1), got {share!r}", "e.g. 0.1 for 10%")
        if share == 0.0:
            return self
        nodes = tuple(dataclasses.replace(n, gpus=tuple(dataclasses.replace(
            g, memory_bytes=max(1, int(g.memory_bytes * (1.0 - share)))) for g in n.gpus)) for n in self.nodes)
        kept = self.memory_kept_free + share - self.memory_kept_free * share  # an already reduced cluster keeps both
        return dataclasses.replace(self, nodes=nodes, memory_kept_free=kept)

    def to_dict(self) -> dict[str, Any]:
        d = {"kind": "cluster", "version": SUPPORTED_VERSION, "name": self.name,
             "nodes": [n.to_dict() for n in self.nodes],
             "links": {name: link.to_dict() for name, link in self.links}}
        if self.engine_overheads:
            d["engine_overheads"] = {name: o.to_dict() for name, o in self.engine_overheads}
        if self.memory_kept_free:
            d["memory_kept_free"] = self.memory_kept_free
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "cluster") -> Cluster:
        doc = check_kind(d, "cluster", source)
        nodes = tuple(Node.from_dict(n, f"{source}: nodes[{i}]") for i, n in enumerate(_list(doc, "nodes", source)))
        links_doc = _need(doc, "links", source)
        if not isinstance(links_doc, Mapping):
            raise FormatError(f"{source}.links must be an object, got {links_doc!r:.60}", "see DESIGN.md section 4")
        for level in LINK_LEVELS:
            _need(links_doc, level, f"{source}.links")
        links = tuple((str(k), Link.from_dict(v, f"{source}.links.{k}")) for k, v in links_doc.items())
        names = [g.name for n in nodes for g in n.gpus]
        dupes = sorted(name for name, n in Counter(names).items() if n > 1)
        if dupes:
            raise FormatError(f"{source}: GPU names must be unique in the cluster, repeated: {dupes[:5]}",
                              "name GPUs like 'n0.g0'")
        servers = sorted(name for name, n in Counter(n.name for n in nodes).items() if n > 1)
        if servers:  # export and run map ranks to servers by name: two nodes of one name would merge into one
            raise FormatError(f"{source}: node names must be unique in the cluster, repeated: {servers[:5]}",
                              "give every node (server) its own name, e.g. 'n0', 'n1'")
        kept = _opt_num(doc, "memory_kept_free", source)
        if kept is not None and not 0.0 <= kept < 1.0:
            raise FormatError(f"{source}: memory_kept_free is {kept!r}, must be in [0, 1)",
                              "the share of every GPU's memory held back, e.g. 0.1; or leave it out")
        return cls(_str(doc, "name", source), nodes, links, engine_overheads(doc, source), kept or 0.0)

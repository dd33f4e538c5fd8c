"""The simulator's values: its options and its result (pure: no torch, click or rich).

Owns :class:`SimOptions`, :class:`DeviceResult` and :class:`SimResult` with the
``simulation`` JSON (``to_dict``) and the Chrome trace (``to_chrome_trace``,
:mod:`planner.simulate.trace`). The definitions of the times are in :mod:`planner.simulate`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from planner import ir
from planner.errors import FormatError, UsageError, is_whole
from planner.grad_buffers import GRAD_BUCKET_BYTES
from planner.schedule import find_kind
from planner.simulate.events import Event
from planner.simulate.trace import chrome_trace

MIN_BUCKET_BYTES = 1024
"""The smallest all-reduce bucket the simulator plays (1 KiB; ``planner simulate --bucket-mb`` takes 0.001 MiB up)."""
MAX_PIPEDREAM_BLOCKS = 64
"""The most measured steady-state iterations a schedule without flush plays (each adds M x K actions)."""
PIPEDREAM_MEASURED = 4
"""The steady-state iterations a schedule without flush measures at first: its period seen twice over when it
repeats every iteration or every other one (:func:`planner.simulate.measure.steady_period`); two could show a
period of three as one (2, 4, 4, 2, ...: its 4, 4)."""


@dataclass(frozen=True)
class SimOptions:
    """Knobs of the simulation (defaults match the analytic cost model)."""

    overlap_allreduce: bool = False
    bucket_bytes: float = GRAD_BUCKET_BYTES  # the torch export's, as DDP's
    duplex: bool = True
    share_links: bool = True
    pipedream_blocks: int | None = None  # measured steady-state iterations at first (default PIPEDREAM_MEASURED)
    record_events: bool = True
    # False: play every transfer through the link-sharing code and pipedream's trailing
    # iterations to the end (the reference definition; the shortcuts give the same times).
    shortcuts: bool = True
    # Nodes whose devices share processors (``concurrent_devices`` set): their lanes' compute is
    # processor-shared (planner.simulate.cores); nodes that share nothing among them bound the speed of
    # a lane that lies on both. simulate() takes them from the plan's cluster.
    core_nodes: tuple[ir.Node, ...] = ()

    def __post_init__(self) -> None:
        """UsageError naming the field unless every option has its type and range (a library caller's
        ``bucket_bytes=1e-9`` would play 10^17 buckets, ``pipedream_blocks=10**6`` a million iterations)."""
        flags = ("overlap_allreduce", "duplex", "share_links", "record_events", "shortcuts")
        for name in flags:
            if not isinstance(getattr(self, name), bool):
                raise UsageError(f"SimOptions.{name} must be True or False, got {getattr(self, name)!r:.40}",
                                 f"pass {name}=True or False")
        b = self.bucket_bytes
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not MIN_BUCKET_BYTES <= b < math.inf:
            raise UsageError(f"SimOptions.bucket_bytes must be a finite number of at least {MIN_BUCKET_BYTES}, "
                             f"got {b!r:.40}", f"e.g. {GRAD_BUCKET_BYTES} (25 MiB, DDP's)")
        n = self.pipedream_blocks
        if n is not None and not is_whole(n, 1, MAX_PIPEDREAM_BLOCKS):
            raise UsageError(f"SimOptions.pipedream_blocks must be None or a whole number in 1..{MAX_PIPEDREAM_BLOCKS}"
                             f", got {n!r:.40}", f"leave it None ({PIPEDREAM_MEASURED} measured iterations)")
        if not isinstance(self.core_nodes, tuple) or not all(isinstance(x, ir.Node) for x in self.core_nodes):
            raise UsageError(f"SimOptions.core_nodes must be a tuple of planner.ir.Node, got {self.core_nodes!r:.60}",
                             "leave it empty: simulate() takes them from the plan's cluster")
        for i, node in enumerate(self.core_nodes):  # a cluster file's rules (a core share of 0 divides by zero)
            try:
                ir.Node.from_dict(node.to_dict(), f"SimOptions.core_nodes[{i}]")
            except FormatError as exc:
                raise UsageError(exc.cause, exc.hint) from None


@dataclass(frozen=True)
class DeviceResult:
    """One device: what it did in one iteration and its memory over the run."""

    device: str
    lane: int
    busy_s: float
    compute_s: float
    peak_memory_bytes: int
    peak_in_flight: int
    capacity_bytes: int
    memory: tuple[tuple[float, int], ...] = field(repr=False, compare=False)
    allreduce_s: float = 0.0
    """The all-reduce seconds in ``busy_s``: the whole blocking all-reduce, or, overlapped, what compute
    does not hide (:func:`planner.simulate.measure.lane_allreduce`)."""

    @property
    def fits(self) -> bool:
        return self.capacity_bytes <= 0 or self.peak_memory_bytes <= self.capacity_bytes

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "busy_s": self.busy_s, "peak_memory_bytes": self.peak_memory_bytes,
                "lane": self.lane, "compute_s": self.compute_s, "peak_in_flight": self.peak_in_flight,
                "capacity_bytes": self.capacity_bytes, "fits": self.fits}


@dataclass(frozen=True)
class SimResult:
    """The outcome of one simulation (see :mod:`planner.simulate` for the definitions)."""

    schedule: str
    stages: int
    microbatches: int
    virtual_stages: int
    iteration_s: float
    bubble_fraction: float
    makespan_s: float
    window: tuple[float, float]
    devices: tuple[DeviceResult, ...]
    lanes: tuple[tuple[str, ...], ...]
    links: tuple[str, ...]
    events: tuple[Event, ...] = field(repr=False, compare=False)
    actions: tuple[tuple[str, ...], ...] = field(repr=False, compare=False, default=())

    @property
    def peak_memory_bytes(self) -> int:
        return max((d.peak_memory_bytes for d in self.devices), default=0)

    @property
    def steady_state(self) -> bool:
        """Whether ``iteration_s`` is a steady state measured over ``window`` (a schedule
        that does not flush); else the window is the whole run."""
        kind = find_kind(self.schedule)
        return kind is not None and not kind.flushes

    def device(self, name: str) -> DeviceResult:
        for d in self.devices:
            if d.device == name:
                return d
        raise KeyError(name)

    def lane_result(self, lane: int) -> DeviceResult:
        return next(d for d in self.devices if d.lane == lane)

    def to_dict(self) -> dict[str, Any]:
        """The simulate JSON contract (``iteration_s``, ``bubble_fraction``, ``devices``) and more."""
        return {
            "kind": "simulation", "version": 1,
            "iteration_s": self.iteration_s, "bubble_fraction": self.bubble_fraction,
            "devices": [d.to_dict() for d in self.devices],
            "schedule": self.schedule, "stages": self.stages, "microbatches": self.microbatches,
            "virtual_stages": self.virtual_stages, "makespan_s": self.makespan_s,
            "window_s": list(self.window), "peak_memory_bytes": self.peak_memory_bytes,
            "links": list(self.links),
        }

    def to_chrome_trace(self) -> dict[str, Any]:
        """Chrome trace event JSON (opens in Perfetto): one track per device and per link.

        Complete events (``"ph": "X"``, microseconds); process 1 holds the devices (and
        their overlapped all-reduce streams), process 2 the links (see :mod:`planner.simulate.trace`).
        """
        return chrome_trace(self)

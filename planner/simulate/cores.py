"""Devices that share processors: CPU processes on a machine with fewer cores than they have threads (pure).

Owns :class:`CorePool` (which lanes compute on one node's cores now, and the rate that gives
each) and :class:`CoreShare` (every lane's pools and its action in progress, from the cluster).

A node whose ``concurrent_devices`` is set (:class:`planner.ir.Node`; ``planner calibrate`` sets
it to cores / threads per process) runs at most that many of its devices at full speed at once.
Its devices' ``flops`` are their speed when all of them compute at once (the core share
``min(1, concurrent / devices)`` of one device alone; ``planner calibrate``), so the cost
model's stage times are those of a pipeline whose every stage computes all the time. In a
real pipeline a stage waiting for its input does not compute (a process blocked in a receive
takes no core), so the others run faster: with ``d`` of the node's devices computing, each
runs at ``min(1, concurrent / d)`` of a device alone (times the node's measured
``sharing_efficiency`` while ``d >= 2``: :meth:`planner.ir.Node.speed`), which is that speed
over the node's ``core_share`` times its nominal (cost model) speed. The simulator plays a
lane's F, B and W actions at that rate, changing as lanes start and finish (processor
sharing, as :class:`planner.simulate.links.LinkPool` shares a link's bandwidth; the Linux
scheduler's fair share of the cores among runnable processes, Love, *Linux Kernel
Development*, ch. 4). The blocking all-reduce and optimizer step keep their nominal times.
Measured on a 2-core machine: 4 one-thread processes, 1F1B, M=4, ran a CNN at 0.70 of the
flat share's prediction.

A lane whose devices lie on several nodes computes in lockstep (its devices do the same work
and meet in its collectives), so at each moment at the speed of its slowest device: the least,
over its nodes, of that node's rate times the headroom of the lane's slowest device there over
the lane's slowest device overall (their ``flops``: 1 where they are equal; a node that shares
nothing runs at its nominal speed, rate 1). It counts in every sharing node's pool it lies on,
with its devices there (the conservative reading: a device held back by another node still takes
its share of its own cores), and each pool re-times the ends of all lanes computing on it when its
rate changes. On one node this is the one pool's rate, unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from planner import ir


class CorePool:
    """One node's cores: the lanes computing on them now (each with its devices there) and the rate that gives."""

    __slots__ = ("computing", "node", "nominal", "widths")

    def __init__(self, node: ir.Node, widths: dict[int, int]) -> None:
        self.node = node
        self.nominal = node.core_share
        self.widths = widths  # lane -> its devices on this node
        self.computing: dict[int, int] = {}  # lane -> its devices here, in the order they started

    def rate(self) -> float:
        """Nominal seconds of work done per second by each of its devices computing now."""
        computing = sum(self.computing.values())
        return self.node.speed(computing) / self.nominal if computing else 1.0

    def alone(self, lane: int) -> float:
        """The rate of the lane's devices here while no other lane computes on this node."""
        return self.node.speed(self.widths[lane]) / self.nominal


class CoreShare:
    """Which lanes compute on nodes that share their cores, and each such lane's action in progress:
    its nominal seconds left, its rate, and the version of its pending end event (a rate change makes
    the earlier one stale)."""

    __slots__ = ("cap", "last", "left", "played", "pools_of", "rates", "start", "version", "work")

    def __init__(self, lanes_devices: Sequence[Sequence[str]], nodes: Sequence[ir.Node]) -> None:
        self.pools_of: dict[int, list[tuple[CorePool, float]]] = {}  # lane -> (pool, headroom) of each sharing node
        self.cap: dict[int, float] = {}  # lane -> its rate bound by the nodes on it that share nothing (inf if none)
        where = {g.name: (i, g.flops) for i, n in enumerate(nodes) for g in n.gpus}
        pools: dict[int, CorePool] = {}
        for lane, devs in enumerate(lanes_devices):
            width: dict[int, int] = {}  # node index -> the lane's devices there
            slowest: dict[int, float] = {}  # node index -> the least flops of the lane's devices there
            for d in devs:
                if d in where:
                    i, flops = where[d]
                    width[i] = width.get(i, 0) + 1
                    slowest[i] = min(slowest.get(i, flops), flops)
            shared = [i for i in width if nodes[i].shares_cores]
            if not shared:
                continue
            floor = min(slowest.values())
            for i in shared:
                pools.setdefault(i, CorePool(nodes[i], {})).widths[lane] = width[i]
            self.pools_of[lane] = [(pools[i], slowest[i] / floor) for i in shared]
            self.cap[lane] = min((slowest[i] / floor for i in width if not nodes[i].shares_cores), default=math.inf)
        self.left: dict[int, float] = {}
        self.start: dict[int, float] = {}
        self.work: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.rates: dict[int, float] = {}
        self.played = {lane: [0.0, 0.0] for lane in self.pools_of}  # lane -> [nominal seconds done, seconds taken]
        self.version: dict[int, int] = dict.fromkeys(self.pools_of, 0)

    def __bool__(self) -> bool:
        return bool(self.pools_of)

    def _rate(self, lane: int) -> float:
        """The lane's rate now: its slowest node's (in lockstep)."""
        rate = self.cap[lane]
        for pool, headroom in self.pools_of[lane]:
            rate = min(rate, headroom * pool.rate())
        return rate

    def _neighbours(self, lane: int) -> list[int]:
        """The lanes computing on any of the lane's nodes, in the order they started there."""
        return list(dict.fromkeys(other for pool, _ in self.pools_of[lane] for other in pool.computing))

    def _progress(self, lanes: Sequence[int], now: float) -> None:
        for lane in lanes:
            self.left[lane] -= (now - self.last[lane]) * self.rates[lane]
            self.last[lane] = now

    def _ends(self, lanes: Sequence[int], now: float) -> list[tuple[float, int, int]]:
        """(end time, lane, version) of each of ``lanes`` at its current rate (new versions)."""
        out = []
        for lane in lanes:
            rate = self.rates[lane] = self._rate(lane)
            self.version[lane] += 1
            out.append((now + max(self.left[lane], 0.0) / rate, lane, self.version[lane]))
        return out

    def begin(self, lane: int, work_s: float, now: float) -> list[tuple[float, int, int]]:
        """Lane starts ``work_s`` nominal seconds of compute at ``now``: the new end events (its own
        and those of every lane computing on its nodes)."""
        others = self._neighbours(lane)
        self._progress(others, now)
        for pool, _ in self.pools_of[lane]:
            pool.computing[lane] = pool.widths[lane]
        self.left[lane], self.start[lane], self.work[lane], self.last[lane] = work_s, now, work_s, now
        return self._ends([*others, lane], now)

    def finish(self, lane: int, version: int, now: float) -> tuple[float | None, list[tuple[float, int, int]]]:
        """An end event of ``lane``: (its action's start, the new end events of the lanes computing on
        its nodes) when ``version`` is current, else (None, [])."""
        if lane not in self.left or self.version[lane] != version:
            return None, []
        others = [other for other in self._neighbours(lane) if other != lane]
        self._progress(others, now)
        for pool, _ in self.pools_of[lane]:
            del pool.computing[lane]
        del self.left[lane], self.last[lane], self.rates[lane]
        start = self.start.pop(lane)
        played = self.played[lane]
        played[0] += self.work.pop(lane)
        played[1] += now - start
        return start, self._ends(others, now)

    def mean_rate(self, lane: int) -> float:
        """Nominal seconds of compute the lane did per second it took, over its finished actions (1 before any)."""
        if lane not in self.played:
            return 1.0
        nominal_s, taken_s = self.played[lane]
        return nominal_s / taken_s if taken_s > 0 and nominal_s > 0 else 1.0

    def fastest_rate(self, lane: int) -> float:
        """The lane's rate when it computes alone on its nodes (1 for a lane that shares nothing)."""
        if lane not in self.pools_of:
            return 1.0
        return min([self.cap[lane], *(headroom * pool.alone(lane) for pool, headroom in self.pools_of[lane])])

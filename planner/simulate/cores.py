"""Devices that share processors: CPU processes on a machine with fewer cores than they have threads (pure).

Owns :class:`CoreShare` (which lanes share which node's cores, from the cluster) and
:class:`CorePool` (processor sharing of one node's cores among the lanes computing on it).

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
"""

from __future__ import annotations

from collections.abc import Sequence

from planner import ir


class CorePool:
    """One node's cores shared by its lanes' compute: every lane's nominal seconds left, and
    the version of its pending end event (a rate change makes the earlier one stale)."""

    __slots__ = ("last", "left", "node", "nominal", "played", "start", "version", "widths", "work")

    def __init__(self, node: ir.Node, widths: dict[int, int]) -> None:
        self.node = node
        self.nominal = node.core_share
        self.widths = widths  # lane -> its devices on this node
        self.left: dict[int, float] = {}
        self.start: dict[int, float] = {}
        self.work: dict[int, float] = {}
        self.played = {lane: [0.0, 0.0] for lane in widths}  # lane -> [nominal seconds done, seconds taken]
        self.version: dict[int, int] = dict.fromkeys(widths, 0)
        self.last = 0.0

    def rate(self) -> float:
        """Nominal seconds of work done per second by each computing lane, now."""
        computing = sum(self.widths[lane] for lane in self.left)
        return self.node.speed(computing) / self.nominal if computing else 1.0

    def _progress(self, now: float) -> None:
        if self.left and now > self.last:
            done = (now - self.last) * self.rate()
            for lane in self.left:
                self.left[lane] -= done
        self.last = now

    def _ends(self, now: float) -> list[tuple[float, int, int]]:
        """(end time, lane, version) of every computing lane at the current rate (new versions)."""
        rate = self.rate()
        out = []
        for lane, left in self.left.items():
            self.version[lane] += 1
            out.append((now + max(left, 0.0) / rate, lane, self.version[lane]))
        return out

    def begin(self, lane: int, work_s: float, now: float) -> list[tuple[float, int, int]]:
        """Lane starts ``work_s`` nominal seconds of compute at ``now``: the new end events."""
        self._progress(now)
        self.left[lane] = work_s
        self.start[lane] = now
        self.work[lane] = work_s
        return self._ends(now)

    def finish(self, lane: int, version: int, now: float) -> tuple[float | None, list[tuple[float, int, int]]]:
        """An end event of ``lane``: (its action's start, the others' new end events) when
        ``version`` is current, else (None, [])."""
        if lane not in self.left or self.version[lane] != version:
            return None, []
        self._progress(now)
        del self.left[lane]
        start = self.start.pop(lane)
        played = self.played[lane]
        played[0] += self.work.pop(lane)
        played[1] += now - start
        return start, self._ends(now)

    def mean_rate(self, lane: int) -> float:
        """Nominal seconds of compute the lane did per second it took, over its finished actions (1 before any)."""
        nominal_s, taken_s = self.played[lane]
        return nominal_s / taken_s if taken_s > 0 and nominal_s > 0 else 1.0


class CoreShare:
    """Which lanes compute on a node that shares its cores, and that node's pool."""

    __slots__ = ("pool_of",)

    def __init__(self, lanes_devices: Sequence[Sequence[str]], nodes: Sequence[ir.Node]) -> None:
        self.pool_of: dict[int, CorePool] = {}
        for node in nodes:
            if not node.shares_cores:
                continue
            names = {g.name for g in node.gpus}
            widths = {lane: n for lane, devs in enumerate(lanes_devices) if (n := sum(d in names for d in devs))}
            if widths:
                pool = CorePool(node, widths)
                self.pool_of.update(dict.fromkeys(widths, pool))

    def __bool__(self) -> bool:
        return bool(self.pool_of)

    def fastest_rate(self, lane: int) -> float:
        """The lane's rate when it computes alone on its node (1 for a lane that shares nothing)."""
        pool = self.pool_of.get(lane)
        if pool is None:
            return 1.0
        return pool.node.speed(pool.widths[lane]) / pool.nominal

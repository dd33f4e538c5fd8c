"""Memory per pipeline lane over a simulated run (pure: no torch, click or rich).

Owns the memory model of :mod:`planner.simulate`: a lane starts with the static bytes
(weights, gradients, optimizer state) of its chunks; a chunk's ``activation_bytes`` are
held from the start of a micro-batch's F until the end of its last backward pass (B, or W
when the schedule splits the weight gradient); ``workspace_bytes`` during B and W; when the
schedule stashes weights (pipedream) ``weight_bytes`` per extra version: a chunk with n
micro-batches in flight keeps n versions, one of which is the live weights (so n - 1 extra);
``grad_copy_bytes`` during a blocking all-reduce (:mod:`planner.simulate.engine` adds it).
"""

from __future__ import annotations

from collections.abc import Sequence

from planner import ir


class LaneMemory:
    """Bytes held per lane, their peak and timeline, and micro-batches in flight."""

    __slots__ = ("act", "chunk_flight", "in_flight", "mem", "peak", "peak_in_flight", "stash", "timeline", "wsp")

    def __init__(self, costs: Sequence[ir.StageCost], k: int, stashes_weights: bool) -> None:
        self.act = [c.activation_bytes for c in costs]
        self.wsp = [c.workspace_bytes for c in costs]
        self.stash = [c.weight_bytes if stashes_weights else 0 for c in costs]
        self.mem = [sum(costs[c].static_bytes for c in range(lane, len(costs), k)) for lane in range(k)]
        self.peak = list(self.mem)
        self.timeline: list[list[tuple[float, int]]] = [[(0.0, self.mem[lane])] for lane in range(k)]
        self.in_flight = [0] * k
        self.peak_in_flight = [0] * k
        self.chunk_flight = [0] * len(costs)

    def change(self, lane: int, now: float, delta: int) -> None:
        """The lane holds ``delta`` more bytes from ``now``."""
        mem = self.mem
        mem[lane] += delta
        if mem[lane] > self.peak[lane]:
            self.peak[lane] = mem[lane]
        tl = self.timeline[lane]
        if tl[-1][0] == now and len(tl) > 1:
            tl[-1] = (now, mem[lane])
        else:
            tl.append((now, mem[lane]))

    def forward_starts(self, lane: int, c: int, now: float) -> None:
        """A forward of chunk c starts: its micro-batch is in flight (activations, a stashed version)."""
        delta = self.act[c]
        self.chunk_flight[c] += 1
        if self.stash[c] and self.chunk_flight[c] > 1:
            delta += self.stash[c]
        self.in_flight[lane] += 1
        if self.in_flight[lane] > self.peak_in_flight[lane]:
            self.peak_in_flight[lane] = self.in_flight[lane]
        if delta:
            self.change(lane, now, delta)

    def backward_starts(self, lane: int, c: int, now: float) -> None:
        """A B or W of chunk c starts: its workspace."""
        if self.wsp[c]:
            self.change(lane, now, self.wsp[c])

    def backward_ends(self, lane: int, c: int, last: bool, now: float) -> None:
        """A B or W of chunk c ends: its workspace goes, and after the ``last`` pass of the
        micro-batch its activations (and a stashed weight version)."""
        delta = -self.wsp[c]
        if last:
            delta -= self.act[c]
            self.chunk_flight[c] -= 1
            self.in_flight[lane] -= 1
            if self.stash[c] and self.chunk_flight[c] >= 1:
                delta -= self.stash[c]
        if delta:
            self.change(lane, now, delta)

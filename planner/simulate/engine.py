"""The event-driven run of one schedule over per-chunk costs (pure: no torch, click or rich).

Owns :class:`Engine`: the lanes (pipeline ranks) run their actions in the schedule's order,
one at a time; an action starts when its lane is free and its input has arrived; its
output is sent over the :class:`planner.simulate.links.Network`; memory is tracked by
:class:`planner.simulate.memory.LaneMemory`. After a chunk's last backward pass of an
iteration its gradient all-reduce and optimizer step run (blocking the lane, or the
all-reduce in DDP buckets on the lane's communication stream). The model's definitions are
in :mod:`planner.simulate`; :mod:`planner.simulate.measure` reads the finished run.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from planner import ir
from planner.errors import PlanError, ScheduleError, shown_devices
from planner.schedule import Action, Schedule
from planner.simulate.cores import CoreShare
from planner.simulate.events import COMPUTE, LATENCY, LINK, SHARED, Event, EventQueue, new_event
from planner.simulate.links import Network
from planner.simulate.memory import LaneMemory
from planner.simulate.result import SimOptions

AllReduceAfter = list[dict[int, list[tuple[int, int]]]]
"""Per lane: action position -> the (chunk, block)s that all-reduce and step after it."""


def lane_devices(costs: Sequence[ir.StageCost], k: int) -> list[tuple[str, ...]]:
    """The devices of each lane; raises PlanError unless chunk c runs on the devices of chunk c mod K."""
    lanes_devices = []
    for lane in range(k):
        devs = tuple(costs[lane].devices)
        for c in range(lane + k, len(costs), k):
            if tuple(costs[c].devices) != devs:
                raise PlanError(f"stage {c} runs on {shown_devices(costs[c].devices)}, but chunk {c} belongs to "
                                f"device group {lane} {shown_devices(devs)}",
                                "chunk c runs on the devices of chunk c mod K")
        lanes_devices.append(devs)
    return lanes_devices


def allreduce_after(costs: Sequence[ir.StageCost], sched: Schedule, last_kind: str) -> AllReduceAfter:
    """Per lane: which (chunk, block)s all-reduce and step after which action (its position in
    the lane's order): the chunk's last ``last_kind`` action of the block."""
    m = sched.microbatches
    ar_after: AllReduceAfter = []
    for acts in sched.actions:
        last_pos: dict[tuple[int, int], int] = {}
        for at, a in enumerate(acts):
            if a.kind == last_kind:
                last_pos[(a.stage, a.mb // m)] = at
        table: dict[int, list[tuple[int, int]]] = {}
        for (c, blk), at in last_pos.items():
            if costs[c].allreduce_s > 0 or costs[c].optimizer_step_s > 0 or costs[c].grad_copy_bytes > 0:
                table.setdefault(at, []).append((c, blk))
        ar_after.append(table)
    return ar_after


def steady_stop(sched: Schedule, last_kind: str, settle: int) -> tuple[list[int], int]:
    """Where a run of a schedule without flush may stop: per lane, the position of its last
    ``last_kind`` action of the last measured iteration (block ``blocks - settle - 1``), and
    the number of lanes.

    Once every lane has finished that action (and queued its all-reduce), every measured
    iteration's end is known, and nothing that happens later can move it (an event only
    affects later ones), so the run stops there instead of playing the trailing warm-down
    iterations; ``iteration_s`` is unchanged. Empty for the flushing schedules."""
    if sched.flushes or settle < 1 or sched.blocks <= 2 * settle:
        return [], 0
    last_blk = sched.blocks - settle - 1
    m = sched.microbatches
    stop = []
    for acts in sched.actions:
        stop.append(max(at for at, a in enumerate(acts) if a.kind == last_kind and a.mb // m == last_blk))
    return stop, len(stop)


def pass_times(costs: Sequence[ir.StageCost], split_backward: bool) -> tuple[list[float], list[float], list[float]]:
    """Per chunk: the F, B and W times (B the input gradient alone when the weight gradient W is split)."""
    fwd = [c.forward_s for c in costs]
    if split_backward:
        return fwd, [c.backward_s - c.backward_weight_s for c in costs], [c.backward_weight_s for c in costs]
    return fwd, [c.backward_s for c in costs], [0.0] * len(costs)


class Engine:
    """One run: the lanes' state as attributes, the event handlers as methods."""

    __slots__ = ("act_in", "actions", "ar_after", "ar_wait", "block_end", "busy", "bwd", "comm_free", "cores", "costs",
                 "events", "fwd", "grad_in", "k", "lane_end", "lane_track", "lanes_devices", "lanes_left", "last_kind",
                 "m", "memory", "n", "n_chunks", "net", "now", "opts", "pos", "queue", "record", "sched", "settle",
                 "stop_pos", "texts", "v", "wgt")

    def __init__(self, costs: Sequence[ir.StageCost], sched: Schedule, v: int, opts: SimOptions,
                 settle: int) -> None:
        self.costs, self.sched, self.actions, self.v = costs, sched, sched.actions, v
        self.opts, self.settle = opts, settle
        self.n_chunks = len(costs)
        self.k = k = self.n_chunks // v
        self.m, self.n = sched.microbatches, sched.total_microbatches
        self.lanes_devices = lane_devices(costs, k)
        self.fwd, self.bwd, self.wgt = pass_times(costs, sched.split_backward)
        self.last_kind = "W" if sched.split_backward else "B"
        self.record = opts.record_events
        self.texts = sched.text()  # action names, once (events and the result share them)
        self.lane_track = [f"lane:{lane}" for lane in range(k)]
        self.ar_after = allreduce_after(costs, sched, self.last_kind)
        self.queue = EventQueue()
        self.events: list[Event] = []
        self.net = Network(costs, k, opts, self.queue, self.events)
        self.stop_pos, self.lanes_left = steady_stop(sched, self.last_kind, settle) if opts.shortcuts else ([], 0)
        self.memory = LaneMemory(costs, k, sched.stashes_weights)
        self.cores = CoreShare(self.lanes_devices, opts.core_nodes)
        # Arrival times of inputs, None until they arrive: act_in[c*n+mb] (activations into
        # chunk c; chunk 0's are there at 0), grad_in[c*n+mb] (gradients; the last chunk's at 0).
        size = self.n_chunks * self.n
        self.act_in: list[float | None] = [0.0] * self.n + [None] * (size - self.n)
        self.grad_in: list[float | None] = [None] * (size - self.n) + [0.0] * self.n
        self.pos, self.busy = [0] * k, [False] * k
        self.lane_end, self.comm_free = [0.0] * k, [0.0] * k
        self.block_end = [0.0] * sched.blocks
        self.ar_wait = [[0.0] * sched.blocks for _ in range(k)]  # per lane and block: waiting on its overlapped AR
        self.now = 0.0

    def try_start(self, lane: int, now: float) -> None:
        """Start the lane's next action at ``now`` if the lane is free and its input has arrived
        (the hot path: once per action and per arrival, kept in one frame)."""
        if self.busy[lane]:
            return
        p = self.pos[lane]
        acts = self.actions[lane]
        if p >= len(acts):
            return
        a = acts[p]
        c, kind, mb = a
        if kind == "F":
            if self.act_in[c * self.n + mb] is None:
                return
            dur = self.fwd[c]
            self.memory.forward_starts(lane, c, now)
        elif kind == "B":
            if self.grad_in[c * self.n + mb] is None:
                return
            dur = self.bwd[c]
            self.memory.backward_starts(lane, c, now)
        else:
            dur = self.wgt[c]
            self.memory.backward_starts(lane, c, now)
        self.busy[lane] = True
        if self.opts.overlap_allreduce and p in self.ar_after[lane]:
            for ch, blk in self.ar_after[lane][p]:
                self._overlapped_ar(lane, ch, blk, now, dur)
        if self.cores and lane in self.cores.pools_of:  # its end depends on the other lanes computing meanwhile
            for end, other, version in self.cores.begin(lane, dur, now):
                self.queue.push(end, SHARED, (other, version))
            return
        end = now + dur
        if self.record:
            self.events.append(new_event(Event, (self.lane_track[lane], self.texts[lane][p], kind, c, mb, now, end)))
        self.queue.push(end, COMPUTE, (lane, a))

    def shared_done(self, lane: int, version: int, now: float) -> bool:
        """A lane's action on shared cores may end (a stale version: it was rescheduled); True once the run may stop."""
        start, ends = self.cores.finish(lane, version, now)
        if start is None:
            return False
        for end, other, later in ends:
            self.queue.push(end, SHARED, (other, later))
        p = self.pos[lane]
        a = self.actions[lane][p]
        if self.record:
            self.events.append(Event(self.lane_track[lane], self.texts[lane][p], a.kind, a.stage, a.mb, start, now))
        return self.lane_done(lane, a, now)

    def compute_rate(self, lane: int) -> float:
        """Nominal (cost model) seconds of compute the lane did per second it took, over the run:
        above 1 on shared cores while fewer of the node's devices computed; 1 elsewhere."""
        return self.cores.mean_rate(lane) if self.cores else 1.0

    def _overlapped_ar(self, lane: int, c: int, blk: int, t0: float, dur: float) -> None:
        """Chunk c's all-reduce in DDP buckets on the lane's communication stream, during [t0, t0 + dur]."""
        cost = self.costs[c]
        bucket_bytes = self.opts.bucket_bytes
        nb = max(1, math.ceil(cost.allreduce_bytes / bucket_bytes)) if bucket_bytes > 0 else 1
        per = cost.allreduce_s / nb
        t = self.comm_free[lane]
        first = None
        for b in range(nb):
            ready = t0 + dur * (b + 1) / nb
            start = max(ready, t)
            if first is None:
                first = start
            t = start + per
        self.comm_free[lane] = t
        self.block_end[blk] = max(self.block_end[blk], t)
        if self.record and first is not None:
            self.events.append(Event(f"comm:{lane}", f"AR {c}", "AR", c, -1, first, t))

    def _blocking_tail(self, lane: int, ch: int, blk: int, t: float) -> float:
        """Chunk ch's all-reduce (unless overlapped) then its optimizer step, on the lane from t."""
        cost = self.costs[ch]
        steps = [] if self.opts.overlap_allreduce else [("AR", cost.allreduce_s)]
        steps.append(("OPT", cost.optimizer_step_s))
        if cost.grad_copy_bytes:  # the gradients' flat copy while they are reduced; for an instant where the
            held_s = max(steps[0][1], 0.0) if steps[0][0] == "AR" else 0.0  # reduction overlaps or there is none
            self.memory.change(lane, t, cost.grad_copy_bytes)  # (DeepSpeed flattens them even so), as
            self.memory.change(lane, t + held_s, -cost.grad_copy_bytes)  # planner.costmodel.iteration counts it
        for kind, dur in steps:
            if dur <= 0:
                continue
            if self.record:
                self.events.append(Event(f"lane:{lane}", f"{kind} {ch}", kind, ch, -1, t, t + dur))
            t += dur
        self.block_end[blk] = max(self.block_end[blk], t)
        return t

    def finish_action(self, lane: int, a: Action, now: float) -> None:
        """Action a of the lane ends: all-reduce and step if due, free memory, send its output."""
        c, kind, mb = a
        self.busy[lane] = False
        p = self.pos[lane]
        self.pos[lane] = p + 1
        self.lane_end[lane] = now
        if kind != "F":  # the pass's memory goes before an all-reduce that follows it
            self.memory.backward_ends(lane, c, kind == self.last_kind, now)
        due = self.ar_after[lane].get(p)
        overlap = self.opts.overlap_allreduce
        blocked = due is not None and (not overlap or any(self.costs[ch].optimizer_step_s > 0 for ch, _ in due))
        if blocked:  # the lane all-reduces and steps before anything else (even a local transfer's consumer) runs
            assert due is not None
            t = now if not overlap else max(now, self.comm_free[lane])
            self.ar_wait[lane][due[0][1]] += t - now  # blocked on its own overlapped all-reduce (0 without)
            for ch, blk in due:
                t = self._blocking_tail(lane, ch, blk, t)
            self.busy[lane] = True
            self.queue.push(t, COMPUTE, (lane, None))
        if kind == "F":
            if c < self.n_chunks - 1:
                self.send(c, c + 1, mb, now, True)
        else:
            last = kind == self.last_kind
            if last and now > self.block_end[mb // self.m]:
                self.block_end[mb // self.m] = now
            if kind == "B" and c > 0:
                self.send(c, c - 1, mb, now, False)
        if not blocked:
            self.try_start(lane, now)

    def send(self, c_from: int, c_to: int, mb: int, now: float, fwd_dir: bool) -> None:
        """Send mb's activations (fwd_dir) or gradients from chunk c_from to c_to; over a free
        boundary they are there at once."""
        if not self.net.send(c_from, c_to, mb, now, fwd_dir):
            self.deliver(fwd_dir, c_to, mb, now)

    def deliver(self, activations: bool, c_to: int, mb: int, now: float) -> None:
        """mb's activations (or gradients) are at chunk c_to: its lane may start."""
        (self.act_in if activations else self.grad_in)[c_to * self.n + mb] = now
        self.try_start(c_to % self.k, now)

    def lane_done(self, lane: int, a: Action | None, now: float) -> bool:
        """A lane's action or blocking all-reduce ended; True once the run may stop."""
        if a is None:  # a blocking all-reduce ended
            self.busy[lane] = False
            self.lane_end[lane] = now
            self.try_start(lane, now)
            return False
        self.finish_action(lane, a, now)
        if self.stop_pos and self.pos[lane] == self.stop_pos[lane] + 1:
            self.lanes_left -= 1
            return not self.lanes_left  # the measured iterations have ended: later events cannot change them
        return False

    def run(self) -> None:
        """Play the events in time order until none is left (or the run may stop)."""
        for lane in range(self.k):
            self.try_start(lane, 0.0)
        heap, net = self.queue.heap, self.net
        now = 0.0
        # a guard against engine bugs, never hit (shared cores reschedule every computing lane per start and end)
        budget = (64 + 2 * self.k * bool(self.cores)) * sum(len(a) for a in self.actions) + 1024
        while heap:
            budget -= 1
            if budget < 0:
                raise ScheduleError("simulation does not converge", "this is a bug in planner; report it")
            now, _, typ, payload = heapq.heappop(heap)
            if typ == COMPUTE:
                if self.lane_done(payload[0], payload[1], now):
                    break
            elif typ == SHARED:
                if self.shared_done(payload[0], payload[1], now):
                    break
            elif typ == LATENCY:
                net.join(payload, now)
            else:
                for x in net.finish(payload[0], payload[1], now) if typ == LINK else (payload,):
                    op, c_to, mb = net.arrive(x, now)
                    self.deliver(op == "act", c_to, mb, now)
        self.now = now
        self._check_stalled()

    def _check_stalled(self) -> None:
        if self.stop_pos and not self.lanes_left:
            return
        actions, pos = self.actions, self.pos
        stuck = [f"device group {lane} at {actions[lane][pos[lane]]}" for lane in range(self.k)
                 if pos[lane] < len(actions[lane])]
        if stuck:  # cannot happen for a validated schedule; a guard against engine bugs
            raise ScheduleError(f"simulation stalled: {', '.join(stuck[:4])}", "this is a bug in planner; report it")

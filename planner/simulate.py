"""Event-driven simulation of a plan's pipeline schedule (pure: no torch, click or rich).

The simulator plays a :class:`planner.schedule.Schedule` over per-stage costs
(:class:`planner.ir.StageCost`, from :func:`planner.costmodel.stage_costs`) step by step:

* **Devices.** The K pipeline ranks ("lanes") each run their actions in the schedule's
  order, one at a time; an action starts when the lane is free and its inputs have
  arrived. All devices of a stage's group do the same work at the same time (the cost
  model gives per-device times, split-form collectives included), so a lane stands for
  every device of its group. Under ``interleaved`` a lane hosts the chunks c with
  c mod K equal to it.
* **Links.** Activations (after F) go to the next chunk over that chunk boundary's link
  (``send_link``), gradients (after B) come back over the same link, same size. A
  transfer waits the link latency, then its bytes flow. Transfers of one flow (a stage
  boundary and direction) go one after another, in order, as sends on one channel do in
  NCCL and gloo; flows on the same link id in the same direction (towards later or
  earlier device groups: ``<id> fwd`` / ``<id> bwd``) share its bandwidth equally
  (processor sharing), so two flows at once each take twice as long.
  ``SimOptions.duplex=False`` makes both directions share; ``share_links=False`` gives
  every transfer the whole link at once (alpha + n/beta). Transfers overlap compute. A
  boundary with no link or no bytes, or between chunks on the same lane, is free.
* **Gradient all-reduce.** After a stage's last backward (B, or W under ``zb-h1``) its
  ``allreduce_s`` runs on the lane and blocks it (the default; what the analytic cost model
  adds). With ``SimOptions.overlap_allreduce`` it runs as DDP does: gradients in buckets of
  ``bucket_bytes``, bucket i ready at (i+1)/n of the last backward, all-reduced one after
  another on the lane's communication stream, overlapping compute.
* **Optimizer step.** ``optimizer_step_s`` of a stage runs on its lane right after its
  all-reduce (after the last backward when it has none; with ``overlap_allreduce``, once
  the lane's last all-reduce bucket is done), blocks the lane, and counts as busy time:
  it is part of the iteration.
* **Memory** per lane over time: static bytes (weights, gradients, optimizer state) of its
  chunks; + ``activation_bytes`` of a chunk from the start of a micro-batch's F until the
  end of its B (its W under ``zb-h1``); + ``workspace_bytes`` during B and W; under
  ``pipedream`` + ``weight_bytes`` per stashed weight version: a stage with n micro-batches
  in flight keeps n versions, one of which is the live weights (so n - 1 extra).

Times and the bubble:

* ``iteration_s``: for the synchronous schedules, from 0 to the end of the last action,
  transfer or all-reduce. For ``pipedream`` (no flush) the schedule runs iterations of M
  micro-batches back to back: S = ceil(2K/M) to fill the pipeline, ``pipedream_blocks``
  (default 2) measured ones, and S more so that the final drain does not touch them. An
  iteration ends when every stage has finished the backward of its last micro-batch (and
  that iteration's all-reduce). ``iteration_s`` is the steady-state time per M
  micro-batches: the mean time of the measured iterations; while they still differ (a
  pipeline whose backlog builds up slowly) S is doubled, up to 3 times. A slow build-up
  can still look steady for a while, so the result is never less than the busiest
  resource's work per iteration (a device group's compute and all-reduce, one flow's
  transfers, or a link's), which bounds every steady state from below. With free
  communication this is exactly M times the slowest stage's F + B. The run stops as soon
  as the last measured iteration has ended (later events cannot move it), so a pipedream
  run's ``makespan_s``, events and memory timeline end there (the trailing S iterations
  only fix the schedule's order up to that point).
* **Shortcuts** (``SimOptions.shortcuts``, on by default, same times): a link pool that
  carries one flow is first in, first out at full bandwidth, computed directly instead of
  through the sharing code; and the pipedream stop above. Off, every event is played.
* ``busy_s`` of a device: its compute (F, B, W) for one iteration of M micro-batches plus
  the all-reduce time it is blocked for. ``bubble_fraction`` = 1 - sum(busy) / (K *
  iteration_s): the share of device time spent idle (waiting for inputs or transfers).
  Uniform stages and free communication give (K-1)/(M+K-1) under gpipe and 1f1b.
"""

from __future__ import annotations

import heapq
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from planner import ir
from planner.costmodel import stage_costs
from planner.errors import PlanError, ScheduleError
from planner.schedule import (
    Action,
    Schedule,
    find_kind,
    make_schedule,
    schedule_kind,
)
from planner.trace import chrome_trace
from planner.validate import validate_plan

__all__ = ["DeviceResult", "Event", "SimOptions", "SimResult", "pipedream_settle_blocks", "simulate", "simulate_costs",
           "validate_plan"]

# ----------------------------------------------------------------------------- values


@dataclass(frozen=True)
class SimOptions:
    """Knobs of the simulation (defaults match the analytic cost model)."""

    overlap_allreduce: bool = False
    bucket_bytes: float = 25 * 2**20
    duplex: bool = True
    share_links: bool = True
    pipedream_blocks: int | None = None  # measured steady-state iterations (default 2)
    record_events: bool = True
    # False: play every transfer through the link-sharing code and pipedream's trailing
    # iterations to the end (the reference definition; the shortcuts give the same times).
    shortcuts: bool = True


class Event(NamedTuple):
    """One interval on a track: a lane's compute or all-reduce, or a link's transfer.

    ``track`` is ``lane:<k>`` (a pipeline rank), ``comm:<k>`` (its overlapped
    all-reduce stream) or ``link:<id>``; ``op`` is F, B, W, AR, OPT (optimizer step), act or grad.
    """

    track: str
    name: str
    op: str
    stage: int
    mb: int
    start: float
    end: float


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

    @property
    def fits(self) -> bool:
        return self.capacity_bytes <= 0 or self.peak_memory_bytes <= self.capacity_bytes

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "busy_s": self.busy_s, "peak_memory_bytes": self.peak_memory_bytes,
                "lane": self.lane, "compute_s": self.compute_s, "peak_in_flight": self.peak_in_flight,
                "capacity_bytes": self.capacity_bytes, "fits": self.fits}


@dataclass(frozen=True)
class SimResult:
    """The outcome of one simulation (see the module docstring for the definitions)."""

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
        their overlapped all-reduce streams), process 2 the links (see :mod:`planner.trace`).
        """
        return chrome_trace(self)


# ----------------------------------------------------------------------------- the engine


def pipedream_settle_blocks(stages: int, microbatches: int) -> int:
    """Iterations of M micro-batches run before the measured ones (warm-up), and after them
    (so that the final drain does not touch them): at first ceil(2K/M)."""
    return -(-2 * stages // microbatches)


class _Link:
    """Processor sharing on one link (and direction): the active transfers split the bandwidth.

    Transfers of one flow (one stage boundary and direction) go one after another: only a
    flow's head is active, the rest wait in ``queues``.
    """

    __slots__ = ("active", "bandwidth", "last", "queues", "version")

    def __init__(self, bandwidth: float) -> None:
        self.bandwidth = bandwidth
        self.active: dict[int, float] = {}
        self.queues: dict[int, list[int]] = {}
        self.last = 0.0
        self.version = 0

    def progress(self, now: float) -> None:
        n = len(self.active)
        if n and now > self.last:
            done = (now - self.last) * self.bandwidth / n
            for x in self.active:
                self.active[x] -= done
        self.last = now

    def next_finish(self, now: float) -> float:
        return now + min(self.active.values()) * len(self.active) / self.bandwidth


_COMPUTE, _LATENCY, _LINK, _ARRIVE = 0, 1, 2, 3
_BY_START_TRACK = operator.itemgetter(5, 0)  # Event (start, track), a C-level sort key
_new_event = tuple.__new__  # Event(*fields) without NamedTuple's Python-level __new__ (the hot path)


def _solo_links(link_of_fwd: Sequence[str | None], link_of_bwd: Sequence[str | None]) -> dict[str, float]:
    """Link pools that carry a single flow (one boundary, one direction), each with the time
    it is free from (0). Processor sharing with one flow is first in, first out at the full
    bandwidth (a transfer ends at max(its arrival, the previous end) + bytes / bandwidth, the
    same float the sharing code computes), so the engine takes that shortcut for them."""
    flows: dict[str, set[tuple[int, bool]]] = {}
    for fwd_dir, keys in ((True, link_of_fwd), (False, link_of_bwd)):
        for c, key in enumerate(keys):
            if key is not None:
                flows.setdefault(key, set()).add((c, fwd_dir))
    return {key: 0.0 for key, f in flows.items() if len(f) == 1}


def _pipedream_stop(sched: Schedule, last_kind: str, settle: int) -> tuple[list[int], int]:
    """Where a pipedream run may stop: per lane, the position of its last ``last_kind`` action
    of the last measured iteration (block ``blocks - settle - 1``), and the number of lanes.

    Once every lane has finished that action (and queued its all-reduce), every measured
    iteration's end is known, and nothing that happens later can move it (an event only
    affects later ones), so the run stops there instead of playing the trailing warm-down
    iterations; ``iteration_s`` is unchanged. Empty for the synchronous schedules."""
    if sched.flushes or settle < 1 or sched.blocks <= 2 * settle:
        return [], 0
    last_blk = sched.blocks - settle - 1
    m = sched.microbatches
    stop = []
    for acts in sched.actions:
        stop.append(max(at for at, a in enumerate(acts) if a.kind == last_kind and a.mb // m == last_blk))
    return stop, len(stop)


def simulate_costs(costs: Sequence[ir.StageCost], schedule: str | Schedule, microbatches: int,
                   virtual_stages: int = 1, options: SimOptions | None = None) -> SimResult:
    """Simulate ``schedule`` over per-chunk ``costs`` (K*v of them, in model order).

    ``schedule`` is a name from :data:`planner.schedule.SCHEDULES` or a ready Schedule.
    """
    opts = options or SimOptions()
    n_chunks = len(costs)
    if n_chunks == 0:
        raise PlanError("no stages to simulate", "a plan needs at least one stage")
    v = virtual_stages
    if n_chunks % v:
        raise PlanError(f"{n_chunks} stages do not split into {v} virtual stages per device",
                        "interleaved plans list K*v chunks")
    k = n_chunks // v
    if isinstance(schedule, Schedule):
        if schedule.chunks != n_chunks:
            raise ScheduleError(f"schedule has {schedule.chunks} stages, the costs {n_chunks}", "match them")
        return _simulate(costs, schedule, v, opts, pipedream_settle_blocks(k, schedule.microbatches))
    if schedule_kind(schedule).flushes:
        return _simulate(costs, make_schedule(schedule, k, microbatches, v), v, opts, 0)
    # Asynchronous: lengthen the warm-up until the measured iterations take equal times.
    measured = max(2, opts.pipedream_blocks or 2)
    settle = pipedream_settle_blocks(k, microbatches)
    for _ in range(4):
        sched = make_schedule(schedule, k, microbatches, v, pipedream_blocks=2 * settle + measured)
        result, stable = _simulate_window(costs, sched, v, opts, settle)
        if stable:
            break
        settle *= 2
    return result


def _simulate(costs: Sequence[ir.StageCost], sched: Schedule, v: int, opts: SimOptions, settle: int) -> SimResult:
    return _simulate_window(costs, sched, v, opts, settle)[0]


def _simulate_window(costs: Sequence[ir.StageCost], sched: Schedule, v: int, opts: SimOptions,
                     settle: int) -> tuple[SimResult, bool]:
    """Run the engine; for pipedream measure the iterations after ``settle`` warm-up ones
    and before the last ``settle`` (returns whether they all took the same time)."""
    engine = _Engine(costs, sched, v, opts, settle)
    engine.run()
    return engine.result()


def _lane_devices(costs: Sequence[ir.StageCost], k: int) -> list[tuple[str, ...]]:
    """The devices of each lane; raises PlanError unless chunk c runs on the devices of chunk c mod K."""
    lanes_devices = []
    for lane in range(k):
        devs = tuple(costs[lane].devices)
        for c in range(lane + k, len(costs), k):
            if tuple(costs[c].devices) != devs:
                raise PlanError(f"stage {c} runs on {list(costs[c].devices)}, but chunk {c} belongs to device "
                                f"group {lane} {list(devs)}", "chunk c runs on the devices of chunk c mod K")
        lanes_devices.append(devs)
    return lanes_devices


def _allreduce_after(costs: Sequence[ir.StageCost], sched: Schedule,
                     last_kind: str) -> list[dict[int, list[tuple[int, int]]]]:
    """Per lane: which (chunk, block)s all-reduce and step after which action (its position in
    the lane's order): the chunk's last ``last_kind`` action of the block."""
    m = sched.microbatches
    ar_after: list[dict[int, list[tuple[int, int]]]] = []
    for acts in sched.actions:
        last_pos: dict[tuple[int, int], int] = {}
        for at, a in enumerate(acts):
            if a.kind == last_kind:
                last_pos[(a.stage, a.mb // m)] = at
        table: dict[int, list[tuple[int, int]]] = {}
        for (c, blk), at in last_pos.items():
            if costs[c].allreduce_s > 0 or costs[c].optimizer_step_s > 0:
                table.setdefault(at, []).append((c, blk))
        ar_after.append(table)
    return ar_after


class _Engine:
    """One run of the event-driven simulation: the lanes', links' and memory's state as
    attributes, the event handlers as methods (see the module docstring for the model)."""

    __slots__ = ("act", "act_in", "actions", "ar_after", "block_end", "busy", "bwd", "chunk_flight", "comm_free",
                 "costs", "events", "fifo_free", "flow_end", "flow_of", "fwd", "grad_in", "heap", "in_flight", "k",
                 "lane_end", "lane_track", "lanes_devices", "lanes_left", "last_kind", "link_names", "link_of_bwd",
                 "link_of_fwd", "links", "m", "mem", "n", "n_chunks", "n_x", "name", "now", "opts", "overlap",
                 "peak_in_flight", "peak_mem", "pos", "record", "sched", "seq", "settle", "stash", "stop_pos",
                 "texts", "timeline", "v", "wgt", "wsp", "xfers")

    def __init__(self, costs: Sequence[ir.StageCost], sched: Schedule, v: int, opts: SimOptions,
                 settle: int) -> None:
        self.costs = costs
        self.sched = sched
        self.actions = sched.actions
        self.v = v
        self.opts = opts
        self.settle = settle
        self.n_chunks = len(costs)
        self.k = self.n_chunks // v
        self.name = sched.name
        self.m = sched.microbatches
        self.n = sched.total_microbatches
        self.lanes_devices = _lane_devices(costs, self.k)
        self._init_chunks()
        self.record = opts.record_events
        self.overlap = opts.overlap_allreduce
        self.texts = sched.text()  # action names, once (events and the result share them)
        self.lane_track = [f"lane:{lane}" for lane in range(self.k)]
        self.ar_after = _allreduce_after(costs, sched, self.last_kind)
        self._init_links()
        self._init_state()

    def _init_chunks(self) -> None:
        """Per chunk: the F, B and W times and the memory each action adds or frees."""
        costs = self.costs
        self.fwd = [c.forward_s for c in costs]
        if self.sched.split_backward:
            self.bwd = [c.backward_s - c.backward_weight_s for c in costs]
            self.wgt = [c.backward_weight_s for c in costs]
        else:
            self.bwd = [c.backward_s for c in costs]
            self.wgt = [0.0] * self.n_chunks
        self.act = [c.activation_bytes for c in costs]
        self.wsp = [c.workspace_bytes for c in costs]
        self.stash = [c.weight_bytes if self.sched.stashes_weights else 0 for c in costs]
        self.last_kind = "W" if self.sched.split_backward else "B"

    def _init_links(self) -> None:
        """Links: one pool per (id, direction) unless half-duplex; the shortcuts' tables."""
        self.links: dict[str, _Link] = {}
        self.link_names: list[str] = []
        last = self.n_chunks - 1
        self.link_of_fwd = [self.link_key(c, True) if c < last else None for c in range(self.n_chunks)]
        self.link_of_bwd = [self.link_key(c, False) if c < last else None for c in range(self.n_chunks)]
        shortcuts = self.opts.shortcuts
        self.fifo_free = _solo_links(self.link_of_fwd, self.link_of_bwd) if shortcuts else {}
        self.stop_pos, self.lanes_left = (_pipedream_stop(self.sched, self.last_kind, self.settle) if shortcuts
                                          else ([], 0))

    def _init_state(self) -> None:
        """Arrival times of inputs: act_in[c*n+mb] (activations into chunk c), grad_in[c*n+mb]
        (gradients into chunk c), None until they arrive; the lanes, memory and event queue."""
        n_chunks, n, k = self.n_chunks, self.n, self.k
        self.act_in: list[float | None] = [None] * (n_chunks * n)
        self.grad_in: list[float | None] = [None] * (n_chunks * n)
        for mb in range(n):
            self.act_in[mb] = 0.0
        for mb in range(n):
            self.grad_in[(n_chunks - 1) * n + mb] = 0.0
        self.pos = [0] * k
        self.busy = [False] * k
        self.lane_end = [0.0] * k
        self.comm_free = [0.0] * k
        self.mem = [sum(self.costs[c].static_bytes for c in range(lane, n_chunks, k)) for lane in range(k)]
        self.peak_mem = list(self.mem)
        self.timeline: list[list[tuple[float, int]]] = [[(0.0, self.mem[lane])] for lane in range(k)]
        self.in_flight = [0] * k
        self.peak_in_flight = [0] * k
        self.chunk_flight = [0] * n_chunks
        self.block_end = [0.0] * self.sched.blocks
        self.events: list[Event] = []
        self.heap: list[tuple[float, int, int, Any]] = []
        self.seq = 0
        self.xfers: dict[int, tuple[str, int, int, float, str, float]] = {}  # id -> (link, chunk_to, mb, bytes, op, t0)
        self.n_x = 0
        self.flow_of: dict[int, int] = {}
        self.flow_end: dict[tuple[str, int], float] = {}
        self.now = 0.0

    def link_key(self, c: int, activations: bool) -> str | None:
        """The pool that carries boundary c's activations (or gradients); None if free."""
        cost = self.costs[c]
        k = self.k
        src, dst = c % k, (c + 1) % k
        if cost.send_link is None or cost.send_bytes <= 0 or src == dst:
            return None
        if not activations:
            src, dst = dst, src
        base = cost.send_link_id or f"{c}->{c + 1}"
        key = f"{base} {'fwd' if src < dst else 'bwd'}" if self.opts.duplex else base
        if key not in self.links:
            self.links[key] = _Link(cost.send_link.bandwidth_Bps)
            self.link_names.append(key)
        return key

    def set_mem(self, lane: int, now: float, delta: int) -> None:
        mem = self.mem
        mem[lane] += delta
        if mem[lane] > self.peak_mem[lane]:
            self.peak_mem[lane] = mem[lane]
        tl = self.timeline[lane]
        if tl[-1][0] == now and len(tl) > 1:
            tl[-1] = (now, mem[lane])
        else:
            tl.append((now, mem[lane]))

    def try_start(self, lane: int, now: float) -> None:
        """Start the lane's next action at ``now`` if the lane is free and its input has arrived."""
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
            delta = self._enter_flight(lane, c)
        elif kind == "B":
            if self.grad_in[c * self.n + mb] is None:
                return
            dur = self.bwd[c]
            delta = self.wsp[c]
        else:
            dur = self.wgt[c]
            delta = self.wsp[c]
        if delta:
            self.set_mem(lane, now, delta)
        self.busy[lane] = True
        end = now + dur
        if self.record:
            self.events.append(_new_event(Event, (self.lane_track[lane], self.texts[lane][p], kind, c, mb, now, end)))
        if self.overlap and p in self.ar_after[lane]:
            for ch, blk in self.ar_after[lane][p]:
                self._overlapped_ar(lane, ch, blk, now, dur)
        self.seq += 1
        heapq.heappush(self.heap, (end, self.seq, _COMPUTE, (lane, a)))

    def _enter_flight(self, lane: int, c: int) -> int:
        """A forward of chunk c starts: count its micro-batch in flight; the bytes it adds."""
        delta = self.act[c]
        self.chunk_flight[c] += 1
        if self.stash[c] and self.chunk_flight[c] > 1:
            delta += self.stash[c]
        self.in_flight[lane] += 1
        if self.in_flight[lane] > self.peak_in_flight[lane]:
            self.peak_in_flight[lane] = self.in_flight[lane]
        return delta

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

    def send(self, c_from: int, c_to: int, mb: int, now: float, fwd_dir: bool) -> None:
        """Send micro-batch mb's activations (fwd_dir) or gradients from chunk c_from to c_to."""
        boundary = min(c_from, c_to)
        key = self.link_of_fwd[boundary] if fwd_dir else self.link_of_bwd[boundary]
        if key is None:
            (self.act_in if fwd_dir else self.grad_in)[c_to * self.n + mb] = now
            self.try_start(c_to % self.k, now)
            return
        cost = self.costs[boundary]
        assert cost.send_link is not None
        self.n_x += 1
        x = self.n_x
        self.xfers[x] = (key, c_to, mb, cost.send_bytes, "act" if fwd_dir else "grad", now)
        self.flow_of[x] = 2 * boundary + (0 if fwd_dir else 1)
        self.seq += 1
        if not self.opts.share_links:
            heapq.heappush(self.heap, (now + cost.send_link.transfer_s(cost.send_bytes), self.seq, _ARRIVE, x))
            return
        t = now + cost.send_link.latency_s
        fifo_free = self.fifo_free
        if key in fifo_free:  # the link's only flow: first in, first out at the full bandwidth
            t = max(t, fifo_free[key]) + cost.send_bytes / self.links[key].bandwidth
            fifo_free[key] = t
            heapq.heappush(self.heap, (t, self.seq, _ARRIVE, x))
        else:
            heapq.heappush(self.heap, (t, self.seq, _LATENCY, x))

    def finish_lane_action(self, lane: int, a: Action, now: float) -> None:
        """Action a of the lane ends: all-reduce and step if due, free memory, send its output."""
        c, kind, mb = a
        self.busy[lane] = False
        p = self.pos[lane]
        self.pos[lane] = p + 1
        self.lane_end[lane] = now
        due = self.ar_after[lane].get(p)
        overlap = self.opts.overlap_allreduce
        blocked = due is not None and (not overlap or any(self.costs[ch].optimizer_step_s > 0 for ch, _ in due))
        if blocked:  # the lane all-reduces and steps before anything else (even a local transfer's consumer) runs
            assert due is not None
            t = now if not overlap else max(now, self.comm_free[lane])
            for ch, blk in due:
                t = self._blocking_tail(lane, ch, blk, t)
            self.busy[lane] = True
            self.seq += 1
            heapq.heappush(self.heap, (t, self.seq, _COMPUTE, (lane, None)))
        if kind == "F":
            if c < self.n_chunks - 1:
                self.send(c, c + 1, mb, now, True)
        else:
            self._release(lane, c, kind, mb, now)
            if kind == "B" and c > 0:
                self.send(c, c - 1, mb, now, False)
        if not blocked:
            self.try_start(lane, now)

    def _release(self, lane: int, c: int, kind: str, mb: int, now: float) -> None:
        """A B or W of chunk c ends: free its workspace, and after the last one its activations
        (and a stashed weight version); the micro-batch's block may end."""
        delta = -self.wsp[c]
        if kind == self.last_kind:
            delta -= self.act[c]
            self.chunk_flight[c] -= 1
            self.in_flight[lane] -= 1
            if self.stash[c] and self.chunk_flight[c] >= 1:
                delta -= self.stash[c]
            blk = mb // self.m
            if now > self.block_end[blk]:
                self.block_end[blk] = now
        if delta:
            self.set_mem(lane, now, delta)

    def _blocking_tail(self, lane: int, ch: int, blk: int, t: float) -> float:
        """Chunk ch's all-reduce (unless overlapped) then its optimizer step, on the lane from t."""
        cost = self.costs[ch]
        steps = [] if self.opts.overlap_allreduce else [("AR", cost.allreduce_s)]
        steps.append(("OPT", cost.optimizer_step_s))
        for kind, dur in steps:
            if dur <= 0:
                continue
            if self.record:
                self.events.append(Event(f"lane:{lane}", f"{kind} {ch}", kind, ch, -1, t, t + dur))
            t += dur
        self.block_end[blk] = max(self.block_end[blk], t)
        return t

    def join_link(self, x: int, now: float) -> None:
        """Transfer x's latency is over: it queues behind its flow, and joins the link if the flow is idle."""
        key = self.xfers[x][0]
        link = self.links[key]
        queue = link.queues.setdefault(self.flow_of[x], [])
        queue.append(x)
        if len(queue) == 1:  # the flow is idle: the transfer joins the link now
            link.progress(now)
            link.active[x] = self.xfers[x][3]
            link.version += 1
            self.seq += 1
            heapq.heappush(self.heap, (link.next_finish(now), self.seq, _LINK, (key, link.version)))

    def link_finish(self, key: str, now: float) -> None:
        """The link's transfer(s) with the fewest bytes left end at ``now``."""
        link = self.links[key]
        link.progress(now)
        if not link.active:
            return
        # This event was set for the transfer(s) with the fewest bytes left: finish them (and
        # any within rounding of them), whatever float residue is left, so time always moves on.
        if len(link.active) == 1:
            done = list(link.active)
        else:
            least = min(link.active.values())
            done = [x for x, r in link.active.items() if r <= least + 1e-9 * self.xfers[x][3]]
        for x in done:
            del link.active[x]
            queue = link.queues[self.flow_of[x]]
            queue.pop(0)
            if queue:  # the flow's next transfer starts now
                link.active[queue[0]] = self.xfers[queue[0]][3]
        link.version += 1
        if link.active:
            self.seq += 1
            heapq.heappush(self.heap, (link.next_finish(now), self.seq, _LINK, (key, link.version)))
        for x in done:
            self.arrive(x, now)

    def arrive(self, x: int, now: float) -> None:
        """Transfer x has arrived: its consumer may start."""
        key, c_to, mb, _, op, t0 = self.xfers.pop(x)
        flow = self.flow_of.pop(x, -1)
        if self.record:
            # Shown from when the flow is free for it (it waits in order behind the previous one).
            start = max(t0, self.flow_end.get((key, flow), t0))
            self.flow_end[(key, flow)] = now
            c_from = c_to - 1 if op == "act" else c_to + 1
            self.events.append(_new_event(Event, ("link:" + key, f"{op} {c_from}->{c_to} #{mb}", op,
                                                  min(c_from, c_to), mb, start, now)))
        (self.act_in if op == "act" else self.grad_in)[c_to * self.n + mb] = now
        self.try_start(c_to % self.k, now)

    def lane_done(self, lane: int, a: Action | None, now: float) -> bool:
        """A lane's action or blocking all-reduce ended; True once the run may stop."""
        if a is None:  # a blocking all-reduce ended
            self.busy[lane] = False
            self.lane_end[lane] = now
            self.try_start(lane, now)
            return False
        self.finish_lane_action(lane, a, now)
        if self.stop_pos and self.pos[lane] == self.stop_pos[lane] + 1:
            self.lanes_left -= 1
            return not self.lanes_left  # the measured iterations have ended: later events cannot change them
        return False

    def run(self) -> None:
        """Play the events in time order until none is left (or the run may stop)."""
        for lane in range(self.k):
            self.try_start(lane, 0.0)
        heap, links = self.heap, self.links
        now = 0.0
        budget = 64 * sum(len(a) for a in self.sched.actions) + 1024  # a guard against engine bugs, never hit
        while heap:
            budget -= 1
            if budget < 0:
                raise ScheduleError("simulation does not converge", "this is a bug in planner; report it")
            now, _, typ, payload = heapq.heappop(heap)
            if typ == _COMPUTE:
                if self.lane_done(payload[0], payload[1], now):
                    break
            elif typ == _LATENCY:
                self.join_link(payload, now)
            elif typ == _LINK:
                if links[payload[0]].version == payload[1]:
                    self.link_finish(payload[0], now)
            else:
                self.arrive(payload, now)
        self.now = now
        self._check_stalled()

    def _check_stalled(self) -> None:
        if self.stop_pos and not self.lanes_left:
            return
        actions, pos = self.sched.actions, self.pos
        stuck = [f"device group {lane} at {actions[lane][pos[lane]]}" for lane in range(self.k)
                 if pos[lane] < len(actions[lane])]
        if stuck:  # cannot happen for a validated schedule; a guard against engine bugs
            raise ScheduleError(f"simulation stalled: {', '.join(stuck[:4])}", "this is a bug in planner; report it")

    def _lane_work(self, lane: int) -> tuple[float, float]:
        """The lane's compute and busy time (compute, blocking all-reduce, optimizer steps) per iteration."""
        chunks = range(lane, self.n_chunks, self.k)
        compute = self.m * sum(self.fwd[c] + self.bwd[c] + self.wgt[c] for c in chunks)
        ar = 0.0 if self.opts.overlap_allreduce else sum(self.costs[c].allreduce_s for c in chunks)
        return compute, compute + ar + sum(self.costs[c].optimizer_step_s for c in chunks)

    def _steady_bound(self) -> float:
        """No steady state is faster than its busiest resource: a lane's work, one flow's
        transfers (in order), or a link's transfers (its bandwidth shared), per iteration."""
        m = self.m
        bound = max(self._lane_work(lane)[1] for lane in range(self.k))
        per_link: dict[str, float] = {}
        for c in range(self.n_chunks - 1):
            for pool in (self.link_of_fwd[c], self.link_of_bwd[c]):
                if pool is not None:
                    link_s = self.costs[c].send_bytes / self.links[pool].bandwidth
                    bound = max(bound, m * link_s)
                    per_link[pool] = per_link.get(pool, 0.0) + m * link_s
        return max([bound, *per_link.values()])

    def _measure(self, makespan: float) -> tuple[tuple[float, float], float, bool]:
        """The measured window, the time per iteration, and whether the measured iterations took equal times."""
        settle, blocks, block_end = self.settle, self.sched.blocks, self.block_end
        if not (not self.sched.flushes and settle >= 1 and blocks > 2 * settle):
            return (0.0, makespan), makespan, True
        measured = blocks - 2 * settle
        window = (block_end[settle - 1], block_end[settle - 1 + measured])
        iteration = (window[1] - window[0]) / measured
        steps = [block_end[settle + j] - block_end[settle + j - 1] for j in range(measured)]
        stable = max(steps) - min(steps) <= 1e-9 * max(max(steps), 1e-300)
        bound = self._steady_bound()
        if iteration < bound:
            iteration = bound
        return window, iteration, stable

    def _devices(self) -> tuple[list[DeviceResult], float]:
        """Every device's result (work per iteration of M micro-batches, memory), and the total busy time."""
        devices: list[DeviceResult] = []
        total_busy = 0.0
        for lane in range(self.k):
            compute, lane_busy = self._lane_work(lane)
            total_busy += lane_busy
            cap = min((self.costs[c].capacity_bytes for c in range(lane, self.n_chunks, self.k)), default=0)
            for dev in self.lanes_devices[lane]:
                devices.append(DeviceResult(dev, lane, lane_busy, compute, self.peak_mem[lane],
                                            self.peak_in_flight[lane], cap, tuple(self.timeline[lane])))
        return devices, total_busy

    def result(self) -> tuple[SimResult, bool]:
        """The SimResult of the run, and whether the measured pipedream iterations took equal times."""
        makespan = max([self.now, *self.lane_end, *self.comm_free])
        window, iteration, stable = self._measure(makespan)
        devices, total_busy = self._devices()
        k = self.k
        bubble = 1.0 - total_busy / (k * iteration) if iteration > 0 else 0.0
        bubble = min(max(bubble, 0.0), 1.0)
        if self.record:
            self.events.sort(key=_BY_START_TRACK)
        return SimResult(
            schedule=self.name, stages=k, microbatches=self.m, virtual_stages=self.v, iteration_s=iteration,
            bubble_fraction=bubble, makespan_s=makespan, window=window, devices=tuple(devices),
            lanes=tuple(self.lanes_devices), links=tuple(self.link_names), events=tuple(self.events),
            actions=tuple(tuple(r) for r in self.texts),
        ), stable


def simulate(plan: ir.Plan, options: SimOptions | None = None) -> SimResult:
    """Simulate one training iteration of ``plan`` (checked with :func:`validate_plan`)."""
    validate_plan(plan)
    costs = stage_costs(plan)
    return simulate_costs(costs, plan.schedule, plan.microbatches, plan.virtual_stages, options)

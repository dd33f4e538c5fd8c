"""Transfers between pipeline chunks over the cluster's links (pure: no torch, click or rich).

Owns the link model of :mod:`planner.simulate`: activations (after F) cross the chunk
boundary's link forward, gradients (after B) come back over it, same size. A transfer
waits the link latency, then its bytes flow. Transfers of one flow (a boundary and a
direction) go one after another, in order; flows on one pool (a link id and direction,
``<id> fwd`` / ``<id> bwd``, or the link id alone when half duplex) share its bandwidth
equally (processor sharing, :class:`LinkPool`). A pool with a single flow is first in,
first out at full bandwidth, computed directly (:func:`solo_links`, a shortcut with the
same floats). Without link sharing a transfer takes ``alpha + n/beta`` at once.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner import ir
from planner.simulate.events import ARRIVE, LATENCY, LINK, Event, EventQueue, new_event
from planner.simulate.result import SimOptions

Transfer = tuple[str, int, int, float, str, float]
"""(pool, chunk it goes to, micro-batch, bytes, ``act`` or ``grad``, time sent)."""


class LinkPool:
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


def solo_links(link_of_fwd: Sequence[str | None], link_of_bwd: Sequence[str | None]) -> dict[str, float]:
    """Link pools that carry a single flow (one boundary, one direction), each with the time
    it is free from (0). Processor sharing with one flow is first in, first out at the full
    bandwidth (a transfer ends at max(its arrival, the previous end) + bytes / bandwidth, the
    same float the sharing code computes), so the network takes that shortcut for them."""
    flows: dict[str, set[tuple[int, bool]]] = {}
    for fwd_dir, keys in ((True, link_of_fwd), (False, link_of_bwd)):
        for c, key in enumerate(keys):
            if key is not None:
                flows.setdefault(key, set()).add((c, fwd_dir))
    return {key: 0.0 for key, f in flows.items() if len(f) == 1}


class Network:
    """The transfers in flight: which pool carries each boundary, the pools, the flows."""

    __slots__ = ("costs", "events", "fifo_free", "flow_end", "flow_of", "k", "n_x", "names", "of_bwd", "of_fwd",
                 "opts", "pools", "queue", "record", "xfers")

    def __init__(self, costs: Sequence[ir.StageCost], k: int, opts: SimOptions, queue: EventQueue,
                 events: list[Event]) -> None:
        self.costs, self.k, self.opts, self.queue, self.events = costs, k, opts, queue, events
        self.record = opts.record_events
        self.pools: dict[str, LinkPool] = {}
        self.names: list[str] = []
        last = len(costs) - 1
        self.of_fwd = [self.pool_of(c, True) if c < last else None for c in range(len(costs))]
        self.of_bwd = [self.pool_of(c, False) if c < last else None for c in range(len(costs))]
        self.fifo_free = solo_links(self.of_fwd, self.of_bwd) if opts.shortcuts else {}
        self.xfers: dict[int, Transfer] = {}
        self.n_x = 0
        self.flow_of: dict[int, int] = {}
        self.flow_end: dict[tuple[str, int], float] = {}

    def pool_of(self, c: int, activations: bool) -> str | None:
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
        if key not in self.pools:
            self.pools[key] = LinkPool(cost.send_link.bandwidth_Bps)
            self.names.append(key)
        return key

    def send(self, c_from: int, c_to: int, mb: int, now: float, fwd_dir: bool) -> bool:
        """Start sending micro-batch mb's activations (fwd_dir) or gradients from chunk c_from
        to c_to; False when the boundary is free (the input is there now)."""
        boundary = min(c_from, c_to)
        key = self.of_fwd[boundary] if fwd_dir else self.of_bwd[boundary]
        if key is None:
            return False
        cost = self.costs[boundary]
        assert cost.send_link is not None
        self.n_x += 1
        x = self.n_x
        self.xfers[x] = (key, c_to, mb, cost.send_bytes, "act" if fwd_dir else "grad", now)
        self.flow_of[x] = 2 * boundary + (0 if fwd_dir else 1)
        if not self.opts.share_links:
            self.queue.push(now + cost.send_link.transfer_s(cost.send_bytes), ARRIVE, x)
            return True
        t = now + cost.send_link.latency_s
        fifo_free = self.fifo_free
        if key in fifo_free:  # the link's only flow: first in, first out at the full bandwidth
            t = max(t, fifo_free[key]) + cost.send_bytes / self.pools[key].bandwidth
            fifo_free[key] = t
            self.queue.push(t, ARRIVE, x)
        else:
            self.queue.push(t, LATENCY, x)
        return True

    def join(self, x: int, now: float) -> None:
        """Transfer x's latency is over: it queues behind its flow, and joins the link if the flow is idle."""
        key = self.xfers[x][0]
        pool = self.pools[key]
        queue = pool.queues.setdefault(self.flow_of[x], [])
        queue.append(x)
        if len(queue) == 1:  # the flow is idle: the transfer joins the link now
            pool.progress(now)
            pool.active[x] = self.xfers[x][3]
            pool.version += 1
            self.queue.push(pool.next_finish(now), LINK, (key, pool.version))

    def finish(self, key: str, version: int, now: float) -> list[int]:
        """The pool's transfer(s) with the fewest bytes left end at ``now`` (unless the pool
        changed since this event was set): the transfers that end, to :meth:`arrive`."""
        pool = self.pools[key]
        if pool.version != version:
            return []
        pool.progress(now)
        if not pool.active:
            return []
        # This event was set for the transfer(s) with the fewest bytes left: finish them (and
        # any within rounding of them), whatever float residue is left, so time always moves on.
        if len(pool.active) == 1:
            done = list(pool.active)
        else:
            least = min(pool.active.values())
            done = [x for x, r in pool.active.items() if r <= least + 1e-9 * self.xfers[x][3]]
        for x in done:
            del pool.active[x]
            queue = pool.queues[self.flow_of[x]]
            queue.pop(0)
            if queue:  # the flow's next transfer starts now
                pool.active[queue[0]] = self.xfers[queue[0]][3]
        pool.version += 1
        if pool.active:
            self.queue.push(pool.next_finish(now), LINK, (key, pool.version))
        return done

    def arrive(self, x: int, now: float) -> tuple[str, int, int]:
        """Transfer x has arrived: (``act`` or ``grad``, the chunk it went to, its micro-batch)."""
        key, c_to, mb, _, op, t0 = self.xfers.pop(x)
        flow = self.flow_of.pop(x, -1)
        if self.record:
            # Shown from when the flow is free for it (it waits in order behind the previous one).
            start = max(t0, self.flow_end.get((key, flow), t0))
            self.flow_end[(key, flow)] = now
            c_from = c_to - 1 if op == "act" else c_to + 1
            self.events.append(new_event(Event, ("link:" + key, f"{op} {c_from}->{c_to} #{mb}", op,
                                                 min(c_from, c_to), mb, start, now)))
        return op, c_to, mb

    def busiest_s(self, microbatches: int) -> float:
        """The most transfer time per iteration of M micro-batches on one flow or one pool
        (its bandwidth shared): a lower bound on any steady state. None without link sharing
        (0), where every transfer has the whole link at once and a flow's transfers overlap."""
        if not self.opts.share_links:
            return 0.0
        bound = 0.0
        per_pool: dict[str, float] = {}
        for c in range(len(self.costs) - 1):
            for pool in (self.of_fwd[c], self.of_bwd[c]):
                if pool is not None:
                    link_s = self.costs[c].send_bytes / self.pools[pool].bandwidth
                    bound = max(bound, microbatches * link_s)
                    per_pool[pool] = per_pool.get(pool, 0.0) + microbatches * link_s
        return max([bound, *per_pool.values()])

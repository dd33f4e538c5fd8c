"""The simulator's event queue and the intervals it records (pure: no torch, click or rich).

Owns :class:`Event` (one interval on a track, what the trace, the Gantt and the tests
read), the queue entry types and :class:`EventQueue`: a heap of ``(time, seq, type,
payload)`` where ``seq`` counts pushes, so entries at the same time pop in push order
(the simulation is deterministic).
"""

from __future__ import annotations

import heapq
import operator
from typing import Any, NamedTuple

COMPUTE, LATENCY, LINK, ARRIVE, SHARED = 0, 1, 2, 3, 4
"""Queue entries: a lane's action (or blocking all-reduce) ends; a transfer's latency is
over; a link's transfer may end (if the link's version still matches); a transfer arrives;
a lane's action on shared cores may end (if its version still matches: :mod:`planner.simulate.cores`)."""


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


BY_START_TRACK = operator.itemgetter(5, 0)
"""Sort key of events: (start, track), a C-level key."""

new_event = tuple.__new__
"""``new_event(Event, fields)``: an Event without NamedTuple's Python-level __new__ (the hot path)."""


class EventQueue:
    """The pending events in time order (ties in push order)."""

    __slots__ = ("heap", "seq")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, int, Any]] = []
        self.seq = 0

    def push(self, time_s: float, typ: int, payload: Any) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (time_s, self.seq, typ, payload))

"""Chrome trace event export of a simulation (pure: no torch, click or rich).

Owns the layout of :meth:`planner.simulate.SimResult.to_chrome_trace`: complete events
(``"ph": "X"``, microseconds); process 1 holds the devices (and their overlapped all-reduce
streams), process 2 the links; metadata events name and order them. The format is Chrome's
Trace Event Format (https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU),
which Perfetto opens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from planner.simulate.events import Event

if TYPE_CHECKING:  # result.py calls this module's chrome_trace
    from planner.simulate.result import SimResult

Trace = list[dict[str, Any]]
Tracks = dict[str, list[tuple[int, int]]]  # an event track -> the (pid, tid) threads it is drawn on


def chrome_trace(result: SimResult) -> dict[str, Any]:
    """Chrome trace event JSON (opens in Perfetto): one track per device and per link."""
    trace: Trace = [
        {"ph": "M", "pid": 1, "tid": 0, "name": "process_name", "args": {"name": "devices"}},
        {"ph": "M", "pid": 2, "tid": 0, "name": "process_name", "args": {"name": "links"}},
        {"ph": "M", "pid": 1, "tid": 0, "name": "process_sort_index", "args": {"sort_index": 1}},
        {"ph": "M", "pid": 2, "tid": 0, "name": "process_sort_index", "args": {"sort_index": 2}},
    ]
    tids = _device_threads(result, trace)
    row_of, n_rows = _link_rows(result.events)
    link_tid = _link_threads(result.links, n_rows, trace)
    for i, e in enumerate(result.events):
        where = [(2, link_tid[(e.track, row_of[i])])] if i in row_of else tids.get(e.track, [])
        for pid, tid in where:
            trace.append({"ph": "X", "pid": pid, "tid": tid, "name": e.name, "cat": e.op,
                          "ts": e.start * 1e6, "dur": max(0.0, e.end - e.start) * 1e6,
                          "args": {"stage": e.stage, "microbatch": e.mb}})
    return {"kind": "trace", "version": 1, "traceEvents": trace, "displayTimeUnit": "ms",  # viewers skip kind, version
            "otherData": {"schedule": result.schedule, "iteration_s": result.iteration_s,
                          "bubble_fraction": result.bubble_fraction}}


def _device_threads(result: SimResult, trace: Trace) -> Tracks:
    """Name a thread per device of each lane, then per device of each lane with an
    all-reduce stream (``comm:<k>`` events); the threads each lane track is drawn on."""
    tids: Tracks = {}
    tid = 0
    for lane, devs in enumerate(result.lanes):
        for dev in devs:
            tid += 1
            tids.setdefault(f"lane:{lane}", []).append((1, tid))
            trace.append({"ph": "M", "pid": 1, "tid": tid, "name": "thread_name", "args": {"name": dev}})
            trace.append({"ph": "M", "pid": 1, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}})
    comm_tracks = sorted({e.track for e in result.events if e.track.startswith("comm:")})
    for track in comm_tracks:
        lane = int(track.split(":", 1)[1])
        for dev in result.lanes[lane]:
            tid += 1
            tids.setdefault(track, []).append((1, tid))
            trace.append({"ph": "M", "pid": 1, "tid": tid, "name": "thread_name",
                          "args": {"name": f"{dev} all-reduce"}})
    return tids


def _link_rows(events: Sequence[Event]) -> tuple[dict[int, int], dict[str, int]]:
    """A link carries several flows at once when they share it: complete events on one
    thread must not overlap, so overlapping transfers go to extra rows "<link> (2)", ...
    Returns each link event's row (by its index in ``events``) and the rows per link track."""
    rows: dict[str, list[float]] = {}
    row_of: dict[int, int] = {}
    for i, e in enumerate(events):
        if e.track.startswith("link:"):
            ends = rows.setdefault(e.track, [])
            r = next((j for j, end in enumerate(ends) if end <= e.start + 1e-12), len(ends))
            if r == len(ends):
                ends.append(e.end)
            else:
                ends[r] = e.end
            row_of[i] = r
    return row_of, {track: len(ends) for track, ends in rows.items()}


def _link_threads(links: Sequence[str], n_rows: dict[str, int], trace: Trace) -> dict[tuple[str, int], int]:
    """Name a thread per row of each link (at least one); the tid of each (link track, row)."""
    link_tid: dict[tuple[str, int], int] = {}
    t = 0
    for link in links:
        for r in range(max(1, n_rows.get(f"link:{link}", 0))):
            t += 1
            link_tid[(f"link:{link}", r)] = t
            name = link if r == 0 else f"{link} ({r + 1})"
            trace.append({"ph": "M", "pid": 2, "tid": t, "name": "thread_name", "args": {"name": name}})
            trace.append({"ph": "M", "pid": 2, "tid": t, "name": "thread_sort_index", "args": {"sort_index": t}})
    return link_tid

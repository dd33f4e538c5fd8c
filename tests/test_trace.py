"""The Chrome trace export: threads per device, all-reduce stream and link row; events on them."""

from __future__ import annotations

from planner.simulate import DeviceResult, Event, SimResult
from planner.simulate.trace import chrome_trace


def result(events: list[Event]) -> SimResult:
    devices = tuple(DeviceResult(d, lane, 1.0, 1.0, 0, 1, 0, ()) for lane, d in enumerate(("a", "b")))
    return SimResult(schedule="gpipe", stages=2, microbatches=1, virtual_stages=1, iteration_s=2.0,
                     bubble_fraction=0.5, makespan_s=2.0, window=(0.0, 2.0), devices=devices,
                     lanes=(("a",), ("b", "c")), links=("L fwd", "M fwd"), events=tuple(events))


def threads(trace: dict[str, object]) -> dict[tuple[int, int], str]:
    evs = trace["traceEvents"]
    assert isinstance(evs, list)
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "thread_name"}


def test_overlapping_transfers_of_one_link_go_to_extra_rows() -> None:
    evs = [Event("link:L fwd", "act 0->1 #0", "act", 0, 0, 0.0, 2.0),
           Event("link:L fwd", "act 0->1 #1", "act", 0, 1, 1.0, 3.0),
           Event("link:L fwd", "act 0->1 #2", "act", 0, 2, 2.0, 4.0)]
    trace = chrome_trace(result(evs))
    assert threads(trace) == {(1, 1): "a", (1, 2): "b", (1, 3): "c", (2, 1): "L fwd", (2, 2): "L fwd (2)",
                              (2, 3): "M fwd"}
    xs = [(e["tid"], e["ts"], e["dur"]) for e in trace["traceEvents"] if e["ph"] == "X"]
    assert xs == [(1, 0.0, 2e6), (2, 1e6, 2e6), (1, 2e6, 2e6)]


def test_lane_events_go_to_every_device_of_the_lane_and_all_reduce_to_its_stream() -> None:
    evs = [Event("lane:1", "F0.0", "F", 1, 0, 0.0, 1.0), Event("comm:1", "AR 1", "AR", 1, -1, 1.0, 1.5)]
    trace = chrome_trace(result(evs))
    assert threads(trace)[(1, 4)] == "b all-reduce" and threads(trace)[(1, 5)] == "c all-reduce"
    xs = [(e["pid"], e["tid"], e["cat"], e["args"]) for e in trace["traceEvents"] if e["ph"] == "X"]
    assert xs == [(1, 2, "F", {"stage": 1, "microbatch": 0}), (1, 3, "F", {"stage": 1, "microbatch": 0}),
                  (1, 4, "AR", {"stage": 1, "microbatch": -1}), (1, 5, "AR", {"stage": 1, "microbatch": -1})]
    assert trace["otherData"] == {"schedule": "gpipe", "iteration_s": 2.0, "bubble_fraction": 0.5}
    assert (trace["kind"], trace["version"]) == ("trace", 1)  # as every JSON file planner writes

"""Schedules: generators, text form, validation, the text table, in-flight closed forms."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.errors import ScheduleError
from planner.schedule import (
    SCHEDULES,
    Action,
    Schedule,
    from_text,
    in_flight_microbatches,
    make_schedule,
    unit_slots,
    validate,
)

ks = st.integers(1, 9)
ms = st.integers(1, 20)
vs = st.integers(1, 4)


def test_action_text_round_trip() -> None:
    a = Action(2, "F", 0)
    assert str(a) == "2F0"
    assert Action.parse("2F0") == a
    assert Action.parse("12W345") == Action(12, "W", 345)
    with pytest.raises(ScheduleError, match="bad action"):
        Action.parse("F2")


def test_gpipe_is_f_then_b() -> None:
    sched = make_schedule("gpipe", 2, 3)
    assert sched.text() == [["0F0", "0F1", "0F2", "0B0", "0B1", "0B2"], ["1F0", "1F1", "1F2", "1B0", "1B1", "1B2"]]


def test_1f1b_order_matches_pipedream_flush() -> None:
    sched = make_schedule("1f1b", 4, 6)
    assert sched.text()[0] == ["0F0", "0F1", "0F2", "0F3", "0B0", "0F4", "0B1", "0F5", "0B2", "0B3", "0B4", "0B5"]
    assert sched.text()[3] == ["3F0", "3B0", "3F1", "3B1", "3F2", "3B2", "3F3", "3B3", "3F4", "3B4", "3F5", "3B5"]


def test_zb_h1_defers_w_by_device_index() -> None:
    sched = make_schedule("zb-h1", 3, 4)
    assert sched.split_backward
    assert sched.text()[0] == ["0F0", "0F1", "0F2", "0B0", "0W0", "0F3", "0B1", "0W1", "0B2", "0W2", "0B3", "0W3"]
    assert sched.text()[2] == ["2F0", "2B0", "2F1", "2B1", "2F2", "2B2", "2W0", "2F3", "2B3", "2W1", "2W2", "2W3"]


def test_interleaved_megatron_order() -> None:
    # K=2, v=2, M=4: chunk c on device c mod 2; groups of K micro-batches through chunk 0 then 1.
    sched = make_schedule("interleaved", 2, 4, 2)
    assert sched.chunks == 4
    dev0 = sched.text()[0]
    assert dev0[:4] == ["0F0", "0F1", "2F0", "2F1"]  # warm-up (K-0-1)*2 + (v-1)*K = 4
    assert dev0[4:6] == ["0F2", "2B0"]
    assert all(Action.parse(t).stage % 2 == 0 for t in dev0)


def test_interleaved_v1_is_1f1b() -> None:
    assert make_schedule("interleaved", 4, 8, 1).actions == make_schedule("1f1b", 4, 8).actions


def test_pipedream_runs_blocks_without_flush() -> None:
    sched = make_schedule("pipedream", 3, 2, pipedream_blocks=4)
    assert sched.total_microbatches == 8 and sched.blocks == 4
    assert sched.text()[0][:4] == ["0F0", "0F1", "0F2", "0B0"]  # warm-up once, then 1F1B across iterations


@given(ks, ms, st.integers(1, 4), st.integers(1, 3))
def test_pipedream_order_before_the_drain_does_not_depend_on_blocks(k: int, m: int, blocks: int, more: int) -> None:
    """The simulator stops a pipedream run after its measured iterations: that is exact
    because the trailing iterations only append to each device's order, never reorder it."""
    short = make_schedule("pipedream", k, m, pipedream_blocks=blocks)
    long = make_schedule("pipedream", k, m, pipedream_blocks=blocks + more)
    for a, b in zip(short.actions, long.actions, strict=True):
        last_f = max(i for i, x in enumerate(a) if x.kind == "F")
        assert a[:last_f + 1] == b[:last_f + 1]


def test_interleaved_with_fewer_microbatches_than_devices() -> None:
    sched = make_schedule("interleaved", 4, 2, 2)  # M < K: one short group of micro-batches
    assert sched.chunks == 8
    assert sched.text()[0][:4] == ["0F0", "0F1", "4F0", "4F1"]
    assert in_flight_microbatches("interleaved", 4, 2, 0, 2) == 4  # capped at M * v chunk micro-batches


@given(st.sampled_from(SCHEDULES), ks, ms, vs)
def test_every_generated_schedule_is_valid(name: str, k: int, m: int, v: int) -> None:
    sched = make_schedule(name, k, m, v if name == "interleaved" else 1)
    validate(sched)  # each action once, on its device, no deadlock
    n = sched.total_microbatches
    kinds = 3 if sched.split_backward else 2
    assert sum(len(a) for a in sched.actions) == sched.chunks * n * kinds
    for d, acts in enumerate(sched.actions):
        seen: set[Action] = set()
        for a in acts:
            assert a.stage % k == d
            if a.kind in "BW":
                assert Action(a.stage, "F", a.mb) in seen  # forward before its backward on the device
            if a.kind == "W":
                assert Action(a.stage, "B", a.mb) in seen
            seen.add(a)


def test_validate_rejects_duplicates_missing_wrong_device_and_deadlock() -> None:
    with pytest.raises(ScheduleError, match="twice"):
        from_text("x", [["0F0", "0F0", "0B0"]], 1)
    with pytest.raises(ScheduleError, match="misses action 0B1"):
        from_text("x", [["0F0", "0F1", "0B0"]], 2)
    with pytest.raises(ScheduleError, match="belongs to device 1"):
        from_text("x", [["0F0", "1F0", "0B0"], ["1B0"]], 1)
    with pytest.raises(ScheduleError, match="deadlocks"):
        from_text("x", [["0B0", "0F0"]], 1)
    with pytest.raises(ScheduleError, match="deadlocks"):  # 0B0 waits for 1B0, behind 1F1, which waits for 0F1
        from_text("x", [["0F0", "0B0", "0F1", "0B1"], ["1F1", "1F0", "1B0", "1B1"]], 2)
    with pytest.raises(ScheduleError, match="out of range"):
        from_text("x", [["0F0", "0W0", "0B0"]], 1)


def test_unknown_schedule_and_bad_sizes() -> None:
    with pytest.raises(ScheduleError, match="unknown schedule 'nope'"):
        make_schedule("nope", 2, 2)
    with pytest.raises(ScheduleError, match="microbatches must be a positive integer"):
        make_schedule("1f1b", 2, 0)
    with pytest.raises(ScheduleError, match="one chunk per device"):
        make_schedule("1f1b", 2, 2, 2)


def test_table_shows_bubbles_like_torch() -> None:
    table = make_schedule("1f1b", 2, 2).table()
    lines = table.splitlines()
    assert lines[0].split() == ["Dev", "0", "Dev", "1"]
    assert lines[1].split() == ["Step", "00:", "0F0"]
    assert lines[2].split() == ["Step", "01:", "0F1", "1F0"]
    assert lines[3].split() == ["Step", "02:", "1B0"]
    assert len(lines) == 1 + 6  # (M + K - 1) * 2 slots


def test_unit_slots_give_gpipe_closed_form() -> None:
    for k, m in ((4, 8), (3, 1), (1, 5)):
        slots = unit_slots(make_schedule("gpipe", k, m))
        assert 1 + max(max(s) for s in slots) == 2 * (m + k - 1)


def test_in_flight_closed_forms() -> None:
    assert in_flight_microbatches("gpipe", 4, 8, 2) == 8
    assert [in_flight_microbatches("1f1b", 4, 8, s) for s in range(4)] == [4, 3, 2, 1]
    assert in_flight_microbatches("1f1b", 4, 2, 0) == 2
    assert in_flight_microbatches("pipedream", 4, 2, 0) == 4  # no flush: the pipe stays full
    assert in_flight_microbatches("zb-h1", 4, 8, 3) == 4
    assert in_flight_microbatches("interleaved", 4, 8, 0, 2) == 11
    with pytest.raises(ScheduleError):
        in_flight_microbatches("nope", 4, 8, 0)


def test_schedule_is_immutable() -> None:
    sched = make_schedule("gpipe", 2, 2)
    assert isinstance(sched, Schedule)
    with pytest.raises(AttributeError):
        sched.name = "x"  # type: ignore[misc]

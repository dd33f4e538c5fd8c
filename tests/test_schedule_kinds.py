"""Schedule kinds: the registry, every attribute, the thin names over it, and that no module
outside planner.schedule compares schedule names."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.errors import ScheduleError
from planner.schedule import (
    SCHEDULE_KINDS,
    SCHEDULES,
    ScheduleKind,
    find_kind,
    from_text,
    in_flight_microbatches,
    make_schedule,
    schedule_kind,
    schedules_for,
    virtual_stage_schedules,
)


def test_registry_lists_the_five_schedules_in_cli_order() -> None:
    assert SCHEDULES == ("gpipe", "1f1b", "interleaved", "pipedream", "zb-h1")
    assert all(isinstance(k, ScheduleKind) and k.name == n for n, k in SCHEDULE_KINDS.items())


def test_unknown_name_is_a_schedule_error_listing_the_names() -> None:
    with pytest.raises(ScheduleError, match="unknown schedule 'nope'") as info:
        schedule_kind("nope")
    assert info.value.hint == "choose one of gpipe, 1f1b, interleaved, pipedream, zb-h1"
    assert find_kind("nope") is None
    kind = schedule_kind("1f1b")
    assert schedule_kind(kind) is kind


def test_attributes_of_each_kind() -> None:
    flags = {n: (k.flushes, k.stashes_weights, k.splits_weight_grad, k.phased, k.takes_virtual_stages)
             for n, k in SCHEDULE_KINDS.items()}
    assert flags == {"gpipe": (True, False, False, True, False), "1f1b": (True, False, False, False, False),
                     "interleaved": (True, False, False, False, True),
                     "pipedream": (False, True, False, False, False), "zb-h1": (True, False, True, False, False)}
    assert {n: k.torch_class for n, k in SCHEDULE_KINDS.items()} == {
        "gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved": "ScheduleInterleaved1F1B",
        "pipedream": None, "zb-h1": "ScheduleInterleavedZeroBubble"}
    assert [n for n, k in SCHEDULE_KINDS.items() if k.torch_stage_list] == ["interleaved", "zb-h1"]


def test_engine_support() -> None:
    assert schedules_for("deepspeed") == ("1f1b",)
    assert schedules_for("torch") == ("gpipe", "1f1b", "interleaved", "zb-h1")
    assert schedules_for("torchtitan") == schedules_for("torch")
    assert schedules_for("any") == SCHEDULES
    assert not schedule_kind("pipedream").runs_on("torch")
    assert virtual_stage_schedules() == ("interleaved",)


@given(st.sampled_from(SCHEDULES), st.integers(1, 6), st.integers(1, 12))
def test_make_follows_the_kind(name: str, k: int, m: int) -> None:
    kind = schedule_kind(name)
    sched = kind.make(k, m)
    assert sched == make_schedule(name, k, m)
    assert sched.kind is kind
    assert sched.split_backward == kind.splits_weight_grad
    assert sched.flushes == kind.flushes and sched.stashes_weights == kind.stashes_weights
    assert (sched.total_microbatches > m) == (not kind.flushes)  # only a schedule without flush spans iterations


def test_virtual_stages_only_where_taken() -> None:
    with pytest.raises(ScheduleError, match="one chunk per device") as info:
        schedule_kind("gpipe").make(2, 2, 2)
    assert info.value.hint == "use --schedule interleaved for virtual stages"
    assert schedule_kind("interleaved").make(2, 4, 2).chunks == 4


def test_custom_schedule_has_no_kind_and_flushes() -> None:
    sched = from_text("mine", [["0F0", "0B0"]], 1)
    assert sched.kind is None and sched.flushes and not sched.stashes_weights


def test_objective_weights() -> None:
    assert schedule_kind("gpipe").objective_weights(8) == (1.0, 7.0)
    assert schedule_kind("zb-h1").objective_weights(8) == (1.0, 7.0)
    assert schedule_kind("pipedream").objective_weights(8) == (0.0, 8.0)


def test_stash_bytes_on_ints_and_arrays() -> None:
    pd, f1 = schedule_kind("pipedream"), schedule_kind("1f1b")
    assert pd.stash_bytes(4, 100) == 300
    assert f1.stash_bytes(4, 100) == 0
    arr = np.array([1.0, 2.0])
    assert pd.stash_bytes(3, arr).tolist() == [2.0, 4.0]
    assert f1.stash_bytes(3, arr).tolist() == [0.0, 0.0]


def test_steady_busy_phased_and_not() -> None:
    gp, f1 = schedule_kind("gpipe"), schedule_kind("1f1b")
    assert gp.steady_busy(1.0, 2.0, 1.5) == 1.5 + 2.0  # max(f, x) + max(b, x)
    assert f1.steady_busy(1.0, 2.0, 1.5) == 3.0  # max(f + b, x)
    assert f1.steady_busy(1.0, 2.0, 4.0) == 4.0
    assert f1.steady_busy(1.0, 2.0, 0.0, total_s=3.5) == 3.5
    out = gp.steady_busy(np.array([1.0, 3.0]), np.array([2.0, 2.0]), np.array([1.5, 0.0]))
    assert out.tolist() == [3.5, 5.0]


def test_in_flight_thin_name_matches_the_kind() -> None:
    for name, kind in SCHEDULE_KINDS.items():
        v = 2 if kind.takes_virtual_stages else 1
        assert in_flight_microbatches(name, 4, 8, 1, v) == kind.in_flight_microbatches(4, 8, 1, v)


NAME_TEST = re.compile(r"""(==|!=|\bin)\s*\(?\s*["'](gpipe|1f1b|interleaved|pipedream|zb-h1)["']""")


def test_no_module_outside_planner_schedule_compares_schedule_names() -> None:
    root = Path(__file__).resolve().parents[1] / "planner"
    offenders = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("schedule/"):
            continue
        offenders += [f"{rel}:{i}" for i, line in enumerate(path.read_text().splitlines(), 1)
                      if NAME_TEST.search(line)]
    assert offenders == []


def test_a_kind_is_checked_when_made() -> None:
    base = SCHEDULE_KINDS["1f1b"]
    with pytest.raises(ScheduleError, match="unknown engines"):
        ScheduleKind("x", base.generator, base.in_flight, engines=frozenset({"jax"}))
    with pytest.raises(ScheduleError, match="torch_class None"):
        ScheduleKind("x", base.generator, base.in_flight, engines=frozenset({"torch"}))


def test_only_torchs_classes_bound_the_stages_by_the_micro_batches() -> None:
    """torch's Schedule1F1B needs a micro-batch per stage (engine_refusal, most_stages); DeepSpeed's 1F1B and torch's
    GPipe do not, and a bound of M refuses exactly the plans of more than M stages."""
    one = schedule_kind("1f1b")
    assert one.most_stages("torch", 4) == one.most_stages("torchtitan", 4) == 4
    assert one.most_stages("deepspeed", 4) is None and schedule_kind("gpipe").most_stages("torch", 4) is None
    for k in range(1, 9):
        assert (one.engine_refusal("torch", 4, k) is None) == (k <= 4)
        assert one.engine_refusal("deepspeed", 4, k) is None

"""Pipeline schedules (pure; no torch, click or rich): :mod:`planner.schedule.core` holds the
values (actions, per-device orders, validation), :mod:`planner.schedule.generators` the action orders,
:mod:`planner.schedule.kinds` the named
schedules as :class:`ScheduleKind` values (generator, micro-batches in flight, flush, weight
stashing, split weight gradient, phases, virtual stages, engines). Ask a kind with
``schedule_kind(name)``; ``SCHEDULES`` and ``in_flight_microbatches`` are thin names over it.
"""

from __future__ import annotations

from planner.schedule.core import KINDS, Action, Schedule, dependencies, from_text, unit_slots, validate
from planner.schedule.generators import gpipe, interleaved, interleaved_extra_warmup, one_f_one_b, pipedream, zb_h1
from planner.schedule.kinds import (
    ENGINES,
    SCHEDULE_KINDS,
    SCHEDULES,
    ScheduleKind,
    find_kind,
    in_flight_microbatches,
    make_schedule,
    schedule_kind,
    schedules_for,
    virtual_stage_schedules,
)

__all__ = [
    "ENGINES", "KINDS", "SCHEDULES", "SCHEDULE_KINDS", "Action", "Schedule", "ScheduleKind", "dependencies",
    "find_kind", "from_text", "gpipe", "in_flight_microbatches", "interleaved", "interleaved_extra_warmup",
    "make_schedule", "one_f_one_b", "pipedream", "schedule_kind", "schedules_for", "unit_slots", "validate",
    "virtual_stage_schedules", "zb_h1",
]

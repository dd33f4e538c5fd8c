"""Pipeline schedules as small immutable values (pure; no torch, click or rich).

A schedule is, per device, an ordered list of actions written ``<stage><F|B|W><microbatch>``
(``2F0``: stage 2, forward, micro-batch 0), after torch.distributed.pipelining's text form.
"""

from __future__ import annotations

from planner.errors import ScheduleError

SCHEDULES = ("gpipe", "1f1b", "interleaved", "pipedream", "zb-h1")


def in_flight_microbatches(schedule: str, stages: int, microbatches: int, stage: int, virtual_stages: int = 1) -> int:
    """Peak number of micro-batches whose activations stage ``stage`` holds at once.

    gpipe keeps all M (GPipe, Huang et al. 2019); 1f1b, pipedream and zb-h1 keep at most
    K - s on stage s (PipeDream-Flush, Narayanan et al. 2021); interleaved (Megatron,
    Narayanan et al. 2021, section 2.2) counts model chunks: device d warms up with
    (K - d - 1) * 2 + (v - 1) * K forwards plus the one in steady state.
    """
    k, m, s, v = stages, microbatches, stage, virtual_stages
    if schedule == "gpipe":
        return m
    if schedule in ("1f1b", "pipedream", "zb-h1"):
        return min(k - s, m)
    if schedule == "interleaved":
        device = s % k
        return min((k - device - 1) * 2 + (v - 1) * k + 1, m * v)
    raise ScheduleError(f"unknown schedule {schedule!r}", f"choose one of {', '.join(SCHEDULES)}")

"""Which micro-batch and stage counts an engine's schedule runs together, for the search (pure).

torch's interleaved and zero-bubble classes run M micro-batches on K pipeline ranks in rounds and refuse an M that
is not a multiple of ``max(1, M // K)`` (planner.schedule.kinds, ``ScheduleKind.engine_refusal``): 8 on 3 ranks
run, 16 and 32 do not. The stage DP does not track K for every M, so:

* with ``--config`` (K known) the micro-batch counts the engine refuses on K ranks are not searched
  (:func:`counts_for_config`), and a request of none but those is refused up front, with the counts that run;
* without it, where a plan the search ranked breaks that rule (:func:`count_refused`), the search is run again with
  each problem's stage count fixed to the counts its M runs on (:func:`exact_count_problems`: one problem per
  allowed K): the refused plans would otherwise take the places of runnable ones among those ranked (or all of
  them: an error where plans exist).
"""

from __future__ import annotations

from collections.abc import Sequence

from planner import ir
from planner.errors import UsageError
from planner.schedule import schedule_kind
from planner.search.framed import Framed


def counts_for_config(cands: Sequence[int], schedule: str, engine: str, config: Sequence[int] | None) -> list[int]:
    """The micro-batch counts of ``cands`` that ``engine`` runs under ``schedule`` on the ``len(config)`` stages of
    ``config`` (all of them without a config); UsageError, with the engine's reason, when it runs none."""
    if config is None:
        return list(cands)
    kind, k = schedule_kind(schedule), len(config)
    kept = [m for m in cands if kind.engine_refusal(engine, m, k) is None]
    if cands and not kept:
        reason = kind.engine_refusal(engine, cands[0], k) or ""
        raise UsageError(f"--config {'-'.join(map(str, config))} has {k} stages and --engine {engine} runs none of "
                         f"the micro-batch counts searched ({', '.join(map(str, cands[:8]))}"
                         f"{', ...' if len(cands) > 8 else ''}) on them: {reason}",
                         "choose --microbatches as it says, or another --config")
    return kept


def count_refused(plan: ir.Plan, engine: str) -> bool:
    """Whether ``engine`` refuses the plan's micro-batch count on its pipeline ranks."""
    kind = schedule_kind(plan.schedule)
    return kind.engine_refusal(engine, plan.microbatches, plan.pipeline_stages, plan.virtual_stages) is not None


def exact_count_problems(framed: Sequence[Framed], engine: str) -> list[Framed]:
    """Each problem once per stage count its plans may have that its engine runs with its micro-batch count
    (``Framed.with_stages(exact=K)``); a problem whose count is already fixed stays if the engine runs it."""
    out = []
    for frame in framed:
        kind = schedule_kind(frame.schedule)
        if frame.exact_k is not None:
            ks = [frame.exact_k]
        else:
            ks = list(range(max(frame.min_stages, 1), frame.most_stages() + 1))
        out += [frame.with_stages(exact=k, least=frame.min_stages) for k in ks
                if kind.engine_refusal(engine, frame.microbatches, k) is None]
    return out

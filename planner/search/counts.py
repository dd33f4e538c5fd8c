"""Which micro-batch counts the search tries, and which stage counts an engine's schedule runs with them (pure).

``--microbatches auto`` tries every divisor of the batch (:func:`microbatch_candidates`) up to
:data:`MAX_AUTO_MICROBATCHES`: the simulator's time grows with M, and a prime batch of ten million samples offered
only 1 and ten million, which kept a search running for hours; a count above it is searched when given.

torch's interleaved and zero-bubble classes run M micro-batches on K pipeline ranks in rounds and refuse an M that
is not a multiple of ``max(1, M // K)`` (planner.schedule.kinds, ``ScheduleKind.engine_refusal``): 8 on 3 ranks
run, 16 and 32 do not; with v > 1 chunks a rank, ScheduleInterleaved1F1B also runs the order simulated only where
its rounds are K long or M is below K (4 on 3 ranks does not). The stage DP does not track K for every M, so:

* with ``--config`` (K known) the micro-batch counts the engine refuses on K ranks are not searched
  (:func:`counts_for_config`), and a request of none but those is refused up front, with the counts that run;
* without it, where a plan the search ranked breaks that rule (:func:`count_refused`), the search is run again with
  each problem's stage count fixed to the counts its M runs on (:func:`exact_count_problems`: one problem per
  allowed K): the refused plans would otherwise take the places of runnable ones among those ranked (or all of
  them: an error where plans exist); where that search finds no plan, :func:`refused_error` says which counts the
  refused plans had and which run.

The chunks a rank runs (``--virtual-stages``) reach these rules through :data:`CHUNKS`: the interleaved search
(planner.search.interleave) searches its K-stage plans with one chunk a rank, and judges them with v.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar

from planner import ir
from planner.errors import InfeasibleError, UsageError
from planner.schedule import schedule_kind
from planner.search.framed import Framed
from planner.search.layout import divisors

MAX_AUTO_MICROBATCHES = 4096
"""The most micro-batches ``auto`` tries (module doc); published runs took up to a few hundred a pipeline (SC'21's
1T model: 512 on 64 stages)."""

CHUNKS: ContextVar[int] = ContextVar("CHUNKS", default=1)


def microbatch_candidates(batch_size: int, microbatches: int | str, micro_batch_size: int | None = None) -> list[int]:
    """Micro-batch counts to search: ``auto`` every divisor of the batch (of ``batch / micro_batch_size``
    when that is fixed) up to :data:`MAX_AUTO_MICROBATCHES`, else the number, which must divide the batch."""
    if micro_batch_size is not None:
        if micro_batch_size <= 0 or batch_size % micro_batch_size:
            raise UsageError(f"--micro-batch-size {micro_batch_size} does not divide the batch size {batch_size}",
                             f"use a divisor of {batch_size}")
        per = batch_size // micro_batch_size
        if microbatches != "auto":
            if not isinstance(microbatches, int) or isinstance(microbatches, bool) or per % microbatches:
                raise UsageError(f"--microbatches {microbatches} x --micro-batch-size {micro_batch_size} does not "
                                 f"divide the batch {batch_size} into whole data-parallel ranks",
                                 f"use --microbatches among {list(divisors(per)[:12])} or 'auto'")
            return [int(microbatches)]
        return [m for m in divisors(per) if m <= MAX_AUTO_MICROBATCHES]
    if microbatches == "auto":
        return [m for m in divisors(batch_size) if m <= MAX_AUTO_MICROBATCHES]
    if not isinstance(microbatches, int) or isinstance(microbatches, bool) or microbatches <= 0:
        raise UsageError(f"--microbatches must be a positive integer or 'auto', got {microbatches!r}",
                         "e.g. --microbatches 4")
    if batch_size % microbatches:
        raise UsageError(f"--microbatches {microbatches} does not divide the batch size {batch_size}",
                         f"use a divisor of {batch_size}, or 'auto'")
    return [microbatches]
"""The model chunks a pipeline rank will run the plans searched with (set by planner.search.interleave while it
searches the K-stage plans it re-cuts into K * v chunks); 1 otherwise."""


def refusal(schedule: str, engine: str, microbatches: int, stages: int, chunks: int = 1) -> str | None:
    """Why ``engine`` refuses M micro-batches of ``schedule`` on ``stages`` pipeline ranks of ``chunks`` chunks each
    (:data:`CHUNKS` where 1: the plans the interleaved search re-cuts), or None (``ScheduleKind.engine_refusal``)."""
    v = CHUNKS.get() if chunks == 1 else chunks
    return schedule_kind(schedule).engine_refusal(engine, microbatches, stages, v)


def running_counts(cands: Sequence[int], schedule: str, engine: str, stages: int) -> list[int]:
    """The micro-batch counts of ``cands`` that ``engine`` runs under ``schedule`` on ``stages`` pipeline ranks."""
    return [m for m in cands if refusal(schedule, engine, m, stages) is None]


def _which_run(allowed: Sequence[int], schedule: str, engine: str, stages: int) -> str:
    """A hint's words for the counts of ``allowed`` (those the batch allows) that run on ``stages`` ranks."""
    runs = running_counts(allowed, schedule, engine, stages)
    if not runs:
        return "choose --microbatches as the reason says"
    shown = ", ".join(map(str, runs[:8])) + (", ..." if len(runs) > 8 else "")
    return f"the counts the batch allows that run on {stages} pipeline ranks: --microbatches {shown}"


def counts_for_config(cands: Sequence[int], schedule: str, engine: str, config: Sequence[int] | None,
                      allowed: Sequence[int] = ()) -> list[int]:
    """The micro-batch counts of ``cands`` that ``engine`` runs under ``schedule`` on the ``len(config)`` stages of
    ``config`` (all of them without a config); UsageError, with the engine's reason and the counts of ``allowed``
    (every count the batch allows) that run, when it runs none."""
    if config is None:
        return list(cands)
    k = len(config)
    kept = running_counts(cands, schedule, engine, k)
    if cands and not kept:
        reason = refusal(schedule, engine, cands[0], k) or ""
        raise UsageError(f"--config {'-'.join(map(str, config))} has {k} stages and --engine {engine} runs none of "
                         f"the micro-batch counts searched ({', '.join(map(str, cands[:8]))}"
                         f"{', ...' if len(cands) > 8 else ''}) on them: {reason}",
                         f"{_which_run(allowed or cands, schedule, engine, k)}; or choose another --config")
    return kept


def count_refused(plan: ir.Plan, engine: str) -> bool:
    """Whether ``engine`` refuses the plan's micro-batch count on its pipeline ranks."""
    return refusal(plan.schedule, engine, plan.microbatches, plan.pipeline_stages, plan.virtual_stages) is not None


def exact_count_problems(framed: Sequence[Framed], engine: str) -> list[Framed]:
    """Each problem once per stage count its plans may have that its engine runs with its micro-batch count
    (``Framed.with_stages(exact=K)``); a problem whose count is already fixed stays if the engine runs it."""
    out = []
    for frame in framed:
        if frame.exact_k is not None:
            ks = [frame.exact_k]
        else:
            ks = list(range(max(frame.min_stages, 1), frame.most_stages() + 1))
        out += [frame.with_stages(exact=k, least=frame.min_stages) for k in ks
                if refusal(frame.schedule, engine, frame.microbatches, k) is None]
    return out


def refused_error(refused: ir.Plan, engine: str, failure: InfeasibleError, allowed: Sequence[int]) -> InfeasibleError:
    """The error of a search whose plans on the stage counts its engine runs (``failure``) found none, where
    ``refused`` (a plan it ranked) fits but the engine refuses its micro-batch count on its stages: both said, and
    the counts that do run there."""
    k = refused.pipeline_stages
    reason = refusal(refused.schedule, engine, refused.microbatches, k, refused.virtual_stages) or ""
    return InfeasibleError(f"{failure.cause} (on the stage counts --engine {engine} runs the micro-batch counts "
                           f"searched on); the plans found on {k} stages ({refused.config}, {refused.microbatches} "
                           f"micro-batches) it refuses: {reason}",
                           f"{_which_run(allowed, refused.schedule, engine, k)}; else {failure.hint}",
                           failure.needed_bytes)

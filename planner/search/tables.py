"""The stage DP's tables: per grid, link and option, every stage range's period, max term and memory fit.

Pure (numpy). For an option (fastest or leanest HPP forms, a recomputation mode and a ZeRO
stage; planner.search.space) and a stage [a, b) on a grid receiving over a link:

- period ``l = t + 2 x`` (its forward+backward per micro-batch plus the transfer it receives
  on the way in and its gradient on the way out: fill and drain);
- max term ``b * busy + sync``: ``busy = max(t, x)`` (transfers overlap compute in steady
  state), or ``max(f, x) + max(t - f, x)`` under gpipe's separate forward and backward
  phases (GPipe section 2.2); ``sync`` the gradient synchronisation per iteration;
- memory: static bytes + micro-batches in flight x activations + workspace + pipedream's
  stashed weight versions + tied-weight copies, against the grid's smallest device memory,
  as ``rmax``, the largest stages-left count it fits with.

The objective ``T = a * sum_s l_s + max_s term_s`` and the exact descent over the max term
are in :mod:`planner.search.sp`.
"""

from __future__ import annotations

import numpy as np

from planner.schedule import schedule_kind
from planner.search.space import Candidate, Problem, in_flight_counts, option_cost, options, p2p_times, tie_copies


def build_candidates(prob: Problem) -> None:
    """Per (grid, link) used by a move: periods, terms and memory limits of every option and range."""
    prob.cand.clear()
    r_hi = prob.stages_exact if prob.stages_exact is not None else prob.r_cap
    in_fl = in_flight_counts(prob, r_hi)
    ties = tie_copies(prob)
    used = {(mv.key, mv.link) for row in prob.moves for mv in row}
    recv_of = {(link, dp): p2p_times(prob, link, dp)[:, None]
               for link, dp in {(k[1], prob.grids[k[0]].dp) for k in used}}
    for key, link in sorted(used):
        cap = prob.grids[key].group.memory_bytes if prob.capacity_override is None else prob.capacity_override
        opts = options(prob, key)
        cand = Candidate(opts, [], [], [])
        for opt in opts:
            t, v = option_cost(prob, key, opt)
            period, term = _period_and_term(prob, v, recv_of[(link, prob.grids[key].dp)])
            cand.period.append(period)
            cand.term.append(term)
            cand.rmax.append(_fit_limit(prob, v, t.agg["weight"], ties, cap, in_fl, np.isfinite(period)))
        _drop_dominated(cand)
        cand.make_band()
        prob.cand[(key, link)] = cand
    # the stages-left count matters only up to 1 + the largest limit below the cap
    limits = [int(np.max(arr, initial=0, where=(arr >= 1) & (arr < r_hi))) for c in prob.cand.values()
              for arr in c.rmax]
    prob.r_eff = r_hi if prob.stages_exact is not None else min(r_hi, 1 + max(limits, default=0))


def _drop_dominated(cand: Candidate) -> None:
    """Remove (in place) the options another one beats everywhere: period and max term no larger and
    memory fitting at least as many stages left, for every stage range (of equal ones the first stays).
    The DP takes, per range, the least period among the options that fit under the cap, so a dominated
    option never decides a plan's objective: the optimum is unchanged."""
    n = len(cand.options)

    def beats(j: int, i: int) -> bool:
        return bool(np.all(cand.period[j] <= cand.period[i]) and np.all(cand.term[j] <= cand.term[i])
                    and np.all(cand.rmax[j] >= cand.rmax[i]))

    keep = [i for i in range(n) if not any(j != i and beats(j, i) and (j < i or not beats(i, j)) for j in range(n))]
    for name in ("options", "period", "term", "rmax"):
        values = getattr(cand, name)
        setattr(cand, name, [values[i] for i in keep])


def _period_and_term(prob: Problem, v: object, recv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    time, fwd = _with_engine(prob, v.time, v.fwd)  # type: ignore[attr-defined]
    sync = v.sync + prob.overhead.per_step_s  # type: ignore[attr-defined]
    period = time + 2.0 * recv
    with np.errstate(invalid="ignore"):
        busy = schedule_kind(prob.schedule).steady_busy(fwd, time - fwd, recv, time)
        term = np.where(np.isfinite(period), prob.b * busy + sync, np.inf)
    return period, term


def _with_engine(prob: Problem, time: np.ndarray, fwd: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per micro-batch, what the plan's engine adds to a stage [a, b) (planner.costmodel.engine.charge):
    each action, and a send where a stage follows (its forward) or precedes (its backward)."""
    o = prob.overhead
    if o.is_zero:
        return time, fwd
    idx = np.arange(prob.nb + 1)
    before = (idx > 0)[:, None].astype(float)  # a > 0: a stage precedes
    after = (idx < prob.nb)[None, :].astype(float)  # b < nb: a stage follows
    actions = 3 if schedule_kind(prob.schedule).splits_weight_grad else 2
    return (time + actions * o.per_action_s + o.per_microbatch_s * (before + after),
            fwd + o.per_action_s + o.per_microbatch_s * after)


def _fit_limit(prob: Problem, v: object, weight: np.ndarray, ties: np.ndarray, cap: float, in_fl: list[int],
               finite: np.ndarray) -> np.ndarray:
    """Per stage range: the largest stages-left count r (1..) whose in-flight micro-batches fit ``cap``."""
    static = np.ceil(v.static) + ties  # type: ignore[attr-defined]
    act, work, wt = np.ceil(v.act), np.ceil(v.workspace), np.ceil(weight)  # type: ignore[attr-defined]
    if schedule_kind(prob.schedule).stashes_weights:  # one weight version per extra micro-batch in flight
        static, act = static - wt, act + wt
    counts = np.asarray(in_fl)
    if np.all(np.diff(counts) >= 0):  # memory grows with r: rmax = how many counts fit
        with np.errstate(divide="ignore", invalid="ignore"):
            k_max = np.where(act > 0, np.floor((cap - static - work) / np.where(act > 0, act, 1.0)),
                             np.where(static + work <= cap, np.inf, -1.0))
        rmax = np.searchsorted(counts, k_max, side="right").astype(np.int64)
        exact = static + np.take(counts, np.maximum(rmax - 1, 0)) * act + work <= cap  # guard rounding
        rmax = np.where((rmax > 0) & ~exact, rmax - 1, rmax)
    else:
        rmax = np.zeros(np.broadcast(static, act).shape, dtype=np.int64)
        for r, k in enumerate(in_fl, start=1):
            rmax = np.where((static + k * act + work <= cap) & (rmax == r - 1), r, rmax)
    return np.where(finite, rmax, 0)

"""The descent over the stage DP's max term: an exact branch and bound over caps.

Pure (numpy). :func:`planner.search.sp.solve_cap` gives, for a cap C, the least sum of
periods S(C) over plans whose every term is <= C, and such a plan. The objective is
``T = a * S + max term``. Starting from C = inf, if the best plan has max term m, any better
plan has its max below m; with a = 0 (pipedream) the smallest feasible cap wins.

The caps are searched over the sorted candidate values of the max term
(:func:`planner.search.bounds.candidate_terms`). An open interval [lo, hi] of candidate
indices carries S, a lower bound on the sum of periods of any plan whose max term lies in
it, so every such plan costs at least ``a*S + vals[lo]``; intervals are opened best bound
first. Solving at cap vals[c] (lo <= c <= hi) gives the least sum S' of plans with max <=
vals[c] and a plan whose max is vals[t] (t <= c): plans with max in [t, c] cost at least the
plan's own objective, [lo, t-1] gets bound S', [c+1, hi] keeps S. It stops when the smallest
bound cannot beat the best plan (or another problem's best, the ``incumbent``: the search's
optimum is unchanged). The first interval starts at a lower bound on any plan's max term
(:func:`planner.search.bounds.lower_bound_top`).

Where to cut an interval: at its top, trimmed to the values that can still beat the best
(a plan with max term v costs at least ``a*S + v``), one solve gives the least sum under the
whole interval and often closes it; at its middle (bisection), the solves stay logarithmic
where the least sum grows in many small steps. The lower part of an interval cut at its top
is bisected next; every other new interval is cut at its top. The search
(planner.search.collect.collect) solves its problems best unconstrained plan first (of those whose lower
bound, planner.search.framed, is below the best unconstrained plan's objective; the others after,
best bound first), so that a good incumbent closes the others early. Measured (candidates=0,
scripts/bench_search.py's cases): the 80-block decoder on 1024 GPUs took 16 solves where
bisection alone in micro-batch order took 44 (8.4 s against 11.5 s of CPU), on 128 GPUs 21
against 59; 200 layers x 64 GPUs 37 against 42.

Memory depends on the stages-left count, which the DP tracks up to ``r_eff`` (up to M under
1f1b). :func:`solve` first tracks :data:`RELAXED_STAGES` counts, holding a stage with more
stages left to that count's memory -- a relaxation whose optimum is exact when its plan fits
with its true counts; else the count doubles.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from planner.search.bounds import candidate_terms, lower_bound_top
from planner.search.sp import Problem, Solution, solve_cap

__all__ = ["RELAXED_STAGES", "Opening", "fits", "open_problem", "solve"]

RELAXED_STAGES = 4
"""The stages-left count the DP first tracks exactly (:func:`solve`); doubled while it is not enough."""

_Interval = tuple[float, int, int, float, bool]
"""An open interval of candidate max-term indices: (bound on the objective, lo, hi, bound S on the sum,
whether to cut it at its top rather than its middle)."""


@dataclass(frozen=True)
class Opening:
    """A problem's unconstrained plan (cap = inf) at the first stages-left count :func:`solve` tracks:
    the least sum of periods, and an upper bound on the problem's optimum (None: nothing fits)."""

    r_top: int
    solution: Solution | None


def open_problem(prob: Problem) -> Opening:
    """The first solve of :func:`solve`, made ahead (the search orders its problems by it)."""
    r_top = _first_r_top(prob)
    return Opening(r_top, solve_cap(prob, math.inf, r_top))


def _first_r_top(prob: Problem) -> int:
    return RELAXED_STAGES if prob.stages_exact is None else prob.r_eff


def fits(prob: Problem, sol: Solution) -> bool:
    """Whether every stage of ``sol`` fits with its true stages-left count (K - s), and K is within the
    problem's bound on stages (a relaxed solve may meet more)."""
    k = len(sol.stages)
    if prob.stages_max is not None and k > prob.stages_max:
        return False
    for s, ch in enumerate(sol.stages):
        c = prob.cand[(ch.move.key, ch.move.link)]
        if c.rmax[c.options.index(ch.option)][ch.a, ch.b] < k - s:
            return False
    return True


def solve(prob: Problem, max_solves: int = 10_000, progress: Callable[[int, float], None] | None = None,
          pool: list[Solution] | None = None, incumbent: float = math.inf,
          opening: Opening | None = None) -> Solution | None:
    """The exact optimum of the objective over the problem's space (None: nothing fits).

    The DP's cost grows with the stages-left counts it tracks (``prob.r_eff``, up to the
    micro-batch count under 1f1b). It first tracks :data:`RELAXED_STAGES` of them, holding a
    stage with more stages left to that count's memory: a relaxation (memory only grows with
    the count), so its optimum is a lower bound, and the optimum itself when that plan fits
    with its true counts -- the usual case, as plans of more stages than that are rare. Else
    the count doubles, up to ``r_eff`` (exact). Plans met that do not fit are not pooled.
    ``incumbent`` (the best objective of the search's other problems) closes intervals that
    cannot beat it: the result is then this problem's optimum when that is below the
    incumbent, else a plan no better than the incumbent. ``opening``: :func:`open_problem`'s
    result for this problem, when made ahead.
    """
    r_top = _first_r_top(prob)
    while True:
        met: list[Solution] = []
        first = opening.solution if opening is not None and opening.r_top == r_top else \
            solve_cap(prob, math.inf, r_top)
        best = _descend(prob, r_top, first, max_solves, progress, met, incumbent)
        if r_top >= prob.r_eff or best is None or fits(prob, best):
            if pool is not None:
                pool.extend(x for x in met if r_top >= prob.r_eff or fits(prob, x))
            return best
        r_top *= 2


def _descend(prob: Problem, r_top: int, first: Solution | None, max_solves: int,
             progress: Callable[[int, float], None] | None, met: list[Solution], incumbent: float
             ) -> Solution | None:
    """Branch and bound over the max term at stages-left bound ``r_top`` from the unconstrained plan
    ``first`` (module doc). Every plan met is appended to ``met``."""
    if first is None:
        return None
    met.append(first)
    vals = candidate_terms(prob)
    heap = _first_interval(prob, vals, first)
    best, solves = first, 1
    while heap and solves < max_solves:
        bound, lo, hi, s_lo, at_top = heapq.heappop(heap)
        limit = min(best.objective, incumbent)
        if bound >= limit:
            break
        if progress:
            progress(solves, best.objective)
        if at_top:
            hi = cut = _trim(prob, vals, lo, hi, s_lo, limit)
        else:
            cut = (lo + hi) // 2
        sol = solve_cap(prob, float(vals[cut]), r_top)
        solves += 1
        if sol is not None:
            met.append(sol)
            best = sol if sol.objective < best.objective else best
        _push_intervals(heap, prob, vals, (lo, cut, hi), s_lo, sol, at_top)
    return best


def _trim(prob: Problem, vals: np.ndarray, lo: int, hi: int, s_lo: float, limit: float) -> int:
    """The interval's last index worth solving: a plan with max term vals[j] costs at least
    ``a * s_lo + vals[j]``, so no j where that reaches ``limit`` beats the best (vals[lo] does not)."""
    worth = prob.a * s_lo + vals[lo:hi + 1] < limit
    return lo + max(int(np.count_nonzero(worth)), 1) - 1


def _push_intervals(heap: list[_Interval], prob: Problem, vals: np.ndarray, cut_at: tuple[int, int, int],
                    s_lo: float, sol: Solution | None, at_top: bool) -> None:
    """After solving [lo, hi] at cap vals[cut]: [lo, t-1] bounded by the plan's sum (its max is vals[t]),
    bisected next if this cut was at the top; [cut+1, hi] keeping the interval's bound (module doc)."""
    lo, cut, hi = cut_at
    if sol is not None:
        t = int(np.searchsorted(vals, sol.top))
        if lo <= t - 1:
            heapq.heappush(heap, (prob.a * sol.total + float(vals[lo]), lo, t - 1, sol.total, not at_top))
    if cut + 1 <= hi:
        heapq.heappush(heap, (prob.a * s_lo + float(vals[cut + 1]), cut + 1, hi, s_lo, True))


def _first_interval(prob: Problem, vals: np.ndarray, first: Solution) -> list[_Interval]:
    """The open interval below the unconstrained plan's max term, from the lower bound on any plan's max."""
    lo0 = int(np.searchsorted(vals, lower_bound_top(prob, vals)))
    top_idx = int(np.searchsorted(vals, first.top))
    if lo0 > top_idx - 1:
        return []
    return [(prob.a * first.total + float(vals[lo0]), lo0, top_idx - 1, first.total, True)]

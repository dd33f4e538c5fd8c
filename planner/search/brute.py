"""Exhaustive search over the same space and cost model as the stage DP (small inputs only).

Enumerates every sequence of stages the DP's space allows (layer ranges between block
boundaries, groups from the same moves, skips of unused devices, recomputation or not per
stage), keeps those that fit each device's memory given the micro-batches in flight for
their position, and scores them with the same objective. It reads the same tables as
:mod:`planner.search.sp`, so ``dp == brute`` checks the DP's optimisation, not a second
cost model.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from planner.errors import UsageError
from planner.search.sp import Move, Problem, Solution, StageChoice, _solution

MAX_PLANS = 200_000
"""Inputs whose space holds more (partition, groups) sequences than this are refused."""


def count_plans(prob: Problem) -> int:
    """How many (layer partition, group sequence) plans the space holds (recompute aside)."""
    nb, g_total = prob.nb, prob.devices
    memo: dict[tuple[int, int], int] = {}

    def count(d: int, a: int) -> int:
        if a == nb:
            return 1
        if d >= g_total:
            return 0
        key = (d, a)
        if key in memo:
            return memo[key]
        total = count(prob.skip[d], a)
        for mv in prob.moves[d]:
            for b in range(a + 1, nb + 1):
                total += count(mv.next, b)
                if total > 10 * MAX_PLANS:
                    break
        memo[key] = total
        return total

    return count(0, 0)


def _sequences(prob: Problem, d: int, a: int) -> Iterator[list[tuple[int, int, Move]]]:
    """Every stage sequence from free device d and block a: lists of (a, b, move)."""
    if a == prob.nb:
        yield []
        return
    if d >= prob.devices:
        return
    yield from _sequences(prob, prob.skip[d], a)
    for mv in prob.moves[d]:
        for b in range(a + 1, prob.nb + 1):
            for rest in _sequences(prob, mv.next, b):
                yield [(a, b, mv), *rest]


def brute(prob: Problem, pool: list[Solution] | None = None) -> Solution | None:
    """The best plan by enumeration (None: nothing fits); UsageError when the space is too big.

    ``pool`` receives every other plan enumerated, for re-ranking by the simulator (as the
    DP's branch-and-bound visits do).
    """
    n = count_plans(prob)
    if n > MAX_PLANS:
        raise UsageError(f"--solver brute: the search space holds more than {MAX_PLANS} plans (about {n})",
                         "use --solver dp, or fewer layers/GPUs")
    best: Solution | None = None
    seen_sequences: set[tuple] = set()
    for seq in _sequences(prob, 0, 0):
        k = len(seq)
        if (prob.stages_exact is not None and k != prob.stages_exact) or k > (prob.stages_max or k):
            continue
        if prob.config is not None and any(len(mv.devices) != prob.config[s] for s, (_, _, mv) in enumerate(seq)):
            continue
        sig = tuple((a, b, mv.devices, mv.tp) for a, b, mv in seq)
        if sig in seen_sequences:  # skips reaching the same groups twice
            continue
        seen_sequences.add(sig)
        options: list[list[StageChoice]] = []
        for s, (a, b, mv) in enumerate(seq):
            r = k - s
            opts = _stage_options(prob, a, b, mv, min(r, prob.r_eff) if prob.stages_exact is None else r)
            if not opts:
                break
            options.append(opts)
        else:
            for choice in _product(options):
                sol = _solution(prob, choice)
                if pool is not None:
                    pool.append(sol)
                if best is None or sol.objective < best.objective:
                    best = sol
    return best


def _stage_options(prob: Problem, a: int, b: int, mv: Move, r: int) -> list[StageChoice]:
    """Every option of stage [a, b) on ``mv`` that fits with r stages left."""
    c = prob.cand[(mv.key, mv.link)]
    return [StageChoice(a, b, mv, opt, float(c.period[i][a, b]), float(c.term[i][a, b]))
            for i, opt in enumerate(c.options) if c.rmax[i][a, b] >= r and math.isfinite(c.period[i][a, b])]


def _product(options: list[list[StageChoice]]) -> Iterator[list[StageChoice]]:
    if not options:
        yield []
        return
    for first in options[0]:
        for rest in _product(options[1:]):
            yield [first, *rest]

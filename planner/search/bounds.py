"""Lower bounds and candidate values of the stage DP's max term (planner.search.sp's branch and bound).

Pure (numpy). Every bound holds for every plan of the problem's space, so the descent that
uses them stays exact: the worst-covered block's least term (:func:`_cover_bound`), and the
device budget (:func:`_budget_bound`): stages use disjoint devices, so no plan's max term is
below the least cap under which stages can cover every block with no more devices than the
cluster has (placement rules only add limits, memory is tested at one stage left, the least).
"""

from __future__ import annotations

import numpy as np

from planner.search.space import Problem


def lower_bound_top(prob: Problem, vals: np.ndarray) -> float:
    """A lower bound on the max term of any plan (the larger of two, see :func:`_cover_bound` and
    :func:`_budget_bound`)."""
    tmin = _least_terms(prob)
    return max(_cover_bound(tmin), _budget_bound(prob, tmin, vals))


def _least_terms(prob: Problem) -> dict[int, np.ndarray]:
    """Per group width: the least term of a stage [a, b) on any grid of that width, any option that fits."""
    out: dict[int, np.ndarray] = {}
    for (key, _), c in prob.cand.items():
        w = prob.grids[key].group.n
        cur = out.setdefault(w, np.full((prob.nb + 1, prob.nb + 1), np.inf))
        for term, rmax in zip(c.term, c.rmax, strict=True):
            np.minimum(cur, np.where(rmax >= 1, term, np.inf), out=cur)
    return out


def _cover_bound(tmin: dict[int, np.ndarray]) -> float:
    """The block every plan must cover worst: max over blocks x of the least term of a stage holding x."""
    if not tmin:
        return 0.0
    least = np.minimum.reduce(list(tmin.values()))
    nb = least.shape[0] - 1
    suffix = np.minimum.accumulate(least[:, ::-1], axis=1)[:, ::-1]  # min over b' >= b
    cum = np.minimum.accumulate(suffix, axis=0)  # min over a' <= a
    return max((float(cum[x, x + 1]) for x in range(nb)), default=0.0)


def _budget_bound(prob: Problem, tmin: dict[int, np.ndarray], vals: np.ndarray) -> float:
    """The least cap T whose stages (every term <= T) can cover the blocks with no more devices than
    the cluster has: stages use disjoint devices, so no plan's max term is below it. Bisection over
    the candidate terms; a stage's width is its grid's device count (placement rules only add limits)."""
    if not tmin or vals.size == 0:
        return 0.0
    widths = np.array(sorted(tmin), dtype=float)
    stack = np.stack([tmin[int(w)] for w in widths])
    lo, hi = 0, vals.size - 1
    if _least_devices(stack, widths, float(vals[hi])) > prob.devices:
        return float(vals[hi])
    while lo < hi:
        mid = (lo + hi) // 2
        if _least_devices(stack, widths, float(vals[mid])) <= prob.devices:
            hi = mid
        else:
            lo = mid + 1
    return float(vals[lo])


def _least_devices(stack: np.ndarray, widths: np.ndarray, cap: float) -> float:
    """The fewest devices that cover every block with stages whose term is <= ``cap`` (a DP over blocks)."""
    wmin = np.where(stack <= cap, widths[:, None, None], np.inf).min(axis=0)  # [a, b]
    nb = wmin.shape[0] - 1
    f = np.full(nb + 1, np.inf)
    f[nb] = 0.0
    for a in range(nb - 1, -1, -1):
        f[a] = float(np.min(wmin[a, a + 1:] + f[a + 1:]))
    return float(f[0])


def candidate_terms(prob: Problem) -> np.ndarray:
    """Every value a stage's max term can take in this problem, sorted and unique."""
    parts = []
    for c in prob.cand.values():
        for term, rmax in zip(c.term, c.rmax, strict=True):
            parts.append(term[(rmax >= 1) & np.isfinite(term)])
    return np.unique(np.concatenate(parts)) if parts else np.zeros(0)

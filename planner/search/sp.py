"""SP, Algorithm 2 of PipePar: contiguous stages on device grids, the DP under a cap on the max term.

The space (groups, tensor degrees, forms, recomputation and ZeRO options) is tabulated by
:mod:`planner.search.space` and :mod:`planner.search.tables`; this module solves it for one
cap, and :mod:`planner.search.descent` searches the caps.

``T = a * sum_s l_s + max_s(b * max(c_s, x_s) + sync_s)`` (planner.costmodel.analytic_iteration).
For a cap C on the max term, a backward DP over (stages left, next free device, first layer)
gives the least ``sum_s l_s`` of plans whose every term is <= C (Alpa, Zheng et al. OSDI'22,
section 5.2); each stage takes the option (forms, recomputation, ZeRO stage) with the least
period among those that fit and whose term is under the cap, which is exact because a
stage's option changes only its own period, term and memory.

Memory depends on the stages-left count, which the DP tracks up to ``r_eff`` (up to M under
1f1b); :func:`solve_cap` may track fewer, ``r_top``, holding a stage with more stages left to
``r_top``'s memory (a relaxation, see :func:`planner.search.descent.solve`). Under a bound on the
stage count (``Problem.stages_max``) the top row at the bound counts exactly that many stages, so
no plan of more is met; below the bound it is the same relaxation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from planner.errors import PlanError
from planner.search.framed import build_problem
from planner.search.space import Move, MoveGroup, Option, Problem, coarse_bounds

__all__ = ["Move", "Problem", "Solution", "StageChoice", "build_problem", "coarse_bounds", "infeasible", "solve_cap"]


@dataclass(frozen=True)
class StageChoice:
    """One stage of a solution: layer block range [a, b), its move (devices, tensor degree) and option
    (fastest or leanest forms, recomputation, ZeRO stage)."""

    a: int
    b: int
    move: Move
    option: Option
    period: float
    term: float


@dataclass(frozen=True)
class Solution:
    """A plan in the DP's terms and its objective."""

    stages: tuple[StageChoice, ...]
    total: float  # sum of periods
    top: float  # max term
    objective: float


def _cost_band(prob: Problem, key: int, link: int, r_top: int, cap: float) -> np.ndarray:
    """Periods of stages allowed at cap ``cap``, per stages-left count 1..r_top, in band layout.

    Shape (W, r_top, nb+1): ``out[k, r-1, a]`` is the least period over the options of stage
    [a, a+1+k) that fit with r stages left (r_top meaning r_top or more) and whose term is
    within the cap, inf where none does; W is trimmed to the widest stage allowed.
    """
    c = prob.cand[(key, link)].band
    fit = (c["term"] <= cap) & (c["rmax"] >= 1)  # (options, nb+1, nb+1)
    cols = np.flatnonzero(fit.any(axis=(0, 1)))
    width = int(cols[-1]) + 1 if cols.size else 0
    period = np.where(fit[:, :, :width], c["period"][:, :, :width], np.inf)
    rmax = c["rmax"][:, :, :width]
    out = np.empty((width, r_top, fit.shape[1]))
    for r in range(1, r_top + 1):  # least period over the options that fit with r stages left
        out[:, r - 1] = np.min(np.where(rmax >= r, period, np.inf), axis=0).T
    return out


def _best_option(prob: Problem, mv: Move, a: int, b: int, rho: int, cap: float) -> tuple[Option, float, float]:
    """The option a stage [a, b) on ``mv`` takes with rho stages left under ``cap``: least period (first wins)."""
    c = prob.cand[(mv.key, mv.link)]
    best: tuple[float, int] | None = None
    for i in range(len(c.options)):
        if c.rmax[i][a, b] >= rho and c.term[i][a, b] <= cap and (best is None or c.period[i][a, b] < best[0]):
            best = (float(c.period[i][a, b]), i)
    if best is None:  # pragma: no cover - the band said one fits
        raise PlanError("internal error: stage DP option lost", "report this with the inputs")
    i = best[1]
    return c.options[i], float(c.period[i][a, b]), float(c.term[i][a, b])


def _windows(nxt: np.ndarray, width: int) -> np.ndarray:
    """``out[k, r, a] = nxt[r, a + 1 + k]`` (inf past the end), shape (width, rows, nb+1): a view."""
    rows, nb1 = nxt.shape
    padded = np.full((rows, nb1 - 1 + width + 1), np.inf)
    padded[:, :nb1 - 1] = nxt[:, 1:]
    st_row, st_col = padded.strides
    win: np.ndarray = np.ndarray((width, rows, nb1), padded.dtype, padded, 0, (st_col, st_row, st_col))
    win.flags.writeable = False
    return win


def _next_rows(h: list[np.ndarray], nxt: int, r_top: int, exact: bool) -> np.ndarray:
    """Suffix values a stage with r = 1..r_top stages left continues into: rows r-1 (and r_top)."""
    rows = h[nxt][:r_top].copy()
    if not exact:
        np.minimum(rows[r_top - 1], h[nxt][r_top], out=rows[r_top - 1])
    return rows


def _rho_mask(prob: Problem, width: int, r_top: int) -> np.ndarray | None:
    """For a fixed config: which stages-left counts may use a stage of ``width`` devices (None: all)."""
    if prob.config is None:
        return None
    k = len(prob.config)
    return np.array([width == prob.config[k - r] for r in range(1, r_top + 1)])


class _CapSweep:
    """The caches of one :func:`solve_cap`: stage bands per (group, link), windows of suffix values per
    next position, config masks per width, and a scratch buffer for the min-plus step."""

    def __init__(self, prob: Problem, cap: float, r_top: int, exact: bool) -> None:
        self.prob, self.cap, self.r_top, self.exact = prob, cap, r_top, exact
        self.bands: dict[tuple[int, int], np.ndarray] = {}
        self.groups: dict[tuple[tuple[int, ...], int], np.ndarray] = {}
        self.masks: dict[int, np.ndarray | None] = {}
        self.wins: dict[int, tuple[np.ndarray | None, int, int]] = {}
        self.buf = np.empty(0)

    def band(self, mv: Move) -> np.ndarray:
        bk = (mv.key, mv.link)
        band = self.bands.get(bk)
        if band is None:
            band = self.bands[bk] = _cost_band(self.prob, mv.key, mv.link, self.r_top, self.cap)
        return band

    def group_band(self, group: MoveGroup) -> np.ndarray:
        """The least period over a group's tensor degrees (moves on the same devices, link and next)."""
        gk = (group.keys, group.link)
        band = self.groups.get(gk)
        if band is None:
            parts = [self.band(Move(k, group.devices, group.next, group.link)) for k in group.keys]
            width = max(p.shape[0] for p in parts)
            band = np.full((width, self.r_top, parts[0].shape[2]), np.inf)
            for p in parts:
                np.minimum(band[:p.shape[0]], p, out=band[:p.shape[0]])
            self.groups[gk] = band
        return band

    def window(self, h: list[np.ndarray], nxt: int, width: int) -> tuple[np.ndarray | None, int, int]:
        """Suffix values from position ``nxt`` in windows of ``width``, and the rows [lo, hi) that can reach one."""
        cached = self.wins.get(nxt)
        if cached is None:  # one strided view per position, as wide as any stage
            rows = _next_rows(h, nxt, self.r_top, self.exact)
            finite = np.flatnonzero(np.isfinite(rows).any(axis=0))
            cached = self.wins[nxt] = (None, 0, 0) if finite.size == 0 else \
                (_windows(rows, rows.shape[1]), int(finite[0]), int(finite[-1]))
        win, first, last = cached
        return (None, 0, 0) if win is None else (win[:width], max(first - width, 0), last)

    def mask(self, devices: tuple[str, ...]) -> np.ndarray | None:
        w = len(devices)
        if w not in self.masks:
            self.masks[w] = _rho_mask(self.prob, w, self.r_top)
        return self.masks[w]

    def position(self, groups: Sequence[MoveGroup], h: list[np.ndarray], best: np.ndarray) -> None:
        """Lower ``best[1:]`` (in place) to the least sums of plans whose first stage runs on one of the
        groups of a position, per stages-left count and block: one min over every group's widths."""
        parts = []
        for group in groups:
            band = self.group_band(group)
            if band.shape[0] == 0:
                continue
            win, lo, hi = self.window(h, group.next, band.shape[0])
            if win is not None:  # rows a that can reach a finite suffix value at b in (a, a + width]
                parts.append((band, win, lo, hi, group))
        if not parts:
            return
        lo, hi = min(p[2] for p in parts), max(p[3] for p in parts)
        total = sum(p[0].shape[0] for p in parts)
        need = total * self.r_top * (hi - lo)
        if self.buf.size < need:
            self.buf = np.empty(need)
        tmp = self.buf[:need].reshape(total, self.r_top, hi - lo)
        at = 0
        for band, win, _, _, group in parts:
            w = band.shape[0]
            np.add(band[:, :, lo:hi], win[:, :, lo:hi], out=tmp[at:at + w])
            mask = self.mask(group.devices) if self.exact else None
            if mask is not None:
                tmp[at:at + w, ~mask] = np.inf
            at += w
        np.minimum(best[1:, lo:hi], np.minimum.reduce(tmp, axis=0), out=best[1:, lo:hi])


def solve_cap(prob: Problem, cap: float, r_top: int | None = None) -> Solution | None:
    """Least sum of periods over plans whose every term is <= ``cap`` (None: no plan).

    ``h[d][r, a]``: least sum of periods placing layers from block a on the devices from
    position d with exactly r stages (r = r_top: r_top or more; exact when K is fixed).
    ``r_top`` below the problem's ``r_eff`` relaxes the memory test of the top row: a stage
    with r_top or more stages left is held to r_top's micro-batches in flight (see :func:`solve`).
    """
    nb, g_total = prob.nb, prob.devices
    fixed = prob.stages_exact is not None
    r_top = max(prob.r_eff if r_top is None or fixed else min(r_top, prob.r_eff), 1)
    exact = fixed or (prob.stages_max is not None and r_top >= prob.r_eff)  # rows count stages exactly
    empty = np.full((r_top + 1, nb + 1), np.inf)
    empty[0, nb] = 0.0
    h: list[np.ndarray] = [empty] * (g_total + 1)
    sweep = _CapSweep(prob, cap, r_top, exact)
    groups = prob.move_groups
    for d in range(g_total - 1, -1, -1):
        best = h[prob.skip[d]].copy()
        sweep.position(groups[d], h, best)
        h[d] = best
    rows = [r_top] if fixed else list(range(1, r_top + 1))
    value, rho0 = min((float(h[0][r, 0]), r) for r in rows)
    if not math.isfinite(value):
        return None
    return _backtrack(prob, h, sweep, rho0, cap, r_top, exact)


def _backtrack(prob: Problem, h: list[np.ndarray], sweep: _CapSweep, rho: int, cap: float, r_top: int,
               exact: bool) -> Solution:
    d, a = 0, 0
    stages: list[StageChoice] = []
    while a < prob.nb:
        target = h[d][rho, a]
        found = False
        for mv in prob.moves[d]:
            band = sweep.band(mv)
            if band.shape[0] == 0:
                continue
            mask = sweep.mask(mv.devices) if exact else None
            if mask is not None and not mask[rho - 1]:
                continue
            nxt = _next_rows(h, mv.next, r_top, exact)
            vals = band[:, rho - 1, a] + _windows(nxt[rho - 1:rho], band.shape[0])[:, 0, a]
            k = int(np.argmin(vals))
            if vals[k] == target:
                b = a + 1 + k
                stages.append(StageChoice(a, b, mv, *_best_option(prob, mv, a, b, rho, cap)))
                if exact or rho < r_top or h[mv.next][rho - 1, b] <= h[mv.next][rho, b]:
                    rho -= 1
                d, a = mv.next, b
                found = True
                break
        if not found:
            if h[prob.skip[d]][rho, a] != target:  # pragma: no cover - every DP value comes from a move or skip
                raise PlanError("internal error: stage DP backtrack failed", "report this with the inputs")
            d = prob.skip[d]
    return _solution(prob, stages)


def _solution(prob: Problem, stages: Sequence[StageChoice]) -> Solution:
    total = 0.0
    for s in reversed(stages):
        total = s.period + total
    top = max(s.term for s in stages)
    return Solution(tuple(stages), total, top, prob.a * total + top)


def infeasible(prob: Problem) -> Exception:
    """The error for a problem with no plan that fits (planner.search.nofit)."""
    from planner.search.nofit import infeasible_error

    return infeasible_error(prob)

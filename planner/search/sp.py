"""SP, Algorithm 2 of PipePar: contiguous stages on device groups, minimising the iteration.

The search space (the same for ``--solver dp`` and ``--solver brute``)
-------------------------------------------------------------------
- Stages take contiguous layer ranges, in model order, and devices in cluster order
  (servers in file order, GPUs in server order). Devices may be left unused.
- ``hierarchy`` groups (the default: "split across servers first, then inside a
  server"): a stage's group is either ``w`` consecutive GPUs inside one server, with
  ``w`` a power of two or the whole server, or ``k >= 2`` whole consecutive servers
  (every ``k`` when the cluster has at most 16 servers, beyond that powers of two, and
  all servers). A stage
  starts at the next free GPU; before it, the rest of the current server (or a whole
  server) may be skipped.
- ``contiguous`` groups (``--config`` and ``--engine``): ``w`` consecutive GPUs in
  cluster order, crossing servers if need be, with the widths given; skips as above.
- Each stage runs its HPP forms (planner.search.hpp) and either keeps its activations
  or recomputes them (GPipe re-materialisation); a stage that fits neither way in its
  smallest device memory is excluded. Memory depends on the micro-batches in flight,
  which for 1f1b-like schedules depend on how many stages follow (K - s): the DP
  tracks that count (capped where it stops mattering). For zb-h1, whose count
  (min(K, M) on every stage) depends on K itself, a stage is held to the largest count
  over every K it could be part of: plans always fit, the memory test may be
  conservative (a documented approximation).
- Large inputs: above ``max_blocks`` layers (default 256, or 128 beyond 64 GPUs), stage
  boundaries are restricted to block boundaries that balance compute (as Alpa clusters
  operators into layers); brute only runs on inputs below that size, so the two spaces
  agree whenever both run.

Objective and exactness
-----------------------
``T = a * sum_s l_s + max_s(b * max(c_s, x_s) + ar_s)`` (planner.costmodel.analytic_iteration). For a
cap C on the max term, a backward DP over (stages left, next free device, first layer)
gives the least ``sum_s l_s`` of plans whose every term is <= C (Alpa, Zheng et al.
OSDI'22, section 5.2). Starting from C = inf, if the best plan has max term m, any better
plan must have max < m, so the next cap is just below m; the descent stops when the DP
finds no plan or when ``sum + (lower bound of the max)`` cannot beat the best. This is
exact. With a = 0 (pipedream) the smallest feasible cap is found by bisection over the
candidate terms.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from planner import ir
from planner.cluster import Group, group_of, index
from planner.costmodel import layer_table, p2p_s, schedule_weights
from planner.errors import InfeasibleError, PlanError
from planner.schedule import in_flight_microbatches
from planner.search.hpp import StageTables, stage_tables

INTRA, INTER, NONE = 0, 1, 2


@dataclass(frozen=True)
class Move:
    """From a free-device position: run a stage on ``devices`` (a group), then go to ``next``."""

    key: int
    devices: tuple[str, ...]
    next: int
    link: int  # INTRA or INTER: the link the stage receives its input over


@dataclass
class Candidate:
    """Per (group key, link): the stage tables the DP reads, all (nb+1, nb+1)."""

    l_a: np.ndarray  # per-micro-batch period without recomputation
    l_b: np.ndarray  # with recomputation
    term_a: np.ndarray  # b * l + ar
    term_b: np.ndarray
    rmax_a: np.ndarray  # largest stages-left count the stage fits with (0: never)
    rmax_b: np.ndarray
    band: dict[str, np.ndarray] = field(default_factory=dict)
    """The same arrays in band layout: ``band[x][a, k] = x[a, a + 1 + k]`` (inf/0 past the end)."""

    def make_band(self) -> None:
        nb1 = self.l_a.shape[0]
        rows = np.arange(nb1)[:, None]
        cols = rows + 1 + np.arange(nb1)[None, :]
        inside = cols < nb1
        cols = np.where(inside, cols, 0)
        for name in ("l_a", "l_b", "term_a", "term_b", "rmax_a", "rmax_b"):
            arr = getattr(self, name)
            fill = 0 if name.startswith("rmax") else np.inf
            self.band[name] = np.where(inside, arr[rows, cols], fill)


@dataclass
class Problem:
    """One search instance: profile, cluster, M, schedule and the search space, tabulated."""

    profile: ir.ModelProfile
    cluster: ir.Cluster
    microbatches: int
    schedule: str
    optimizer: str
    forms: tuple[str, ...]
    bounds: np.ndarray
    moves: list[list[Move]]
    skip: list[int]
    groups: list[Group]
    tables: list[StageTables]
    stages_exact: int | None  # K fixed (config, or schedules whose memory depends on K)
    config: tuple[int, ...] | None
    r_cap: int
    a: float
    b: float
    cand: dict[tuple[int, int], Candidate] = field(default_factory=dict)
    r_eff: int = 1
    capacity_override: float | None = None

    @property
    def nb(self) -> int:
        return len(self.bounds) - 1

    @property
    def devices(self) -> int:
        return len(self.skip)


# ----------------------------------------------------------------------------- building


def coarse_bounds(profile: ir.ModelProfile, max_blocks: int) -> np.ndarray:
    """Block boundaries: every layer, or at most ``max_blocks`` blocks balancing fwd+bwd time."""
    n = len(profile.layers)
    if n <= max_blocks:
        return np.arange(n + 1)
    t = np.array([x.forward_s + x.backward_s for x in profile.layers]) + 1e-12
    cum = np.concatenate([[0.0], np.cumsum(t)])
    targets = np.linspace(0, cum[-1], max_blocks + 1)
    cuts = np.unique(np.clip(np.searchsorted(cum, targets), 0, n))
    cuts = np.unique(np.concatenate([[0, n], cuts]))
    return cuts


def _pow2_upto(n: int) -> list[int]:
    out, w = [], 1
    while w <= n:
        out.append(w)
        w *= 2
    return out


def build_moves(cluster: ir.Cluster, mode: str, widths: Sequence[int] | None) -> tuple[list[list[Move]], list[int],
                                                                                     list[tuple[str, ...]]]:
    """Moves from every free-device position, the skip target, and the distinct groups.

    ``mode`` is ``hierarchy`` or ``contiguous``; ``widths`` restricts stage widths.
    """
    idx = index(cluster)
    names, starts = idx.names, idx.node_start
    g_total, s_total = len(names), len(cluster.nodes)
    node_at = [idx.node_of[d] for d in names]
    allowed = None if widths is None else set(widths)
    moves: list[list[Move]] = []
    skip: list[int] = []
    groups: list[tuple[str, ...]] = []
    for d in range(g_total):
        c = node_at[d]
        u = d - starts[c]
        size = starts[c + 1] - starts[c]
        skip.append(starts[c + 1])
        opts: list[tuple[int, int]] = []  # (width, next)
        if mode == "hierarchy":
            ws = sorted(set(_pow2_upto(size)) | {size})
            opts += [(w, d + w) for w in ws if u + w <= size]
            if u == 0:
                ks = list(range(2, s_total - c + 1))
                if s_total > 16:
                    ks = sorted({k for k in _pow2_upto(s_total) if k >= 2} | ({s_total} if c == 0 else set()))
                opts += [(starts[c + k] - d, starts[c + k]) for k in ks if c + k <= s_total]
        else:
            ws = sorted(allowed) if allowed is not None else list(range(1, g_total + 1))
            opts += [(w, d + w) for w in ws if d + w <= g_total]
        row = []
        seen = set()
        for w, nxt in opts:
            if allowed is not None and w not in allowed:
                continue
            if (w, nxt) in seen:
                continue
            seen.add((w, nxt))
            devs = tuple(names[d:nxt])
            link = INTRA if u > 0 and node_at[nxt - 1] == c else INTER
            row.append(Move(-1, devs, nxt, link))
            groups.append(devs)
        moves.append(row)
    return moves, skip, groups


def _group_key(g: Group) -> tuple:
    return (g.n, g.flops, g.memory_bytes, g.nodes, g.per_node)


def build_problem(profile: ir.ModelProfile, cluster: ir.Cluster, *, microbatches: int, schedule: str, optimizer: str,
                  forms: Sequence[str] = ir.FORMS, mode: str = "hierarchy", widths: Sequence[int] | None = None,
                  config: Sequence[int] | None = None, max_blocks: int | None = None,
                  stages: int | None = None) -> Problem:
    """Tabulate everything the stage DP and brute force read (see the module doc)."""
    if config is not None:
        mode, widths = "contiguous", sorted(set(config))
    moves, skip, _ = build_moves(cluster, mode, widths)
    if max_blocks is None:
        max_blocks = 256 if len(cluster.gpus) <= 64 else 128
    bounds = coarse_bounds(profile, max_blocks)
    key_of: dict[tuple, int] = {}
    groups: list[Group] = []
    tables: list[StageTables] = []
    for d, row in enumerate(moves):
        for i, mv in enumerate(row):
            g = group_of(cluster, mv.devices)
            k = _group_key(g)
            if k not in key_of:
                key_of[k] = len(groups)
                groups.append(g)
                lt = layer_table(profile, g, microbatches, optimizer, forms)
                tables.append(stage_tables(lt, bounds, microbatches))
            row[i] = Move(key_of[k], mv.devices, mv.next, mv.link)
        moves[d] = row
    a, b = schedule_weights(schedule, microbatches)
    r_cap = max(1, min(len(bounds) - 1, len(skip)))  # the most stages a plan can have
    exact_k = len(config) if config is not None else stages
    prob = Problem(profile, cluster, microbatches, schedule, optimizer, tuple(forms), bounds, moves, skip, groups,
                   tables, exact_k, tuple(config) if config is not None else None, r_cap, a, b)
    _build_candidates(prob)
    return prob


def memory_depends_on_k(schedule: str, microbatches: int, max_stages: int) -> bool:
    """Whether a stage's micro-batches in flight depend on more than the stages after it.

    The free-K DP tracks K - s only; for schedules whose in-flight count depends on K
    itself (zb-h1 keeps min(K, M) on every stage) each stage is given the largest count
    over the K it could belong to (see ``_build_candidates``).
    """
    for k in range(1, max_stages + 1):
        for s in range(k):
            if in_flight_microbatches(schedule, k, microbatches, s) != \
                    in_flight_microbatches(schedule, k - s, microbatches, 0):
                return True
    return False


def _in_flight_counts(prob: Problem, r_hi: int) -> list[int]:
    """Micro-batches in flight on a stage with r = 1..r_hi stages left (its own included)."""
    k_fixed = prob.stages_exact
    if k_fixed is not None:  # exact: stage s = K - r of K
        return [in_flight_microbatches(prob.schedule, k_fixed, prob.microbatches, k_fixed - r)
                for r in range(1, r_hi + 1)]
    if memory_depends_on_k(prob.schedule, prob.microbatches, min(r_hi, 16)):
        # the count depends on K itself (zb-h1): take the largest over every K the stage
        # could be part of -- safe (plans always fit), possibly conservative
        return [max(in_flight_microbatches(prob.schedule, k, prob.microbatches, k - r)
                    for k in range(r, r_hi + 1)) for r in range(1, r_hi + 1)]
    return [in_flight_microbatches(prob.schedule, r, prob.microbatches, 0) for r in range(1, r_hi + 1)]


def _periods_and_terms(prob: Problem, key: int, t: StageTables, recv: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per stage range: period without and with recomputation (l_a, l_b) and the matching max terms."""
    time_b = t.time + t.fwd
    l_a = t.time + 2.0 * recv
    l_b = time_b + 2.0 * recv
    ar = _ar(prob, key, t)
    with np.errstate(invalid="ignore"):
        if prob.schedule == "gpipe":  # forward phase, then backward phase (F-then-B)
            bwd_a = t.time - t.fwd
            busy_a = np.maximum(t.fwd, recv) + np.maximum(bwd_a, recv)
            busy_b = np.maximum(t.fwd, recv) + np.maximum(bwd_a + t.fwd, recv)
        else:
            busy_a, busy_b = np.maximum(t.time, recv), np.maximum(time_b, recv)
        term_a = np.where(np.isfinite(l_a), prob.b * busy_a + ar, np.inf)
        term_b = np.where(np.isfinite(l_b), prob.b * busy_b + ar, np.inf)
    return l_a, l_b, term_a, term_b


def _fit_limits(prob: Problem, t: StageTables, cap: float, in_fl: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Per stage range: the largest stages-left count it fits ``cap`` bytes with, without/with recomputation."""
    static, act, wt = np.ceil(t.static), np.ceil(t.act), np.ceil(t.weight)
    inr = np.ceil(t.in_bytes)[:, None]
    rmax_a = np.zeros(t.time.shape, dtype=np.int64)
    rmax_b = np.zeros(t.time.shape, dtype=np.int64)
    for r, k in enumerate(in_fl, start=1):
        stash = (k - 1) * wt if prob.schedule == "pipedream" else 0.0
        mem_a = static + k * act + stash
        mem_b = static + k * inr + act + stash
        rmax_a = np.where(mem_a <= cap, r, rmax_a) if r == 1 else np.where((rmax_a == r - 1) & (mem_a <= cap),
                                                                            r, rmax_a)
        rmax_b = np.where(mem_b <= cap, r, rmax_b) if r == 1 else np.where((rmax_b == r - 1) & (mem_b <= cap),
                                                                            r, rmax_b)
    finite = np.isfinite(t.time)
    return np.where(finite, rmax_a, 0), np.where(finite, rmax_b, 0)


def _build_candidates(prob: Problem) -> None:
    """Per (group, link): periods, terms and memory limits of every stage range."""
    prob.cand.clear()
    inb = np.array([float(x.output_bytes) for x in prob.profile.layers]) / prob.microbatches
    start_layer = prob.bounds[:-1]
    recv_bytes = np.zeros(prob.nb + 1)
    recv_bytes[1:prob.nb] = inb[start_layer[1:] - 1]
    links = {INTRA: prob.cluster.link("intra_node"), INTER: prob.cluster.link("inter_node")}
    r_hi = prob.stages_exact if prob.stages_exact is not None else prob.r_cap
    in_fl = _in_flight_counts(prob, r_hi)
    used = {(mv.key, mv.link) for row in prob.moves for mv in row}
    for key, link in sorted(used):
        t = prob.tables[key]
        recv = np.array([p2p_s(x, links[link]) for x in recv_bytes])[:, None]
        cap = prob.groups[key].memory_bytes if prob.capacity_override is None else prob.capacity_override
        cand = Candidate(*_periods_and_terms(prob, key, t, recv), *_fit_limits(prob, t, cap, in_fl))
        cand.make_band()
        prob.cand[(key, link)] = cand
    # the stages-left count matters only up to 1 + the largest limit below the cap
    limits = [int(x) for c in prob.cand.values() for arr in (c.rmax_a, c.rmax_b)
              for x in np.unique(arr) if 1 <= x < r_hi]
    prob.r_eff = r_hi if prob.stages_exact is not None else min(r_hi, 1 + max(limits, default=0))


def _ar(prob: Problem, key: int, t: StageTables) -> np.ndarray:
    from planner.costmodel import allreduce_coefficients

    coef, const = allreduce_coefficients(prob.groups[key])
    return np.where(t.ar_bytes > 0, t.ar_bytes * coef + const, 0.0)


# ----------------------------------------------------------------------------- the DP


@dataclass(frozen=True)
class StageChoice:
    """One stage of a solution: layer block range [a, b), its move and whether it recomputes."""

    a: int
    b: int
    move: Move
    recompute: bool
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

    Shape (r_top, nb+1, W): ``out[r-1, a, k]`` is the period of stage [a, a+1+k) when r
    stages are left (r_top meaning r_top or more), inf where it does not fit or exceeds
    the cap; W is trimmed to the widest stage allowed.
    """
    c = prob.cand[(key, link)].band
    under_a = c["term_a"] <= cap
    under_b = c["term_b"] <= cap
    any_ok = (under_a & (c["rmax_a"] >= 1)) | (under_b & (c["rmax_b"] >= 1))
    cols = np.flatnonzero(any_ok.any(axis=0))
    width = int(cols[-1]) + 1 if cols.size else 0
    rs = np.arange(1, r_top + 1)[:, None, None]
    ok_a = (c["rmax_a"][None, :, :width] >= rs) & under_a[None, :, :width]
    ok_b = (c["rmax_b"][None, :, :width] >= rs) & under_b[None, :, :width]
    return np.where(ok_a, c["l_a"][None, :, :width], np.where(ok_b, c["l_b"][None, :, :width], np.inf))


def _windows(nxt: np.ndarray, width: int) -> np.ndarray:
    """``out[..., a, k] = nxt[..., a + 1 + k]`` (inf past the end), shape (..., nb+1, width)."""
    nb1 = nxt.shape[-1]
    padded = np.full((*nxt.shape[:-1], nb1 - 1 + width + 1), np.inf)
    padded[..., :nb1 - 1] = nxt[..., 1:]
    st = padded.strides
    return np.lib.stride_tricks.as_strided(padded, shape=(*nxt.shape[:-1], nb1, width),
                                           strides=(*st[:-1], st[-1], st[-1]), writeable=False)


def _next_rows(h: list[np.ndarray], nxt: int, r_top: int, exact: bool) -> np.ndarray:
    """Suffix values a stage with r = 1..r_top stages left continues into: rows r-1 (and r_top)."""
    rows = h[nxt][:r_top].copy()
    if not exact:
        np.minimum(rows[r_top - 1], h[nxt][r_top], out=rows[r_top - 1])
    return rows


def _rho_mask(prob: Problem, mv: Move, r_top: int) -> np.ndarray | None:
    """For a fixed config: which stages-left counts may use this move's width (None: all)."""
    if prob.config is None:
        return None
    k = len(prob.config)
    return np.array([len(mv.devices) == prob.config[k - r] for r in range(1, r_top + 1)])


class _CapSweep:
    """The caches of one :func:`solve_cap`: stage bands per (group, link), windows of suffix values per
    (next position, width), config masks per width, and a scratch buffer for the min-plus step."""

    def __init__(self, prob: Problem, cap: float, r_top: int, exact: bool) -> None:
        self.prob, self.cap, self.r_top, self.exact = prob, cap, r_top, exact
        self.bands: dict[tuple[int, int], np.ndarray] = {}
        self.masks: dict[int, np.ndarray | None] = {}
        self.wins: dict[tuple[int, int], tuple[np.ndarray | None, int, int]] = {}
        self.buf = np.empty(0)

    def band(self, mv: Move) -> np.ndarray:
        bk = (mv.key, mv.link)
        band = self.bands.get(bk)
        if band is None:
            band = self.bands[bk] = _cost_band(self.prob, mv.key, mv.link, self.r_top, self.cap)
        return band

    def window(self, h: list[np.ndarray], nxt: int, width: int) -> tuple[np.ndarray | None, int, int]:
        """Suffix values from position ``nxt`` in windows of ``width``, and the rows [lo, hi) that can reach one."""
        wk = (nxt, width)
        cached = self.wins.get(wk)
        if cached is None:
            rows = _next_rows(h, nxt, self.r_top, self.exact)
            finite = np.flatnonzero(np.isfinite(rows).any(axis=0))
            cached = self.wins[wk] = (None, 0, 0) if finite.size == 0 else \
                (_windows(rows, width), max(int(finite[0]) - width, 0), int(finite[-1]))
        return cached

    def mask(self, mv: Move) -> np.ndarray | None:
        w = len(mv.devices)
        if w not in self.masks:
            self.masks[w] = _rho_mask(self.prob, mv, self.r_top)
        return self.masks[w]

    def values(self, mv: Move, h: list[np.ndarray]) -> np.ndarray | None:
        """Least sums of plans whose first stage runs on ``mv``, per stages-left count and first block."""
        band = self.band(mv)
        if band.shape[2] == 0:
            return None
        full_win, lo_row, hi_row = self.window(h, mv.next, band.shape[2])
        if full_win is None:
            return None
        # rows a that can reach a finite suffix value at b in (a, a + width]
        cand = np.full((self.r_top, self.prob.nb + 1), np.inf)
        part = band[:, lo_row:hi_row]
        need = part.size
        if self.buf.size < need:
            self.buf = np.empty(need)
        tmp = self.buf[:need].reshape(part.shape)
        np.add(part, full_win[:, lo_row:hi_row], out=tmp)
        np.min(tmp, axis=2, out=cand[:, lo_row:hi_row])
        if self.exact:
            mask = self.mask(mv)
            if mask is not None:
                cand[~mask] = np.inf
        return cand


def solve_cap(prob: Problem, cap: float) -> Solution | None:
    """Least sum of periods over plans whose every term is <= ``cap`` (None: no plan).

    ``h[d][r, a]``: least sum of periods placing layers from block a on the devices from
    position d with exactly r stages (r = r_top: r_top or more; exact when K is fixed).
    """
    nb, g_total = prob.nb, prob.devices
    exact = prob.stages_exact is not None
    r_top = max(prob.r_eff, 1)
    empty = np.full((r_top + 1, nb + 1), np.inf)
    empty[0, nb] = 0.0
    h: list[np.ndarray] = [empty] * (g_total + 1)
    sweep = _CapSweep(prob, cap, r_top, exact)
    for d in range(g_total - 1, -1, -1):
        best = h[prob.skip[d]].copy()
        for mv in prob.moves[d]:
            cand = sweep.values(mv, h)
            if cand is not None:
                np.minimum(best[1:], cand, out=best[1:])
        h[d] = best
    rows = [r_top] if exact else list(range(1, r_top + 1))
    value, rho0 = min((float(h[0][r, 0]), r) for r in rows)
    if not math.isfinite(value):
        return None
    return _backtrack(prob, h, sweep.bands, sweep.masks, rho0, cap, r_top, exact)


def _backtrack(prob: Problem, h: list[np.ndarray], bands: dict, masks: dict, rho: int, cap: float, r_top: int,
               exact: bool) -> Solution:
    d, a = 0, 0
    stages: list[StageChoice] = []
    while a < prob.nb:
        target = h[d][rho, a]
        found = False
        for mv in prob.moves[d]:
            band = bands.get((mv.key, mv.link))
            if band is None or band.shape[2] == 0:
                continue
            mask = masks.get(len(mv.devices)) if exact else None
            if mask is not None and not mask[rho - 1]:
                continue
            nxt = _next_rows(h, mv.next, r_top, exact)
            vals = band[rho - 1, a] + _windows(nxt[rho - 1], band.shape[2])[a]
            k = int(np.argmin(vals))
            if vals[k] == target:
                b = a + 1 + k
                c = prob.cand[(mv.key, mv.link)]
                use_a = c.rmax_a[a, b] >= rho and c.term_a[a, b] <= cap
                period = float(c.l_a[a, b] if use_a else c.l_b[a, b])
                term_v = float(c.term_a[a, b] if use_a else c.term_b[a, b])
                stages.append(StageChoice(a, b, mv, not use_a, period, term_v))
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


def lower_bound_top(prob: Problem) -> float:
    """A lower bound on the max term of any plan: the block every plan must cover worst."""
    nb = prob.nb
    tmin = np.full((nb + 1, nb + 1), np.inf)
    for c in prob.cand.values():
        ta = np.where(c.rmax_a >= 1, c.term_a, np.inf)
        tb = np.where(c.rmax_b >= 1, c.term_b, np.inf)
        np.minimum(tmin, np.minimum(ta, tb), out=tmin)
    suffix = np.minimum.accumulate(tmin[:, ::-1], axis=1)[:, ::-1]  # min over b' >= b
    cum = np.minimum.accumulate(suffix, axis=0)  # min over a' <= a
    lb = 0.0
    for x in range(nb):
        lb = max(lb, float(cum[x, x + 1]))
    return lb


def candidate_terms(prob: Problem) -> np.ndarray:
    """Every value a stage's max term can take in this problem, sorted and unique."""
    parts = []
    for c in prob.cand.values():
        parts.append(c.term_a[(c.rmax_a >= 1) & np.isfinite(c.term_a)])
        parts.append(c.term_b[(c.rmax_b >= 1) & np.isfinite(c.term_b)])
    return np.unique(np.concatenate(parts)) if parts else np.zeros(0)


_Interval = tuple[float, int, int, float]
"""An open interval of candidate max-term indices: (bound on the objective, lo, hi, bound S on the sum)."""


def _push_intervals(heap: list[_Interval], prob: Problem, vals: np.ndarray, lo: int, mid: int, hi: int,
                    s_lo: float, sol: Solution | None) -> None:
    """After solving [lo, hi] at cap vals[mid]: [lo, t-1] bounded by the plan's sum (its max is vals[t]),
    [mid+1, hi] keeping the interval's bound."""
    if sol is not None:
        t = int(np.searchsorted(vals, sol.top))
        if lo <= t - 1:
            heapq.heappush(heap, (prob.a * sol.total + float(vals[lo]), lo, t - 1, sol.total))
    if mid + 1 <= hi:
        heapq.heappush(heap, (prob.a * s_lo + float(vals[mid + 1]), mid + 1, hi, s_lo))


def solve(prob: Problem, max_solves: int = 10_000, progress: Callable[[int, float], None] | None = None,
          pool: list[Solution] | None = None) -> Solution | None:
    """The exact optimum of the objective over the problem's space (None: nothing fits).

    Branch and bound over the sorted candidate values of the max term. An open interval
    [lo, hi] of candidate indices carries S, a lower bound on the sum of periods of any
    plan whose max term lies in it, so every such plan costs at least ``a*S + vals[lo]``.
    Intervals are opened best bound first; solving at cap vals[mid] gives the least sum
    S' of plans with max <= vals[mid] and a plan whose max is vals[t] (t <= mid): plans
    with max in [t, mid] cost at least the plan's own objective, [lo, t-1] gets bound S',
    [mid+1, hi] keeps S. It stops when the smallest bound cannot beat the best plan, so
    the result is exact. Every plan met on the way is appended to ``pool`` when given
    (candidates for a finer judge, such as the simulator).
    """
    first = solve_cap(prob, math.inf)
    if first is None:
        return None
    if pool is not None:
        pool.append(first)
    vals = candidate_terms(prob)
    best = first
    lo0 = int(np.searchsorted(vals, lower_bound_top(prob)))
    top_idx = int(np.searchsorted(vals, first.top))
    heap: list[_Interval] = []
    if lo0 <= top_idx - 1:
        heapq.heappush(heap, (prob.a * first.total + float(vals[lo0]), lo0, top_idx - 1, first.total))
    solves = 1
    while heap and solves < max_solves:
        bound, lo, hi, s_lo = heapq.heappop(heap)
        if bound >= best.objective:
            break
        if progress:
            progress(solves, best.objective)
        mid = (lo + hi) // 2
        sol = solve_cap(prob, float(vals[mid]))
        solves += 1
        if sol is not None:
            if pool is not None:
                pool.append(sol)
            if sol.objective < best.objective:
                best = sol
        _push_intervals(heap, prob, vals, lo, mid, hi, s_lo, sol)
    return best


def needed_memory(prob: Problem, rounds: int = 40) -> int | None:
    """The smallest per-device memory with which some plan of this space fits (bisection)."""
    hi = 1.0
    saved = prob.capacity_override
    try:
        for _ in range(80):
            prob.capacity_override = hi
            _build_candidates(prob)
            if solve_cap(prob, math.inf) is not None:
                break
            hi *= 2
        else:
            return None
        lo = hi / 2
        for _ in range(rounds):
            mid = (lo + hi) / 2
            prob.capacity_override = mid
            _build_candidates(prob)
            if solve_cap(prob, math.inf) is not None:
                hi = mid
            else:
                lo = mid
        return math.ceil(hi)
    finally:
        prob.capacity_override = saved
        _build_candidates(prob)


def infeasible(prob: Problem) -> InfeasibleError:
    """The error for a problem with no plan that fits, with the memory that would be needed."""
    need = needed_memory(prob)
    have = min(g.memory_bytes for g in prob.cluster.gpus)
    gib = 1024**3
    cause = f"no plan fits in the devices' memory ({have / gib:.2f} GiB per device at most)"
    if need is not None:
        cause += f"; the best plan of this space needs {need / gib:.2f} GiB per device"
    hint = ("add devices or use GPUs with more memory, use more micro-batches (--microbatches, smaller micro-batches "
            "keep fewer activations), a lighter --optimizer (sgd), or a schedule with fewer micro-batches in flight "
            "(1f1b); recomputation is already tried for every stage")
    return InfeasibleError(cause, hint, need)

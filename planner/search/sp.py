"""SP, Algorithm 2 of PipePar: contiguous stages on device groups, minimising the iteration.

The search space (the same for ``--solver dp`` and ``--solver brute``)
-------------------------------------------------------------------
- Stages take contiguous layer ranges, in model order, and devices in cluster order
  (servers in file order, GPUs in server order). Devices may be left unused.
- ``hierarchy`` groups (the default: "split across servers first, then inside a
  server"): a stage's group is either ``w`` consecutive GPUs inside one server, with
  ``w`` a power of two or the whole server, or ``k >= 2`` whole consecutive servers
  (every ``k`` up to 16 servers, beyond that powers of two and "all the rest"). A stage
  starts at the next free GPU; before it, the rest of the current server (or a whole
  server) may be skipped.
- ``contiguous`` groups (``--config`` and ``--engine``): ``w`` consecutive GPUs in
  cluster order, crossing servers if need be, with the widths given; skips as above.
- Each stage runs its HPP forms (planner.search.hpp) and either keeps its activations
  or recomputes them (GPipe re-materialisation); a stage that fits neither way in its
  smallest device memory is excluded. Memory depends on the micro-batches in flight,
  which for 1f1b-like schedules depend on how many stages follow (K - s): the DP
  tracks that count (capped where it stops mattering).
- Large inputs: above ``max_blocks`` layers, stage boundaries are restricted to block
  boundaries that balance compute (as Alpa clusters operators into layers); brute only
  runs on inputs below that size, so the two spaces agree whenever both run.

Objective and exactness
-----------------------
``T = a * sum_s l_s + max_s(b * l_s + ar_s)`` (planner.costmodel.schedule_weights). For a
cap C on the max term, a backward DP over (stages left, next free device, first layer)
gives the least ``sum_s l_s`` of plans whose every term is <= C (Alpa, Zheng et al.
OSDI'22, section 5.2). Starting from C = inf, if the best plan has max term m, any better
plan must have max < m, so the next cap is just below m; the descent stops when the DP
finds no plan or when ``sum + (lower bound of the max)`` cannot beat the best. This is
exact. With a = 0 (pipedream) the smallest feasible cap is found by bisection over the
candidate terms.
"""

from __future__ import annotations

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
    stages_exact: int | None  # K fixed (config): moves depend on the stage index
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
                    ks = sorted({k for k in _pow2_upto(s_total) if k >= 2} | {s_total - c})
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
                  config: Sequence[int] | None = None, max_blocks: int = 256) -> Problem:
    """Tabulate everything the stage DP and brute force read (see the module doc)."""
    if config is not None:
        mode, widths = "contiguous", sorted(set(config))
    moves, skip, _ = build_moves(cluster, mode, widths)
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
    r_cap = 1
    values = [in_flight_microbatches(schedule, r, microbatches, 0) for r in range(1, 2 * microbatches + 3)]
    for r in range(len(values), 0, -1):
        if values[r - 1] != values[-1]:
            r_cap = r + 1
            break
    prob = Problem(profile, cluster, microbatches, schedule, optimizer, tuple(forms), bounds, moves, skip, groups,
                   tables, len(config) if config is not None else None,
                   tuple(config) if config is not None else None, r_cap, a, b)
    _build_candidates(prob)
    return prob


def _build_candidates(prob: Problem) -> None:
    """Per (group, link): periods, terms and memory limits of every stage range."""
    prob.cand.clear()
    inb = np.array([float(x.output_bytes) for x in prob.profile.layers]) / prob.microbatches
    start_layer = prob.bounds[:-1]
    recv_bytes = np.zeros(prob.nb + 1)
    recv_bytes[1:prob.nb] = inb[start_layer[1:] - 1]
    links = {INTRA: prob.cluster.link("intra_node"), INTER: prob.cluster.link("inter_node")}
    r_hi = prob.stages_exact if prob.stages_exact is not None else prob.r_cap
    in_fl = [in_flight_microbatches(prob.schedule, r, prob.microbatches, 0) for r in range(1, r_hi + 1)]
    used = {(mv.key, mv.link) for row in prob.moves for mv in row}
    for key, link in sorted(used):
        t = prob.tables[key]
        g = prob.groups[key]
        recv = np.array([2.0 * p2p_s(x, links[link]) for x in recv_bytes])
        l_a = t.time + recv[:, None]
        l_b = l_a + t.fwd
        ar = _ar(prob, key, t)
        with np.errstate(invalid="ignore"):
            term_a = np.where(np.isfinite(l_a), prob.b * l_a + ar, np.inf)
            term_b = np.where(np.isfinite(l_b), prob.b * l_b + ar, np.inf)
        cap = g.memory_bytes if prob.capacity_override is None else prob.capacity_override
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
        rmax_a = np.where(finite, rmax_a, 0)
        rmax_b = np.where(finite, rmax_b, 0)
        prob.cand[(key, link)] = Candidate(l_a, l_b, term_a, term_b, rmax_a, rmax_b)
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


def _cost_matrix(prob: Problem, key: int, link: int, r: int, cap: float) -> np.ndarray:
    c = prob.cand[(key, link)]
    ok_a = (c.rmax_a >= r) & (c.term_a <= cap)
    ok_b = (c.rmax_b >= r) & (c.term_b <= cap)
    return np.where(ok_a, c.l_a, np.where(ok_b, c.l_b, np.inf))


def solve_cap(prob: Problem, cap: float) -> Solution | None:
    """Least sum of periods over plans whose every term is <= ``cap`` (None: no plan)."""
    nb, g_total = prob.nb, prob.devices
    exact = prob.stages_exact is not None
    r_top = max(prob.r_eff, 1)
    # H[rho][d]: arrays over start block a
    inf = np.full(nb + 1, np.inf)
    term = inf.copy()
    term[nb] = 0.0
    h: list[list[np.ndarray]] = [[term] * (g_total + 1)] + [[inf] * (g_total + 1) for _ in range(r_top)]
    mats: dict[tuple[int, int, int], np.ndarray] = {}
    for d in range(g_total - 1, -1, -1):
        for rho in range(1, r_top + 1):
            best = h[rho][prob.skip[d]].copy() if prob.skip[d] <= g_total else inf.copy()
            for mv in prob.moves[d]:
                if exact and len(mv.devices) != prob.config[(prob.stages_exact or 0) - rho]:  # type: ignore[index]
                    continue
                nxt = _next_h(h, rho, mv.next, r_top, exact)
                r_eff = rho
                mk = (mv.key, mv.link, r_eff)
                mat = mats.get(mk)
                if mat is None:
                    mat = _cost_matrix(prob, mv.key, mv.link, r_eff, cap)
                    mats[mk] = mat
                cand = np.min(mat + nxt[None, :], axis=1)
                np.minimum(best, cand, out=best)
            h[rho][d] = best
    starts = range(1, r_top + 1) if not exact else [r_top]
    vals = [(h[rho][0][0], rho) for rho in starts]
    value, rho0 = min(vals, key=lambda x: x[0])
    if not math.isfinite(value):
        return None
    return _backtrack(prob, h, mats, rho0, cap, r_top, exact)


def _next_h(h: list[list[np.ndarray]], rho: int, nxt: int, r_top: int, exact: bool) -> np.ndarray:
    if rho == r_top and not exact:
        return np.minimum(h[rho - 1][nxt], h[rho][nxt])
    return h[rho - 1][nxt]


def _backtrack(prob: Problem, h: list[list[np.ndarray]], mats: dict, rho: int, cap: float, r_top: int,
               exact: bool) -> Solution:
    d, a = 0, 0
    stages: list[StageChoice] = []
    while a < prob.nb:
        target = h[rho][d][a]
        if prob.skip[d] <= prob.devices and h[rho][prob.skip[d]][a] == target:
            d = prob.skip[d]
            continue
        found = False
        for mv in prob.moves[d]:
            if exact and len(mv.devices) != prob.config[(prob.stages_exact or 0) - rho]:  # type: ignore[index]
                continue
            mat = mats.get((mv.key, mv.link, rho))
            if mat is None:
                continue
            nxt = _next_h(h, rho, mv.next, r_top, exact)
            vals = mat[a] + nxt
            b = int(np.argmin(vals))
            if vals[b] == target and math.isfinite(target):
                c = prob.cand[(mv.key, mv.link)]
                use_a = c.rmax_a[a, b] >= rho and c.term_a[a, b] <= cap
                period = float(c.l_a[a, b] if use_a else c.l_b[a, b])
                term_v = float(c.term_a[a, b] if use_a else c.term_b[a, b])
                stages.append(StageChoice(a, b, mv, not use_a, period, term_v))
                rho = rho if rho == r_top and not exact and h[rho][mv.next][b] <= h[rho - 1][mv.next][b] else rho - 1
                d, a = mv.next, b
                found = True
                break
        if not found:  # pragma: no cover - the DP values always come from a move
            raise PlanError("internal error: stage DP backtrack failed", "report this with the inputs")
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


def solve(prob: Problem, max_rounds: int = 400, progress: Callable[[int, float], None] | None = None
          ) -> Solution | None:
    """The exact optimum of the objective over the problem's space (None: nothing fits)."""
    first = solve_cap(prob, math.inf)
    if first is None:
        return None
    if prob.a == 0.0:
        return _bisect(prob, first)
    best = first
    lb = lower_bound_top(prob)
    cur = first
    for rnd in range(max_rounds):
        if progress:
            progress(rnd, best.objective)
        if cur.total * prob.a + lb >= best.objective:
            break
        cap = math.nextafter(cur.top, -math.inf)
        nxt = solve_cap(prob, cap)
        if nxt is None:
            break
        if nxt.objective < best.objective:
            best = nxt
        cur = nxt
    return best


def _bisect(prob: Problem, first: Solution) -> Solution:
    values: set[float] = set()
    for c in prob.cand.values():
        values.update(c.term_a[(c.rmax_a >= 1) & np.isfinite(c.term_a)].tolist())
        values.update(c.term_b[(c.rmax_b >= 1) & np.isfinite(c.term_b)].tolist())
    vals = sorted(v for v in values if v <= first.top)
    lo, hi = 0, len(vals) - 1
    best = first
    while lo <= hi:
        mid = (lo + hi) // 2
        sol = solve_cap(prob, vals[mid])
        if sol is None:
            lo = mid + 1
        else:
            if sol.objective <= best.objective:
                best = sol
            hi = mid - 1
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

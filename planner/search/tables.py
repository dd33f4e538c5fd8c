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
  as ``rmax``, the largest stages-left count it fits with; 0 where the static bytes and the
  gradient all-reduce's flat copy do not fit at all (``transient``, planner.costmodel.variant).

Their inputs live here too: micro-batches in flight per stages-left count
(:func:`in_flight_counts`), tied-weight copies per range (:func:`tie_copies`) and each start
block's input transfer (:func:`p2p_times`). The objective ``T = a * sum_s l_s + max_s term_s``
and the exact descent over the max term are in :mod:`planner.search.sp`.
"""

from __future__ import annotations

import numpy as np

from planner import ir
from planner.costmodel import VariantCost, p2p_s
from planner.costmodel.layers import LayerTable, layer_table
from planner.costmodel.precision import Bytes
from planner.costmodel.stage import tie_copy_on
from planner.schedule import in_flight_microbatches, schedule_kind
from planner.search.hpp import StageTables
from planner.search.space import INTRA, Candidate, Problem, option_cost, options


def build_candidates(prob: Problem) -> None:
    """Per (grid, link) used by a move: periods, terms and memory limits of every option and range."""
    prob.cand.clear()
    r_hi = prob.stages_exact if prob.stages_exact is not None else min(prob.r_cap, prob.stages_max or prob.r_cap)
    in_fl = in_flight_counts(prob, r_hi)
    used = {(mv.key, mv.link) for row in prob.moves for mv in row}
    recv_of = {(link, dp): p2p_times(prob, link, dp)[:, None]
               for link, dp in {(k[1], prob.grids[k[0]].dp) for k in used}}
    fit_of: dict[int, np.ndarray] = {}  # per grid: memory does not depend on the link
    for key, link in sorted(used):
        opts = options(prob, key)
        cand = Candidate(opts, [], [], [])
        costs = [option_cost(prob, key, opt) for opt in opts]
        for _, v in costs:
            period, term = _period_and_term(prob, v, recv_of[(link, prob.grids[key].dp)])
            cand.period.append(period)
            cand.term.append(term)
        if prob.min_stages > 1:  # no plan of one stage: the whole model is no stage's range
            for arr in cand.period + cand.term:
                arr[0, prob.nb] = np.inf
        if key not in fit_of:
            ties = np.stack([tie_copies(prob, key, opt.variant.zero) for opt in opts])
            fit_of[key] = _option_limits(prob, key, costs, ties, in_fl)
        cand.rmax = list(np.where(np.isfinite(np.stack(cand.period)), fit_of[key], 0))
        _drop_dominated(cand)
        cand.make_band()
        prob.cand[(key, link)] = cand
    # the stages-left count matters only up to 1 + the largest limit below the cap
    limits = [int(np.max(arr, initial=0, where=(arr >= 1) & (arr < r_hi))) for c in prob.cand.values()
              for arr in c.rmax]
    counted = prob.stages_exact is not None or prob.stages_max is not None  # every count up to r_hi, exactly
    prob.r_eff = r_hi if counted else min(r_hi, 1 + max(limits, default=0))


def _option_limits(prob: Problem, key: int, costs: list[tuple[StageTables, VariantCost]], ties: np.ndarray,
                   in_fl: np.ndarray) -> np.ndarray:
    """:func:`_fit_limit` of every option of grid ``key`` at once (stacked), against its smallest memory;
    ``ties``: each option's :func:`tie_copies`."""
    cap = prob.grids[key].group.memory_bytes if prob.capacity_override is None else prob.capacity_override
    shape = costs[0][1].time.shape
    static, act, work, weight, copy = (np.stack([np.broadcast_to(x, shape) for x in xs]) for xs in zip(
        *((v.static, v.act, v.workspace, t.agg["weight"], v.transient) for t, v in costs), strict=True))
    finite = np.isfinite(np.stack([v.time for _, v in costs]))
    rmax = _fit_limit(prob, static, act, work, weight, ties, cap, in_fl, finite)
    step_fits = np.ceil(static) + np.broadcast_to(ties, static.shape) + np.ceil(copy) <= cap
    return np.where(step_fits, rmax, 0)


def _drop_dominated(cand: Candidate) -> None:
    """Remove (in place) the options another one beats everywhere: period and max term no larger and
    memory fitting at least as many stages left, for every stage range (of equal ones the first stays).
    The DP takes, per range, the least period among the options that fit under the cap, so a dominated
    option never decides a plan's objective: the optimum is unchanged."""
    n = len(cand.options)
    step = max(cand.period[0].size // 64, 1)
    period, term, rmax = (np.stack([x.ravel()[::step] for x in xs]) for xs in (cand.period, cand.term, cand.rmax))
    # beats[j, i]: option j no worse than option i -- on a sample of ranges first (most pairs fail there)
    beats = np.stack([np.all(period[j] <= period, axis=1) & np.all(term[j] <= term, axis=1)
                      & np.all(rmax[j] >= rmax, axis=1) for j in range(n)])
    for j, i in np.argwhere(beats & ~np.eye(n, dtype=bool)):
        beats[j, i] = bool(np.all(cand.period[j] <= cand.period[i]) and np.all(cand.term[j] <= cand.term[i])
                           and np.all(cand.rmax[j] >= cand.rmax[i]))
    keep = [i for i in range(n) if not any(j != i and beats[j, i] and (j < i or not beats[i, j]) for j in range(n))]
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


def _fit_limit(prob: Problem, static: np.ndarray, act: np.ndarray, work: np.ndarray, weight: np.ndarray,
               ties: np.ndarray, cap: float, in_fl: np.ndarray, finite: np.ndarray) -> np.ndarray:
    """Per stage range (of every option, stacked): the largest stages-left count r (1..) whose in-flight
    micro-batches (``in_fl``: per start block, :func:`in_flight_counts`) fit ``cap``, from the static bytes,
    activations per micro-batch, workspace and weights."""
    out = np.zeros(finite.shape, dtype=np.int64)
    ties = np.broadcast_to(ties, finite.shape)  # only ranges that exist are computed
    start = np.broadcast_to(np.arange(finite.shape[1])[None, :, None], finite.shape)[finite]
    static, act, work, weight, ties = (x[finite] for x in (static, act, work, weight, ties))
    static = np.ceil(static) + ties
    act, work, wt = np.ceil(act), np.ceil(work), np.ceil(weight)
    if schedule_kind(prob.schedule).stashes_weights:  # one weight version per extra micro-batch in flight
        static, act = static - wt, act + wt
    rows, row_of = np.unique(np.asarray(in_fl), axis=0, return_inverse=True)
    which = np.asarray(row_of).ravel()[start]
    rmax = np.zeros(static.shape, dtype=np.int64)
    for i, counts in enumerate(rows):  # the ranges whose start block holds these counts
        sel = which == i
        rmax[sel] = _counts_limit(static[sel], act[sel], work[sel], cap, counts)
    out[finite] = rmax
    return out


def _counts_limit(static: np.ndarray, act: np.ndarray, work: np.ndarray, cap: float, counts: np.ndarray
                  ) -> np.ndarray:
    """The largest r (1..) whose ``counts[r - 1]`` micro-batches in flight fit ``cap`` (0: none)."""
    if np.all(np.diff(counts) >= 0):  # memory grows with r: rmax = how many counts fit
        with np.errstate(divide="ignore", invalid="ignore"):
            k_max = np.where(act > 0, np.floor((cap - static - work) / np.where(act > 0, act, 1.0)),
                             np.where(static + work <= cap, np.inf, -1.0))
        rmax = np.searchsorted(counts, k_max, side="right").astype(np.int64)
        exact = static + np.take(counts, np.maximum(rmax - 1, 0)) * act + work <= cap  # guard rounding
        rmax = np.where((rmax > 0) & ~exact, rmax - 1, rmax)
    else:
        rmax = np.zeros(np.broadcast(static, act).shape, dtype=np.int64)
        for r, k in enumerate(counts, start=1):
            rmax = np.where((static + k * act + work <= cap) & (rmax == r - 1), r, rmax)
    return rmax


def in_flight_counts(prob: Problem, r_hi: int) -> np.ndarray:
    """Micro-batches in flight on a stage with r = 1..r_hi stages left (its own included), per block it starts
    at: shape (blocks + 1, r_hi).

    Where the count depends on the stage count K itself (zb-h1: min(K, M) on every stage), which the DP does
    not track, a stage is held to the largest count over every K it could be part of: K = s + r with s stages
    before it, each of a block at least, so s is at most the block it starts at. Exact for the first stage
    (a plan of one stage holds one micro-batch, not M) and for every K from min(M, r_hi) on."""
    nb, m, schedule = prob.nb, prob.microbatches, prob.schedule
    k_fixed = prob.stages_exact
    if k_fixed is not None:  # exact: stage s = K - r of K
        exact = [in_flight_microbatches(schedule, k_fixed, m, k_fixed - r) for r in range(1, r_hi + 1)]
        return np.tile(np.asarray(exact, dtype=np.int64), (nb + 1, 1))
    row = np.asarray([in_flight_microbatches(schedule, r, m, 0) for r in range(1, r_hi + 1)], dtype=np.int64)
    out = np.tile(row, (nb + 1, 1))
    if not memory_depends_on_k(schedule, m, min(r_hi, 16)):
        return out
    for a in range(1, nb + 1):  # a stage at block a may have a stages before it (K up to r + a, at most r_hi)
        out[a] = out[a - 1]
        if a + 1 > r_hi:
            continue
        later = np.asarray([in_flight_microbatches(schedule, r + a, m, a) for r in range(1, r_hi - a + 1)])
        out[a, :r_hi - a] = np.maximum(out[a, :r_hi - a], later)
    return out


def memory_depends_on_k(schedule: str, microbatches: int, max_stages: int) -> bool:
    """Whether a stage's micro-batches in flight depend on more than the stages after it."""
    for k in range(1, max_stages + 1):
        for s in range(k):
            if in_flight_microbatches(schedule, k, microbatches, s) != \
                    in_flight_microbatches(schedule, k - s, microbatches, 0):
                return True
    return False


def link_of(cluster: ir.Cluster, link: int) -> ir.Link:
    return cluster.link("intra_node" if link == INTRA else "inter_node")


def tie_copies(prob: Problem, key: int, zero: int) -> np.ndarray:
    """``out[a, b]``: bytes of tied-weight copies a stage [bounds[a], bounds[b]) on grid ``key`` at ZeRO
    ``zero`` keeps on each device besides the layers' own (it holds a tied layer but not the one the tie
    is counted in): laid out as the stage runs its tied layer (planner.costmodel.stage.tie_copy_on), in
    the leanest form open to that layer on the grid, which the stage's leanest forms take; the judge
    charges the form the plan's stage runs (planner.costmodel.stage.with_ties). Worked out once per grid
    and ZeRO stage (``Problem.ties``): every ZeRO stage of a grid from one layer table."""
    if (key, zero) not in prob.ties:
        out = {z: np.zeros((prob.nb + 1, prob.nb + 1)) for z in range(4)}
        if prob.profile.ties:
            table = layer_table(prob.profile, prob.grids[key], prob.microbatches, prob.optimizer, prob.forms,
                                prob.space.rules)
            for z in out:
                out[z] = _ties_on(prob, table, z)
        prob.ties.update({(key, z): v for z, v in out.items()})
    return prob.ties[key, zero]


def _ties_on(prob: Problem, table: LayerTable, zero: int) -> np.ndarray:
    """:func:`tie_copies` from a grid's layer table."""
    out = np.zeros((prob.nb + 1, prob.nb + 1))
    starts, ends = prob.bounds[:, None], prob.bounds[None, :]
    for tie in prob.profile.ties:
        owner = tie.layers[0]
        forms = [f for layer in tie.layers[1:] for f in np.flatnonzero(table.allowed[layer])]
        copy = min((tie_copy_on(prob.profile, tie, table, int(f), zero) for f in forms), default=0.0)
        holds_owner = (starts <= owner) & (owner < ends)
        holds_other = np.zeros_like(holds_owner)
        for layer in tie.layers[1:]:
            holds_other |= (starts <= layer) & (layer < ends)
        out += np.where(holds_other & ~holds_owner, copy, 0.0)
    return out


def p2p_times(prob: Problem, link: int, dp: int = 1) -> np.ndarray:
    """Per start block: the time its stage's input takes to arrive over ``link`` (0 for block 0), each
    of the stage's ``dp`` replicas receiving its share of the micro-batch on its own links
    (planner.costmodel.stage)."""
    nbytes = Bytes.of(prob.profile, prob.space.precision, prob.optimizer)
    out_b = np.array([float(x.output_bytes) for x in prob.profile.layers]) * nbytes.activation_scale
    recv = np.zeros(prob.nb + 1)
    for a in range(1, prob.nb):
        layer = int(prob.bounds[a]) - 1
        recv[a] = p2p_s(out_b[layer] / (prob.microbatches * dp), link_of(prob.cluster, link))
    return recv

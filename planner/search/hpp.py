"""HPP, Algorithm 1 of PipePar: the cheapest per-layer forms of layers i..j on a stage grid.

A chain dynamic program over the layers with one state per form (dp, split_in, split_out,
tp; planner.costmodel.layers): 4 states, 16 transitions per layer. The cost of a stage under
a sequence of forms is its busy time per iteration, ``M * (per-micro-batch forward +
backward + collectives + re-layouts) + (gradient synchronisation)`` (the collective's
latency is paid once whatever the forms, so it does not change the choice). The stage's
input and output are batch-sharded, so entering and leaving sharded forms at its ends costs
a re-layout too.

Memory-aware choice: besides the fastest forms (``lean=False``), HPP gives the leanest
(``lean=True``: least weights, gradients, optimizer state and activations per device, time
breaking ties), so the stage DP can trade time against memory per stage (a two-point
Pareto set: planner.search.sp).

Two entry points share the recurrence: :func:`hpp` (one range, returns the forms) and
:func:`stage_tables` (every range between the given boundaries at once, vectorised over the
start, returning the aggregates the stage DP needs). Ties go to the lower form index (dp
first) in both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from planner import ir
from planner.costmodel import KEYS, MAX_KEYS, NF, SHARDED, LayerTable

_CHANGE = np.array([[SHARDED[a] != SHARDED[b] for b in range(NF)] for a in range(NF)], dtype=float)
_ENTER_FWD = np.array([[not SHARDED[a] and SHARDED[b] for b in range(NF)] for a in range(NF)], dtype=float)
_ENTER_BWD = np.array([[SHARDED[a] and not SHARDED[b] for b in range(NF)] for a in range(NF)], dtype=float)
_SPLIT = SHARDED.astype(float)
"""1 for the sharded forms: their re-layout at a stage's ends (the stage's input and output are batch-sharded)."""

LEAN_WEIGHT = 1e3
"""In the lean objective, memory outweighs time by this factor at the table's own scales."""


def memory_weight(table: LayerTable, microbatches: int, lean: bool) -> float:
    """Seconds per byte that the lean objective charges (0 for the fastest forms)."""
    if not lean:
        return 0.0
    time_scale = float(np.sum(microbatches * (table.fwd[:, 0] + table.bwd[:, 0]) + table.sync[:, 0]))
    mem_scale = float(np.sum(table.static[0, :, 0] + table.act[:, 0]))
    return LEAN_WEIGHT * max(time_scale, 1e-12) / max(mem_scale, 1.0)


def _layer_cost(table: LayerTable, layer: int, microbatches: int, mem_w: float) -> np.ndarray:
    """Objective of running ``layer`` in each form (inf where the form is closed)."""
    c = microbatches * (table.fwd[layer] + table.bwd[layer]) + table.sync[layer]
    if mem_w:
        c = c + mem_w * (table.static[0, layer] + table.act[layer])
    return np.where(table.allowed[layer], c, np.inf)


def hpp(table: LayerTable, first: int, end: int, microbatches: int, lean: bool = False
        ) -> tuple[tuple[str, ...], float]:
    """Algorithm 1: the cheapest (or leanest) forms of layers [first, end) and their objective."""
    if not 0 <= first < end <= len(table.fwd):
        raise ValueError(f"bad layer range [{first}, {end})")
    m, mem_w = microbatches, memory_weight(table, microbatches, lean)
    cost = np.empty((end - first, NF))
    back = np.zeros((end - first, NF), dtype=int)
    cost[0] = m * table.enter[first] * _SPLIT + _layer_cost(table, first, m, mem_w)
    for k, layer in enumerate(range(first + 1, end), start=1):
        trans = cost[k - 1][:, None] + m * table.enter[layer] * _CHANGE  # [from, to]
        back[k] = np.argmin(trans, axis=0)
        cost[k] = trans[back[k], np.arange(NF)] + _layer_cost(table, layer, m, mem_w)
    last = cost[-1] + m * table.leave[end - 1] * _SPLIT
    f = int(np.argmin(last))
    total = float(last[f])
    forms = [f]
    for k in range(end - first - 1, 0, -1):
        f = int(back[k, f])
        forms.append(f)
    return tuple(ir.ALL_FORMS[x] for x in reversed(forms)), total


@dataclass(frozen=True)
class StageTables:
    """Every stage [bounds[a], bounds[b]) on one grid under its HPP forms.

    ``agg[key]`` arrays are (nb+1, nb+1) indexed [a, b] (``time`` inf where b <= a or no form
    sequence is open; the others 0 there); ``in_bytes`` the stage input per micro-batch and
    device (for full recomputation); ``lean`` whether these are the leanest forms.
    """

    agg: dict[str, np.ndarray]
    in_bytes: np.ndarray
    lean: bool = False
    sync_const: float = 0.0
    """The table's gradient-synchronisation latency (planner.costmodel.LayerTable.sync_const)."""
    blockwise: bool = False
    """Whether full recomputation checkpoints each layer (planner.costmodel.LayerTable.blockwise)."""

    @property
    def time(self) -> np.ndarray:
        return self.agg["time"]


def stage_tables(table: LayerTable, bounds: Sequence[int] | np.ndarray, microbatches: int,
                 lean: bool = False) -> StageTables:
    """HPP for every range between ``bounds`` at once (vectorised over the start)."""
    return stage_tables_many([table], bounds, microbatches, [lean])[0]


def stage_tables_many(tables: Sequence[LayerTable], bounds: Sequence[int] | np.ndarray, microbatches: int,
                      lean: Sequence[bool]) -> list[StageTables]:
    """:func:`stage_tables` of several tables of one profile at once (one sweep over the layers for all)."""
    b = np.asarray(bounds)
    nb = len(b) - 1
    out: list[StageTables | None] = [None] * len(tables)
    swept = [i for i, t in enumerate(tables) if not only_dp(t)]
    for i, t in enumerate(tables):
        if i not in swept:  # every layer dp: prefix sums
            out[i] = StageTables(_dp_only(t, b), _in_bytes(t, b, nb), lean[i], t.sync_const, t.blockwise)
    if swept:
        mem_w = [memory_weight(tables[i], microbatches, lean[i]) for i in swept]
        res = _chain_sweep([tables[i] for i in swept], b, microbatches, mem_w)
        for g, i in enumerate(swept):
            t = tables[i]
            out[i] = StageTables({k: res[g, x] for x, k in enumerate(KEYS)}, _in_bytes(t, b, nb), lean[i],
                                 t.sync_const, t.blockwise)
    return [x for x in out if x is not None]


def only_dp(table: LayerTable) -> bool:
    """Whether every layer runs the dp form and nothing else (the stage tables are prefix sums)."""
    return bool(table.allowed[:, 0].all() and not table.allowed[:, 1:].any())


def _in_bytes(table: LayerTable, b: np.ndarray, nb: int) -> np.ndarray:
    in_b = np.zeros(nb + 1)
    in_b[:nb] = table.in_bytes[b[:nb]] / table.n
    return in_b


def _layer_costs(table: LayerTable, microbatches: int, mem_w: float) -> np.ndarray:
    """:func:`_layer_cost` of every layer at once: (layers, forms)."""
    c = microbatches * (table.fwd + table.bwd) + table.sync
    if mem_w:
        c = c + mem_w * (table.static[0] + table.act)
    return np.where(table.allowed, c, np.inf)


def _chain_sweep(tables: Sequence[LayerTable], b: np.ndarray, m: int, mem_w: Sequence[float]) -> np.ndarray:
    """``res[g, key, a, j]``: the aggregates of stage [b[a], b[j]) of table g under its best forms (time
    inf where none).

    One pass over the layers carries, per start ``a`` begun so far, table and form of the last layer,
    the cheapest chain's cost (``cost[a, g, form]``) and its aggregates (``agg[a, g, :, form]``). The
    start comes first so that the starts begun are one contiguous block, whose forms are picked by flat
    indices made once (the arrays are small: numpy's per-call set-up would dominate).
    """
    nb, n_t = len(b) - 1, len(tables)
    lcs = np.stack([_layer_costs(t, m, w) for t, w in zip(tables, mem_w, strict=True)])  # (g, layer, form)
    rows = np.stack([t.agg_rows for t in tables])  # (g, key, layer, form)
    enter = np.stack([t.enter for t in tables])  # (g, layer)
    leave = np.stack([t.leave for t in tables])
    cost = np.full((nb, n_t, NF), np.inf)
    agg = np.zeros((nb, n_t, len(KEYS), NF))
    res = np.zeros((n_t, len(KEYS), nb + 1, nb + 1))
    res[:, 0] = np.inf
    pick = _Pick(n_t, nb)
    start_of = {int(x): a for a, x in enumerate(b[:nb])}
    end_of = {int(x): j for j, x in enumerate(b) if j > 0}
    active = 0  # starts [0, active) have begun
    for layer in range(int(b[-1])):
        ent = enter[:, layer]
        if active:
            _extend_chains(cost[:active], agg[:active], m, ent, lcs[:, layer], rows[:, :, layer], pick)
        if layer in start_of:
            a = start_of[layer]
            cost[a] = m * ent[:, None] * _SPLIT + lcs[:, layer]
            agg[a] = rows[:, :, layer]
            agg[a, :, 0] += ent[:, None] * _SPLIT
            agg[a, :, 1] += ent[:, None] * _SPLIT
            active = a + 1
        if layer + 1 in end_of:
            j = end_of[layer + 1]
            closed = _close_stages(cost[:j], agg[:j], m, leave[:, layer, None] * _SPLIT, pick)  # (start, g, key)
            res[:, :, :j, j] = closed.transpose(1, 2, 0)
    return res


class _Pick:
    """Picks one form per (start, table, key) from the contiguous leading block of starts of an array
    (start, table, key, form) by flat indices made once: what ``np.take_along_axis`` does, without its
    per-call set-up."""

    def __init__(self, n_t: int, nb: int) -> None:
        self.rows = (np.arange(nb * n_t * len(KEYS)) * NF).reshape(nb, n_t, len(KEYS), 1)

    def __call__(self, agg: np.ndarray, arg: np.ndarray) -> np.ndarray:
        """``out[a, g, key, i] = agg[a, g, key, arg[a, g, i]]``."""
        out: np.ndarray = agg.ravel()[self.rows[:len(agg)] + arg[:, :, None, :]]
        return out


_COLS = np.arange(NF)


def _extend_chains(cost: np.ndarray, agg: np.ndarray, m: int, enter: np.ndarray, lc: np.ndarray,
                   add: np.ndarray, pick: _Pick) -> None:
    """Add one layer to every begun chain of every table (in place): best previous form per form,
    re-layout if it changes. ``cost`` (start, g, form), ``agg`` (start, g, key, form), ``enter`` (g,),
    ``lc`` (g, form), ``add`` (g, key, form)."""
    trans = cost[:, :, :, None] + (m * enter)[None, :, None, None] * _CHANGE  # [start, g, from, to]
    arg = np.argmin(trans, axis=2)  # [start, g, to]
    cost[:] = trans.min(axis=2) + lc[None]
    ef = _ENTER_FWD[arg, _COLS] * enter[None, :, None]
    eb = _ENTER_BWD[arg, _COLS] * enter[None, :, None]
    picked = pick(agg, arg)
    agg[:] = picked + add[None]
    agg[:, :, MAX_KEYS] = np.maximum(picked[:, :, MAX_KEYS], add[None, :, MAX_KEYS])
    agg[:, :, 0] += ef + eb
    agg[:, :, 1] += ef


def _close_stages(cost: np.ndarray, agg: np.ndarray, m: int, leave: np.ndarray, pick: _Pick) -> np.ndarray:
    """``out[a, g, key]``: every stage from start ``a`` ending here, with the best last form and its
    re-layout out (time inf where no form is open). ``cost`` (start, g, form), ``agg`` (start, g, key,
    form), ``leave`` (g, form)."""
    last = cost + m * leave[None]
    arg1 = np.argmin(last, axis=2)  # (start, g)
    ok = np.isfinite(last.min(axis=2))
    out = pick(agg, arg1[:, :, None])[..., 0]
    out[:, :, 0] = np.where(ok, out[:, :, 0] + leave[np.arange(len(leave))[None, :], arg1], np.inf)
    return out


def _dp_only(table: LayerTable, b: np.ndarray) -> dict[str, np.ndarray]:
    rows = np.stack([table.rows(layer)[:, 0] for layer in range(len(table.fwd))], axis=1)  # (keys, layers)
    out = {}
    upper = None
    for i, k in enumerate(KEYS):
        pre = np.concatenate([[0.0], np.cumsum(rows[i])])[b]
        diff = _range_max(rows[i], b) if i in MAX_KEYS else pre[None, :] - pre[:, None]
        if upper is None:
            upper = np.triu(np.ones_like(diff, dtype=bool), k=1)
        out[k] = np.where(upper, diff, np.inf if k == "time" else 0.0)
    return out


def _range_max(row: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``out[a, j]``: the largest of ``row`` over layers ``[b[a], b[j])`` (0 where empty)."""
    out = np.zeros((len(b), len(b)))
    for a in range(len(b) - 1):
        running = np.maximum.accumulate(row[b[a]:b[-1]])
        ends = b[a + 1:] - b[a] - 1
        out[a, a + 1:] = running[ends]
    return out

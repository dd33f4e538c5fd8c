"""HPP, Algorithm 1 of PipePar: the cheapest per-layer forms of layers i..j on n devices.

A chain dynamic program over the layers with one state per form (dp, split_in,
split_out): 3 states, 9 transitions per layer. The cost of a stage under a sequence of
forms is its busy time per iteration, ``M * (per-micro-batch forward + backward +
collectives + re-layouts) + coef * (gradient bytes all-reduced)`` (the all-reduce's latency
term is paid once whatever the forms, so it does not change the choice; see
planner.costmodel for every term). The stage's input and output are batch-sharded, so
entering and leaving split forms at its ends costs a re-layout too.

Two entry points share the recurrence: :func:`hpp` (one range, returns the forms) and
:func:`stage_tables` (every range between the given boundaries at once, vectorised over
the start, returning the aggregates the stage DP needs). Ties go to the lower form index
(dp first) in both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from planner import ir
from planner.costmodel import DP, LayerTable

_CHANGE = np.array([[(a == DP) != (b == DP) for b in range(3)] for a in range(3)], dtype=float)
_ENTER_FWD = np.array([[a == DP and b != DP for b in range(3)] for a in range(3)], dtype=float)
_ENTER_BWD = np.array([[a != DP and b == DP for b in range(3)] for a in range(3)], dtype=float)


def _layer_cost(table: LayerTable, layer: int, microbatches: int) -> np.ndarray:
    """Objective of running ``layer`` in each form (inf where the form is closed)."""
    c = microbatches * (table.fwd[layer] + table.bwd[layer]) + table.ar_coef * table.ar_bytes[layer]
    return np.where(table.allowed[layer], c, np.inf)


def hpp(table: LayerTable, first: int, end: int, microbatches: int) -> tuple[tuple[str, ...], float]:
    """Algorithm 1: the cheapest forms of layers [first, end) and their objective."""
    if not 0 <= first < end <= len(table.fwd):
        raise ValueError(f"bad layer range [{first}, {end})")
    m = microbatches
    cost = np.empty((end - first, 3))
    back = np.zeros((end - first, 3), dtype=int)
    enter0 = m * table.enter[first] * np.array([0.0, 1.0, 1.0])
    cost[0] = enter0 + _layer_cost(table, first, m)
    for k, layer in enumerate(range(first + 1, end), start=1):
        trans = cost[k - 1][:, None] + m * table.enter[layer] * _CHANGE  # [from, to]
        back[k] = np.argmin(trans, axis=0)
        cost[k] = trans[back[k], np.arange(3)] + _layer_cost(table, layer, m)
    last = cost[-1] + m * table.leave[end - 1] * np.array([0.0, 1.0, 1.0])
    f = int(np.argmin(last))
    total = float(last[f])
    forms = [f]
    for k in range(end - first - 1, 0, -1):
        f = int(back[k, f])
        forms.append(f)
    return tuple(ir.FORMS[x] for x in reversed(forms)), total


@dataclass(frozen=True)
class StageTables:
    """Every stage [bounds[a], bounds[b]) on one group shape under its HPP forms.

    Arrays are (nb+1, nb+1) indexed [a, b] (inf/0 where b <= a): ``time`` forward +
    backward per micro-batch (collectives and re-layouts included), ``fwd`` its forward
    part, ``ar_bytes`` gradient bytes all-reduced, ``static``/``weight``/``act`` memory
    per device (optimizer state included in ``static``; ``act`` per micro-batch);
    ``in_bytes`` the stage input per micro-batch and device (for recomputation).
    """

    time: np.ndarray
    fwd: np.ndarray
    ar_bytes: np.ndarray
    static: np.ndarray
    weight: np.ndarray
    act: np.ndarray
    in_bytes: np.ndarray


_KEYS = ("time", "fwd", "ar_bytes", "static", "weight", "act")
"""The aggregates of StageTables other than ``in_bytes``, in the order of the sweep's arrays."""
_SPLIT = np.array([0.0, 1.0, 1.0])
"""1 for the split forms: their re-layout at a stage's ends (the stage's input and output are batch-sharded)."""


def stage_tables(table: LayerTable, bounds: Sequence[int] | np.ndarray, microbatches: int) -> StageTables:
    """HPP for every range between ``bounds`` at once (vectorised over the start)."""
    b = np.asarray(bounds)
    nb = len(b) - 1
    in_b = np.zeros(nb + 1)
    in_b[:nb] = table.in_bytes[b[:nb]] / table.n
    if not table.allowed[:, 1:].any():  # every layer dp: prefix sums
        out = {k: np.zeros((nb + 1, nb + 1)) for k in _KEYS}
        out["time"][:] = np.inf
        _dp_only(table, b, out)
        return StageTables(in_bytes=in_b, **out)
    res = _chain_sweep(table, b, microbatches)
    return StageTables(in_bytes=in_b, **{k: res[i] for i, k in enumerate(_KEYS)})


def _chain_sweep(table: LayerTable, b: np.ndarray, m: int) -> np.ndarray:
    """``res[key, a, j]``: the aggregates of stage [b[a], b[j]) under its best forms (time inf where none).

    One pass over the layers carries, per start ``a`` begun so far and per form of the last
    layer, the cheapest chain's cost (``cost[a, form]``) and its aggregates (``agg[:, a, form]``).
    """
    nb = len(b) - 1
    cost = np.full((nb, 3), np.inf)
    agg = np.zeros((len(_KEYS), nb, 3))  # aggregates of the best chain per (start, last form)
    res = np.zeros((len(_KEYS), nb + 1, nb + 1))
    res[0] = np.inf
    start_of = {int(x): a for a, x in enumerate(b[:nb])}
    end_of = {int(x): j for j, x in enumerate(b) if j > 0}
    active = 0  # starts [0, active) have begun
    for layer in range(int(b[-1])):
        lc = _layer_cost(table, layer, m)
        f_, b_ = table.fwd[layer], table.bwd[layer]
        add = np.stack([f_ + b_, f_, table.ar_bytes[layer], table.static[layer], table.weight[layer],
                        table.act[layer]])
        enter = table.enter[layer]
        if active:
            _extend_chains(cost[:active], agg[:, :active], m, enter, lc, add)
        if layer in start_of:
            a = start_of[layer]
            cost[a] = m * enter * _SPLIT + lc
            agg[:, a] = add
            agg[0, a] += enter * _SPLIT
            agg[1, a] += enter * _SPLIT
            active = a + 1
        if layer + 1 in end_of:
            j = end_of[layer + 1]
            _close_stages(res[:, :j, j], cost[:j], agg[:, :j], m, table.leave[layer] * _SPLIT)
    return res


def _extend_chains(cost: np.ndarray, agg: np.ndarray, m: int, enter: float, lc: np.ndarray,
                   add: np.ndarray) -> None:
    """Add one layer to every begun chain (in place): best previous form per form, re-layout if it changes."""
    rows = np.arange(len(cost))[:, None]
    cols3 = np.arange(3)[None, :]
    trans = cost[:, :, None] + m * enter * _CHANGE[None]  # [start, from, to]
    arg = np.argmin(trans, axis=1)  # [start, to]
    new_cost = trans[rows, arg, cols3] + lc
    ef = _ENTER_FWD[arg, cols3] * enter
    eb = _ENTER_BWD[arg, cols3] * enter
    agg[:] = agg[:, rows, arg] + add[:, None, :]
    agg[0] += ef + eb
    agg[1] += ef
    cost[:] = new_cost


def _close_stages(res: np.ndarray, cost: np.ndarray, agg: np.ndarray, m: int, leave: np.ndarray) -> None:
    """Write ``res[:, a]`` (in place) for every stage ending here: the best last form with its re-layout out."""
    last = cost + m * leave
    arg1 = np.argmin(last, axis=1)
    r1 = np.arange(len(cost))
    ok = np.isfinite(last[r1, arg1])
    res[:] = agg[:, r1, arg1]
    res[0] += leave[arg1]
    res[0] = np.where(ok, res[0], np.inf)


def _dp_only(table: LayerTable, b: np.ndarray, out: dict[str, np.ndarray]) -> None:
    cols = {"time": table.fwd[:, DP] + table.bwd[:, DP], "fwd": table.fwd[:, DP], "ar_bytes": table.ar_bytes[:, DP],
            "static": table.static[:, DP], "weight": table.weight[:, DP], "act": table.act[:, DP]}
    for k, v in cols.items():
        pre = np.concatenate([[0.0], np.cumsum(v)])[b]
        diff = pre[None, :] - pre[:, None]
        upper = np.triu(np.ones_like(diff, dtype=bool), k=1)
        out[k][:] = np.where(upper, diff, np.inf if k == "time" else 0.0)

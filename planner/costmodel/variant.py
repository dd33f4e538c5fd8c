"""A stage's memory-for-time choices: recomputation and ZeRO, as one formula for the DP and the scalar model.

Pure (numpy; every function takes floats or arrays alike, so the stage DP's vectorised tables
and the scalar cost of one stage come from the same definition).

- Recomputation (per stage): ``none`` keeps every activation; ``selective`` recomputes the
  attention core (Korthikanti et al. 2022, section 4.2): activations ``act_sel``, backward
  plus ``core``; ``full`` keeps only the stage input per micro-batch and redoes the forward
  in backward (GPipe, Huang et al. 2019, section 2.3; Chen et al. 2016), needing one
  micro-batch's activations as workspace during a backward. Layers after the model's last
  transformer block (final norm, logits head: ``fwd_head``, ``act_head``) are not redone and
  keep their activations, as in Megatron-LM's and torchtitan's full activation checkpointing,
  which wrap the transformer layers only (``ModelProfile.recomputed_layers``; the exported
  engines checkpoint the same layers).
- ZeRO over the data-parallel group (Rajbhandari et al. SC'20, sections 5 and 7), with
  ``A`` the gradient all-reduce of the stage (reduce-scatter + all-gather, ``2 Psi``) and
  ``H = A / 2`` one reduce-scatter or all-gather (``Psi``): stage 0 and 1 pay ``A`` per
  iteration (1 shards the optimizer state: the same volume, ZeRO section 7.2.1); stage 2
  also shards the gradients, so with ``M`` micro-batches each of the other ``M - 1``
  backwards reduce-scatters its gradient (``A + (M-1) H``); stage 3 shards the weights
  too: every micro-batch all-gathers them in forward and again in backward and
  reduce-scatters the gradient (``3 Psi`` per micro-batch and iteration, section 7.2.2):
  ``H`` added to each forward and backward and ``M H`` per iteration. Memory of each stage
  is in the table's ``static<z>``. An engine whose ZeRO-1 moves more than the paper's ``A``
  pays its extra share of ``A`` too (``gather_share``: torch's, whose gradients are all-reduced
  and whose ZeroRedundancyOptimizer then broadcasts every parameter from the rank that stepped
  it, an all-gather's volume more: ``A + H``; :data:`planner.runnable.ENGINES`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Variant:
    """One stage's choice of recomputation and ZeRO stage."""

    recompute: str = "none"
    zero: int = 0


def variants(recompute: Iterable[str], zero: Iterable[int], dp: int) -> list[Variant]:
    """Every (recompute, zero) pair allowed; ZeRO > 0 only with a data-parallel group of 2 or more.

    ZeRO 0 is left out when 1 is allowed: stage 1 moves the same bytes and keeps less
    (it can only be as fast and is leaner; section 7.2.1 of the ZeRO paper).
    """
    zs = sorted({z for z in zero if z == 0 or dp > 1}) or [0]
    if 1 in zs and 0 in zs:
        zs.remove(0)
    return [Variant(r, z) for r, z in itertools.product(recompute, zs)]


@dataclass(frozen=True)
class VariantCost:
    """A stage under a variant, per micro-batch and device (arrays or floats): forward+backward,
    its forward part, gradient synchronisation per iteration, static memory, activations kept
    per micro-batch in flight, and workspace during a backward."""

    time: Any
    fwd: Any
    sync: Any
    static: Any
    act: Any
    workspace: Any


def variant_cost(agg: Mapping[str, Any], in_bytes: Any, variant: Variant, microbatches: int,
                 sync_const: float, gather_share: float = 0.0) -> VariantCost:
    """The stage's costs under ``variant`` from its aggregates (planner.search.hpp.KEYS);
    ``gather_share``: the engine's ZeRO-1 communication beyond ``A``, as a share of it (module doc)."""
    sync = agg["sync"]
    whole = sync + np.where(sync > 0, sync_const, 0.0)
    half = whole / 2.0
    time, fwd = agg["time"], agg["fwd"]
    if variant.zero == 3:
        time, fwd, whole = time + 2.0 * half, fwd + half, microbatches * half
    elif variant.zero == 2:
        whole = whole + (microbatches - 1) * half
    elif variant.zero == 1:
        whole = whole * (1.0 + gather_share)
    if variant.recompute == "full":
        time, act, work = time + fwd - agg["fwd_head"], in_bytes + agg["act_head"], agg["act"] - agg["act_head"]
    elif variant.recompute == "selective":
        time, act, work = time + agg["core"], agg["act_sel"], 0.0 * in_bytes
    else:
        act, work = agg["act"], 0.0 * in_bytes
    return VariantCost(time, fwd, whole, agg[f"static{variant.zero}"], act, work)

"""When nothing fits: the smallest per-device memory some plan of the space would need, and the error.

Pure. :func:`needed_memory` bisects a capacity override over the problem's own tables (the
same space and memory model as the search), so the number the error prints is one the
search would accept.
"""

from __future__ import annotations

import math

from planner.errors import InfeasibleError
from planner.search.sp import solve_cap
from planner.search.space import Problem
from planner.search.tables import build_candidates


def needed_memory(prob: Problem, rounds: int = 40) -> int | None:
    """The smallest per-device memory with which some plan of this space fits (bisection)."""
    hi = 1.0
    saved = prob.capacity_override
    try:
        for _ in range(80):
            prob.capacity_override = hi
            build_candidates(prob)
            if solve_cap(prob, math.inf) is not None:
                break
            hi *= 2
        else:
            return None
        lo = hi / 2
        for _ in range(rounds):
            mid = (lo + hi) / 2
            prob.capacity_override = mid
            build_candidates(prob)
            if solve_cap(prob, math.inf) is not None:
                hi = mid
            else:
                lo = mid
        return math.ceil(hi)
    finally:
        prob.capacity_override = saved
        build_candidates(prob)


def infeasible_error(prob: Problem) -> InfeasibleError:
    """The error for a problem with no plan that fits, with the memory that would be needed."""
    need = needed_memory(prob)
    have = min(g.memory_bytes for g in prob.cluster.gpus)
    gib = 1024**3
    cause = f"no plan fits in the devices' memory ({have / gib:.2f} GiB per device at most)"
    if need is not None:
        cause += f"; the best plan of this space needs {need / gib:.2f} GiB per device"
    tried = (f"tensor degrees {'auto' if prob.space.tp is None else prob.space.tp}, ZeRO "
             f"{'/'.join(map(str, prob.space.zero))} and recomputation {'/'.join(prob.space.recompute)} were tried")
    if prob.stages_max is not None:
        tried += (f", on at most {prob.stages_max} stages (the engine's schedule needs a micro-batch per stage: more "
                  "--microbatches allow more stages)")
    hint = ("add devices or use GPUs with more memory, use more micro-batches (--microbatches, smaller micro-batches "
            "keep fewer activations), a lighter --optimizer (sgd), --precision bf16, or a schedule with fewer "
            f"micro-batches in flight (1f1b); {tried}")
    return InfeasibleError(cause, hint, need)

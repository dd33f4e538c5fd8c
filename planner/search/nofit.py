"""When a search finds no plan: the least per-device memory some plan would need, and the errors.

Pure. :func:`needed_memory` bisects a capacity override over a problem's own tables (the
same space and memory model as the search), so the number the error prints is one the
search would accept. :func:`least_need_error` takes the least need over every problem the
search solved (one per micro-batch count, or per engine grid), names the plan that needs it,
and hints only at what the request does not already use (with, where the GPUs are alike, an
estimate of how many of them the need implies). :func:`no_width_shape` and
:func:`no_batch_shape`: when no grid gives whole micro-batches, which is why nothing was found.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from planner import ir
from planner.errors import InfeasibleError, PlanError
from planner.judge import memory_text
from planner.runnable import ENGINES as ENGINE_LIMITS
from planner.schedule import schedule_kind
from planner.search.counts import MAX_AUTO_MICROBATCHES
from planner.search.layout import divisors
from planner.search.options import Request
from planner.search.solutions import memory_plan
from planner.search.sp import Solution, solve_cap
from planner.search.space import Problem
from planner.search.tables import build_candidates


def _fits(prob: Problem, capacity: float) -> Solution | None:
    """The problem's fastest plan with every device holding ``capacity`` bytes (left set: callers restore it)."""
    prob.capacity_override = capacity
    build_candidates(prob)
    return solve_cap(prob, math.inf)


@contextmanager
def _probing(prob: Problem) -> Iterator[None]:
    """Capacities tried inside are undone after: the problem's own override and tables back."""
    saved = prob.capacity_override
    try:
        yield
    finally:
        prob.capacity_override = saved
        build_candidates(prob)


def _first_fit(prob: Problem) -> tuple[float, Solution] | None:
    """The first power of two (bytes) at which some plan fits, and that plan; None when none does below 2**80."""
    hi = 1.0
    for _ in range(80):
        sol = _fits(prob, hi)
        if sol is not None:
            return hi, sol
        hi *= 2
    return None


def _least_fit(prob: Problem, rounds: int, below: int | None) -> Need | None:
    """The smallest per-device memory with which some plan fits (bisection), with that plan; None when none fits
    at any memory, or, given ``below``, none fits with ``below`` bytes."""
    with _probing(prob):
        found = _first_fit(prob) if below is None else (
            None if (sol := _fits(prob, below)) is None else (float(below), sol))
        if found is None:
            return None
        hi, best = found
        lo = hi / 2 if below is None else 0.0
        for _ in range(rounds):
            mid = (lo + hi) / 2
            sol = _fits(prob, mid)
            if sol is not None:
                hi, best = mid, sol
            else:
                lo = mid
        return Need(math.ceil(hi), prob, best)


def needed_memory(prob: Problem, rounds: int = 40, below: int | None = None) -> int | None:
    """The smallest per-device memory with which some plan of this space fits (bisection); None when
    none fits at any memory, or, given ``below``, none fits with ``below`` bytes."""
    need = _least_fit(prob, rounds, below)
    return None if need is None else need.bytes


@dataclass(frozen=True)
class Need:
    """The least per-device memory of a search's problems, the problem and the plan that need it."""

    bytes: int
    prob: Problem
    solution: Solution


def least_need(probs: Sequence[Problem]) -> Need | None:
    """The least memory any of ``probs`` needs (:func:`needed_memory`) and its plan; None when none fits at any
    memory. Most micro-batches first (fewest activations: usually the least), then each other problem only
    where it fits in the least so far."""
    best: Need | None = None
    for prob in sorted(probs, key=lambda p: -p.microbatches):
        need = _least_fit(prob, 40, None if best is None else best.bytes)
        if need is not None and (best is None or need.bytes < best.bytes):
            best = need
    return best


def _counted_whole(need: Need, engine: str) -> Need:
    """``need`` at least its plan's peak with every stage's memory counted: the DP's bisection leaves out what
    depends on a stage's layers together (a tie's gradient made twice, torch's ZeRO-1 by whole tensors;
    planner.search.solutions), so the least memory it finds can be short of what that plan needs."""
    plan, _ = memory_plan(need.prob, need.solution, engine=engine, solver="dp")
    return dataclasses.replace(need, bytes=max(need.bytes, max(s.memory_bytes for s in plan.stages)))


def _per_stage(values: Iterable[object]) -> str:
    """One value when every stage has it, else each stage's, ``/``-separated."""
    shown = [str(v) for v in values]
    return shown[0] if len(set(shown)) == 1 else "/".join(shown)


def describe(prob: Problem, sol: Solution) -> str:
    """A DP solution in words: micro-batches and their size, GPUs per stage, tensor degree, ZeRO, recomputation."""
    m, batch = prob.microbatches, prob.profile.batch_size
    widths = [len(s.move.devices) for s in sol.stages]
    size = _per_stage(batch // (m * (w // s.move.tp)) for w, s in zip(widths, sol.stages, strict=True))
    text = (f"{m} micro-batch{'es' if m != 1 else ''} of {size} sample{'s' if size != '1' else ''} per "
            f"data-parallel rank, config {'-'.join(map(str, widths))} (GPUs per stage")
    text += f", {sum(widths)} of the {prob.devices} GPUs)" if sum(widths) < prob.devices else ")"
    return (text + f", tp {_per_stage(s.move.tp for s in sol.stages)}, ZeRO "
            f"{_per_stage(s.option.variant.zero for s in sol.stages)}, recomputation "
            f"{_per_stage(s.option.variant.recompute for s in sol.stages)}")


@dataclass(frozen=True)
class Tried:
    """What the search's problems covered together: ZeRO stages, recomputation modes, tensor degrees (None:
    every valid one) and micro-batch counts."""

    zero: tuple[int, ...]
    recompute: tuple[str, ...]
    tp: tuple[int, ...] | None
    counts: tuple[int, ...]

    @staticmethod
    def of(probs: Sequence[Problem]) -> Tried:
        spaces = [p.space for p in probs]
        modes = {m for s in spaces for m in s.recompute}
        tps = None if any(s.tp is None for s in spaces) else tuple(sorted({s.tp for s in spaces if s.tp}))
        return Tried(tuple(sorted({z for s in spaces for z in s.zero})), tuple(m for m in ir.RECOMPUTE if m in modes),
                     tps, tuple(sorted({p.microbatches for p in probs})))

    def __str__(self) -> str:
        counts = "micro-batch counts" if len(self.counts) > 1 else "micro-batch count"
        return (f"tensor degrees {'auto' if self.tp is None else '/'.join(map(str, self.tp))}, ZeRO "
                f"{'/'.join(map(str, self.zero))}, recomputation {'/'.join(self.recompute)} and {counts} "
                f"{'/'.join(map(str, self.counts))} were tried")


def least_need_error(probs: Sequence[Problem], req: Request | None = None,
                     cands: Sequence[int] | None = None) -> InfeasibleError:
    """The error when none of ``probs`` (the problems a search solved, for micro-batch counts ``cands``)
    has a plan that fits: the least memory a plan of any of them needs, that plan, and what would help."""
    need, tried = least_need(probs), Tried.of(probs)
    need = None if need is None else _counted_whole(need, req.engine if req is not None else "any")
    prob = probs[0] if need is None else need.prob
    cause = f"no plan fits in the devices' memory ({_capacities(prob.cluster)})"
    if need is not None:
        cause += (f"; the plan of this space that needs the least memory needs {memory_text(need.bytes)} per device: "
                  + describe(need.prob, need.solution))
        cause += f" (the least over micro-batch counts {', '.join(map(str, tried.counts))})" \
            if len(tried.counts) > 1 else ""
    hint = f"{', '.join(_hints(prob, need, req, tried, cands or tried.counts))}; {tried}"
    if prob.stages_max is not None:
        hint += (f", on at most {prob.stages_max} stages (the engine's schedule needs a micro-batch per stage: more "
                 "--microbatches allow more stages)")
    return InfeasibleError(cause, hint, None if need is None else need.bytes)


def _capacities(cluster: ir.Cluster) -> str:
    """The devices' memory for the error: ``80.00 GiB per device at most``, or on GPUs of several sizes the
    range, ``40.00 GiB to 80.00 GiB per device`` (the least alone would understate the largest)."""
    mems = [g.memory_bytes for g in cluster.gpus]
    if min(mems) == max(mems):
        return f"{memory_text(mems[0])} per device at most"
    return f"{memory_text(min(mems))} to {memory_text(max(mems))} per device"


def _more_gpus(cluster: ir.Cluster, need: Need | None) -> str:
    """Add GPUs or bigger ones; how many of these the need implies where they are alike (an estimate)."""
    mems = {g.memory_bytes for g in cluster.gpus}
    if need is None or len(mems) > 1:
        return "add devices or use GPUs with more memory"
    have, n = mems.pop(), len(cluster.gpus)
    est = math.ceil(need.bytes * n / have)
    return (f"use GPUs with {memory_text(need.bytes)} or more, or more of these: about {est} GPUs of "
            f"{memory_text(have)} (an estimate: {memory_text(need.bytes)} x {n} GPUs / {memory_text(have)}, "
            "as if the memory per device fell in proportion)")


def _more_microbatches(prob: Problem, cands: Sequence[int]) -> list[str]:
    """More micro-batches than were searched (of a free size), or smaller ones (of a fixed size), where the
    batch allows them."""
    batch, fixed = prob.profile.batch_size, prob.space.micro_batch_size
    per = batch // (fixed or 1)
    out = []
    more = [m for m in divisors(per) if m > max(cands)]
    if fixed is None and more and more[0] <= MAX_AUTO_MICROBATCHES:
        out.append(f"more micro-batches (--microbatches auto searches every count that divides the batch of {batch} "
                   f"up to {MAX_AUTO_MICROBATCHES}; smaller micro-batches keep fewer activations)")
    elif fixed is None and more:
        out.append(f"--microbatches {more[0]} (the next count that divides the batch of {batch}, above the "
                   f"{MAX_AUTO_MICROBATCHES} auto tries; the step simulates each micro-batch), or a batch size with "
                   "more divisors")
    if fixed is not None and fixed > 1:
        out.append(f"a smaller --micro-batch-size than {fixed}")
    return out


def _hints(prob: Problem, need: Need | None, req: Request | None, tried: Tried, cands: Sequence[int]) -> list[str]:
    """What would help, leaving out what the request already uses."""
    engine = ENGINE_LIMITS.get(req.engine if req is not None else "any")
    out = [_more_gpus(prob.cluster, need), *_more_microbatches(prob, cands)]
    if 3 not in tried.zero and len(prob.cluster.gpus) > 1:
        out.append("--zero 3 (shards weights, gradients and optimizer state over the data-parallel ranks)"
                   if engine is None or 3 in engine.zero else
                   f"an --engine that runs ZeRO-3 (--engine {engine.name} runs ZeRO {'/'.join(map(str, engine.zero))})")
    if "full" not in tried.recompute:
        out.append("--recompute full (keeps only each layer's input)")
    fixed_tp = req.space.tp if req is not None else tried.tp  # the user's --tp (an engine's search fixes each
    if fixed_tp is not None and (engine is None or engine.tensor_parallel):  # problem's tp, as torch's one mesh)
        out.append("--tp auto")
    if prob.optimizer != "sgd" and not prob.profile.has_blocks:
        out.append("a lighter --optimizer (sgd keeps no optimizer state)")
    if prob.space.precision == "fp32" and (engine is None or "bf16" in engine.precisions):
        out.append("--precision bf16 (16-bit activations, weights and gradients)")
    if schedule_kind(prob.schedule).in_flight_microbatches(4, 8, 0) > 4:  # more than K on the first stage
        out.append("--schedule 1f1b (at most K - s micro-batches in flight on stage s)")
    return out


def infeasible_error(prob: Problem) -> InfeasibleError:
    """The error for one problem with no plan that fits (:func:`least_need_error` over it alone)."""
    return least_need_error([prob])


def no_width_shape(profile: ir.ModelProfile, req: Request, probs: list[Problem]) -> Exception | None:
    """When a ``--config`` width has no grid with whole micro-batches at any micro-batch count: that
    is why nothing was found, not memory."""
    if req.config is None:
        return None
    formed = {len(mv.devices) for prob in probs for row in prob.moves for mv in row}
    missing = sorted(set(req.config) - formed)
    if not missing:
        return None
    return PlanError(f"--config {'-'.join(map(str, req.config))}: no stage of {missing} GPUs gives its data-parallel "
                     f"ranks whole micro-batches of the batch of {profile.batch_size} at any micro-batch count",
                     "batch = micro_batch_size x microbatches x dp: use stage widths (or tensor degrees) whose "
                     "data-parallel degree divides the batch, or another batch size")


def no_batch_shape(profile: ir.ModelProfile, cluster: ir.Cluster, cands: list[int], req: Request) -> Exception:
    """When no stage grid splits the batch into whole micro-batches per data-parallel rank."""
    fixed = req.space.micro_batch_size
    what = f"micro-batch size {fixed}" if fixed else f"micro-batch counts {cands[:8]}"
    if fixed and len(cands) == 1:  # both given: every stage's data-parallel degree is fixed too
        what += (f" and --microbatches {cands[0]} (a data-parallel degree of "
                 f"{profile.batch_size // (fixed * cands[0])} in every stage)")
    zero = "" if 0 in req.space.zero else (f" and --zero {'/'.join(map(str, req.space.zero))} (two or more "
                                           "data-parallel ranks)")
    config = f" and --config {'-'.join(map(str, req.config))}" if req.config is not None else ""
    return PlanError(f"no stage grid of {cluster.name!r} splits the batch of {profile.batch_size} into whole "
                     f"micro-batches per data-parallel rank with {what}"
                     + (f" and --tp {req.space.tp}" if req.space.tp else "") + zero + config,
                     "batch = micro_batch_size x microbatches x dp: use a batch size with more divisors, "
                     "--microbatches auto, another --micro-batch-size or --tp auto"
                     + (", or --config stage widths whose data-parallel degree divides the batch" if config else ""))

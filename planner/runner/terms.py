"""Where a real step's time went, per term, beside where the cost model says it goes (``planner run --json``).

Measured (:func:`classify`, from the torch profiler's events of one extra, untimed step that
each worker profiles after its timed steps; each operator's CPU time, or on a GPU the time of the
kernels it queued, planner.runner.worker.step_terms): every top-level operator is put in one
term by its name: ``compute`` (``aten::`` operators and autograd's backward functions),
``transfers`` (point-to-point ``c10d::send``/``recv`` and ``broadcast``, which DeepSpeed's
pipeline uses between stages), ``allreduce`` (``c10d::allreduce``, all-gather,
reduce-scatter: data-parallel gradient synchronisation and the engines' loss reductions),
``optimizer`` (``Optimizer.step``/``zero_grad``); an event of no term (a user range) is
looked into. ``other`` is the profiled step's wall time minus those: the engine's Python
(scheduling, its wrappers) and waiting for an input that is not inside a communication call.
On the CPU (gloo) a ``c10d::`` operator only hands its work to gloo and returns: the wait comes
after it, outside any operator, so :func:`timeline_terms` divides the time of the step's own thread
(:data:`STEP_RANGE` marks the step) instant by instant: gloo's own ``gloo:`` events (on its threads,
or on the step's thread from a send or receive's start to its end) say when its work is in flight,
and time in no operator (``aten::``) while it is, is the wait for it (its term: ``gloo:broadcast``,
``send`` and ``recv`` transfers, the rest allreduce), inside autograd's functions too (FSDP gathers
a unit in its pre-backward hook); inside ``Optimizer.step`` everything is optimizer (torch's ZeRO-1
broadcast). A blocking receive counts its wait as ``transfers``, so idle time shows partly there.

Predicted (:func:`predicted_terms`, from the plan simulated with the run's engine, the
explanation's terms): per pipeline stage ``compute`` (M x forward + backward, without the
engine, as the simulation played it), ``transfers``
(M x the incoming activation and incoming gradient, alpha-beta, unshared), ``allreduce``, ``optimizer``,
``engine`` (what the engine's measured overheads add: actions, sends and step; with them, on
processes that share a node's cores, the node's hand-off cost per micro-batch sent,
:func:`planner.costmodel.engine.engine_overhead`) and ``idle``
(iteration minus the stage's busy time: bubble and waiting). Pure: no torch import.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from planner import ir
from planner.costmodel import stage_costs_for
from planner.errors import PlannerError

MEASURED = ("compute", "transfers", "allreduce", "optimizer", "other")
PREDICTED = ("compute", "transfers", "allreduce", "optimizer", "engine", "idle")

_PREFIXES = (("c10d::send", "transfers"), ("c10d::recv", "transfers"), ("c10d::broadcast", "transfers"),
             ("c10d::allreduce", "allreduce"), ("c10d::allgather", "allreduce"), ("c10d::_allgather", "allreduce"),
             ("c10d::reduce_scatter", "allreduce"), ("c10d::_reduce_scatter", "allreduce"),
             ("Optimizer.step", "optimizer"), ("Optimizer.zero_grad", "optimizer"),
             ("aten::", "compute"), ("autograd::", "compute"))


class ProfEvent(Protocol):
    """What :func:`classify` reads of a profiler event (torch's FunctionEvent has it)."""

    @property
    def name(self) -> str:
        """The operator's or range's name (``aten::linear``, ``c10d::send``, ``Optimizer.step#SGD.step``)."""

    @property
    def cpu_children(self) -> Sequence[ProfEvent]:
        """The events it called, on the same thread."""


def term_of(name: str) -> str | None:
    """The term an operator's time belongs to (module doc), None when not known by name."""
    for prefix, term in _PREFIXES:
        if name.startswith(prefix):
            return term
    return None


def classify(events: Iterable[ProfEvent], wall_s: float, elapsed_s: Callable[[ProfEvent], float]) -> dict[str, float]:
    """Seconds per measured term of one step from its top-level profiler ``events``;
    ``elapsed_s(event)`` gives an event's seconds; ``other`` is ``wall_s`` minus the rest."""
    out = dict.fromkeys(MEASURED, 0.0)
    stack = list(events)
    while stack:
        e = stack.pop()
        if e.name.startswith("gloo:"):
            continue
        term = term_of(e.name)
        if term is None:
            stack.extend(e.cpu_children)
        else:
            out[term] += float(elapsed_s(e))
    out["other"] = max(0.0, wall_s - sum(out[t] for t in MEASURED if t != "other"))
    return out


STEP_RANGE = "planner::step"
"""The name of the profiler range the worker puts around its profiled step."""

_GLOO = (("gloo:send", "transfers"), ("gloo:recv", "transfers"), ("gloo:broadcast", "transfers"),
         ("gloo:", "allreduce"))
_COMMS = ("transfers", "allreduce")


def gloo_term(name: str) -> str | None:
    """The term of gloo's own event (its collective or point-to-point work), None for another event."""
    return next((term for prefix, term in _GLOO if name.startswith(prefix)), None)


@dataclasses.dataclass(frozen=True)
class Span:
    """A profiler event on a timeline: its name, thread, start and end (seconds) and the events inside it."""

    name: str
    thread: int
    start_s: float
    end_s: float
    children: tuple[Span, ...] = ()


Interval = tuple[float, float]


def _minus(a: Interval, cuts: Sequence[Interval]) -> list[Interval]:
    """``a`` without the sorted, disjoint ``cuts``."""
    out, at = [], a[0]
    for lo, hi in cuts:
        if hi <= at or lo >= a[1]:
            continue
        if lo > at:
            out.append((at, lo))
        at = max(at, hi)
    if at < a[1]:
        out.append((at, a[1]))
    return out


def _union(spans: Iterable[Interval]) -> list[Interval]:
    out: list[Interval] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _self_time(span: Span, chain: tuple[str | None, ...], in_op: bool,
               out: list[tuple[Interval, tuple[str | None, ...], bool]]) -> None:
    """Each piece of ``span``'s time that none of its children covers, with the terms of the events
    around it (``chain``, outermost first) and whether an operator (``aten::``) runs there."""
    here = (*chain, term_of(span.name) or gloo_term(span.name))
    op = in_op or span.name.startswith("aten::")
    kids = sorted(span.children, key=lambda k: k.start_s)
    for piece in _minus((span.start_s, span.end_s), [(k.start_s, k.end_s) for k in kids]):
        out.append((piece, here, op))
    for kid in kids:
        _self_time(kid, here, op, out)


def timeline_terms(step: Span, others: Iterable[Span], wall_s: float) -> dict[str, float]:
    """Seconds per measured term of one CPU step (module doc): ``step`` the :data:`STEP_RANGE` event
    and what ran inside it on its thread, ``others`` the other top-level events (gloo's work in flight,
    on any thread); ``other`` is ``wall_s`` minus the rest."""
    flight = {t: _union((e.start_s, e.end_s) for e in others if gloo_term(e.name) == t) for t in _COMMS}
    out = dict.fromkeys(MEASURED, 0.0)
    pieces: list[tuple[Interval, tuple[str | None, ...], bool]] = []
    _self_time(step, (), False, pieces)
    for piece, chain, in_op in pieces:
        length = piece[1] - piece[0]
        if "optimizer" in chain:
            out["optimizer"] += length
            continue
        comm = next((t for t in chain if t in _COMMS), None)
        if comm is not None:
            out[comm] += length
            continue
        rest = [piece]
        if not in_op:  # waiting: for a collective gloo's threads run, if one runs
            for term in _COMMS:
                left = [p for r in rest for p in _minus(r, flight[term])]
                out[term] += max(0.0, sum(hi - lo for lo, hi in rest) - sum(hi - lo for lo, hi in left))
                rest = left
        where = "compute" if "compute" in chain else "other"
        out[where] += sum(hi - lo for lo, hi in rest)
    out["other"] = max(0.0, wall_s - sum(out[t] for t in MEASURED if t != "other"))
    return out


def _incoming_s(costs: Sequence[ir.StageCost], c: int) -> float:
    """One micro-batch's incoming activation (from chunk c-1) and gradient (from c+1), alpha-beta."""
    return (costs[c - 1].send_s if c > 0 else 0.0) + (costs[c].send_s if c < len(costs) - 1 else 0.0)


@dataclasses.dataclass(frozen=True)
class AsRun:
    """The prediction of a run: the plan simulated as ``engine`` runs it (its overheads, its gradient buffers)."""

    iteration_s: float
    peak_memory_bytes: dict[str, int]
    """Per device name."""
    warning: str | None
    """What the run JSON warns of where the plan was searched for another engine (None: the plan's own)."""


def as_run_prediction(plan: ir.Plan, engine: str) -> AsRun:
    """The plan's own prediction where it was searched for ``engine``; else the plan simulated as ``engine``
    runs it (what the run's per-stage ``predicted`` terms add up to), and a warning that says both. The plan's
    own when the cost model cannot cost it (PlannerError)."""
    own = AsRun(plan.predicted.iteration_s, {}, None)
    if plan.engine == engine:
        return own
    from planner.simulate import SimOptions, simulate

    try:
        sim = simulate(dataclasses.replace(plan, engine=engine), SimOptions(record_events=False))
    except PlannerError:
        return own
    searched = "for any engine (no --engine)" if plan.engine == "any" else f"for {plan.engine}"
    warning = (f"the plan was searched {searched}, not {engine}: predicted as {engine} runs it, "
               f"{sim.iteration_s * 1e3:.3g} ms per iteration and {sim.peak_memory_bytes / 2**20:.3g} MiB at the "
               f"peak (the plan says {plan.predicted.iteration_s * 1e3:.3g} ms and "
               f"{plan.predicted.peak_memory_bytes / 2**20:.3g} MiB); search with --engine {engine} for its plan")
    return AsRun(sim.iteration_s, {d.device: d.peak_memory_bytes for d in sim.devices}, warning)


def predicted_terms(plan: ir.Plan, engine: str) -> list[dict[str, float]]:
    """Per pipeline stage (device group): the predicted seconds of each term of one step
    (module doc), the plan simulated as run by ``engine``: the explanation's terms
    (:func:`planner.explain.stage_explanations`) but for transfers, here both directions' own."""
    from planner.explain import stage_explanations
    from planner.simulate import SimOptions, simulate

    as_run = dataclasses.replace(plan, engine=engine)
    sim = simulate(as_run, SimOptions(record_events=False))
    bare = stage_costs_for(plan.profile, plan.cluster, plan.stages, plan.microbatches, plan.optimizer,
                           plan.precision, engine)  # torch's ZeRO-1 broadcast in allreduce (measured in optimizer)
    lanes = len(sim.lanes)
    return [{"compute": e.compute_s,
             "transfers": sum(plan.microbatches * _incoming_s(bare, c) for c in range(e.stage, len(bare), lanes)),
             "allreduce": e.allreduce_s, "optimizer": e.optimizer_s, "engine": e.engine_s, "idle": e.idle_s}
            for e in stage_explanations(as_run, sim)]


def stage_terms(plan: ir.Plan, engine: str, measured: Sequence[dict[str, float]] | None,
                rank_stages: Sequence[int]) -> list[dict[str, Any]]:
    """Per pipeline stage: ``measured`` (the median over the stage's ranks of each term; None
    when the workers measured none) and ``predicted`` seconds per term (None when the cost model
    cannot cost the plan, e.g. a hand-written plan with forms its profile does not allow)."""
    stages = max(rank_stages, default=0) + 1
    try:
        predicted: list[dict[str, float] | None] = list(predicted_terms(plan, engine))
    except PlannerError:
        predicted = [None] * stages
    out = []
    for stage, pred in enumerate(predicted):
        ranks = [r for r, s in enumerate(rank_stages) if s == stage]
        got = None
        if measured:
            got = {t: statistics.median(measured[r][t] for r in ranks) for t in MEASURED}
        out.append({"stage": stage, "ranks": ranks, "measured": got, "predicted": pred})
    return out

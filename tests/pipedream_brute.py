"""A brute-force oracle for PipeDream's hierarchical partitioner on a chain of layers.

It owns PipeDream's objective, written from its definition (``optimizer_graph_hierarchical.py``, msr-fiddle/pipedream),
and an exhaustive search of it: every cut of a layer range into consecutive stages, every replica count per stage.
``planner.search.pipedream`` is tested against it (tests/test_baselines.py). The facts it encodes:

- A level of the hierarchy has ``units`` joined by ``bandwidth`` (B/s); one unit runs a layer range in the inner
  level's best time of that range over all the inner level's units (the innermost level: the sum of the layers'
  seconds). A range the inner level has no answer for cannot be a stage.
- A pipeline of stages over a range takes the time of its slowest stage. A stage of parameters ``P`` on ``r``
  units syncs its weights data parallel: ``(C + 4 (r-1) P / (B r)) / r``; the pipeline's first stage also divides
  the sync by the units per unit of the level below, ``(C + 4 (r-1) P / (B r) / lower) / r``, as PipeDream's
  data-parallel start does and its later stages do not.
- With ``--activation_compression_ratio c`` every stage but the range's first also takes at least its input
  transfer ``2 out[first-1] / (c B r)`` and, unless it ends the whole chain, its output transfer
  ``2 out[last] / (c B r)``, ``r`` its own replicas (PipeDream's default counts no transfers).
- The stages' replicas add up to the level's units. ``--straight_pipeline``: every stage on one unit.
  ``--use_fewer_machines``: a range of two or more layers may use fewer units than it is given (PipeDream's
  fallback to ``m-1`` units is tried only for ranges of two or more layers).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

Span = tuple[int, int]  # layers [first, end)
Plan = tuple[tuple[int, int, int], ...]  # (first, end, replicas) per stage, in order
Nested = tuple[tuple[int, int, int, "Nested | None"], ...]  # a plan whose stages carry their inner level's plan
TOL = 1e-9


@dataclass(frozen=True)
class Chain:
    """The layers and PipeDream's settings: seconds, parameter bytes and output bytes per layer; the activation
    compression ratio (None: transfers not counted) and the two shape flags."""

    times: tuple[float, ...]
    params: tuple[float, ...]
    outputs: tuple[float, ...]
    ratio: float | None = None
    straight: bool = False
    fewer: bool = False

    @property
    def n(self) -> int:
        return len(self.times)


@dataclass(frozen=True)
class Level:
    """One level of the hierarchy: ``units`` joined by ``bandwidth``, each holding ``lower`` units of the level below
    (1 for the innermost)."""

    units: int
    bandwidth: float
    lower: int


def stage_time(chain: Chain, level: Level, compute: float, first: int, end: int, reps: int, leads: bool) -> float:
    """The time per batch of layers [first, end) on ``reps`` units of ``level`` taking ``compute`` on one unit;
    ``leads``: the range's first stage (weight sync divided by the units below, no transfers counted)."""
    sync = 4 * (reps - 1) * sum(chain.params[first:end]) / (level.bandwidth * reps)
    if leads:
        return (compute + sync / level.lower) / reps
    t = (compute + sync) / reps
    if chain.ratio is not None:
        t = max(t, 2.0 * chain.outputs[first - 1] / chain.ratio / (level.bandwidth * reps))
        if end < chain.n:
            t = max(t, 2.0 * chain.outputs[end - 1] / chain.ratio / (level.bandwidth * reps))
    return t


def admits(chain: Chain, level: Level, span: Span, plan: Plan) -> bool:
    """Whether ``plan`` is one PipeDream may give ``span`` at ``level``: consecutive stages covering the span, and
    replicas as the flags allow."""
    cover = [span[0]] + [e for _, e, _ in plan]
    if [f for f, _, _ in plan] != cover[:-1] or cover[-1] != span[1] or any(f >= e for f, e, _ in plan):
        return False
    reps = [r for _, _, r in plan]
    if min(reps) < 1 or (chain.straight and max(reps) > 1):
        return False
    may_leave = chain.fewer and span[1] - span[0] > 1
    return sum(reps) == level.units or (may_leave and sum(reps) < level.units)


def plan_time(chain: Chain, level: Level, compute: dict[Span, float | None], plan: Plan) -> float | None:
    """PipeDream's time per batch of ``plan`` (its slowest stage); None when a stage's range has no inner answer."""
    times = []
    for s, (first, end, reps) in enumerate(plan):
        c = compute[(first, end)]
        if c is None:
            return None
        times.append(stage_time(chain, level, c, first, end, reps, s == 0))
    return max(times)


def cuts(first: int, end: int) -> Iterator[list[Span]]:
    """Every way to cut layers [first, end) into consecutive non-empty ranges."""
    inner = range(first + 1, end)
    for k in range(len(inner) + 1):
        for chosen in itertools.combinations(inner, k):
            bounds = [first, *chosen, end]
            yield list(itertools.pairwise(bounds))


def replicas(stages: int, units: int, top: int) -> Iterator[tuple[int, ...]]:
    """Every ``stages`` replica counts of 1..``top`` each that add up to at most ``units``."""
    if stages == 0:
        yield ()
        return
    for r in range(1, min(top, units - (stages - 1)) + 1):
        for rest in replicas(stages - 1, units - r, top):
            yield (r, *rest)


def plans(chain: Chain, level: Level, span: Span) -> Iterator[Plan]:
    """Every plan of ``span`` at ``level`` (:func:`admits`): a cut and replicas per stage."""
    top = 1 if chain.straight else level.units
    for stages in cuts(*span):
        for reps in replicas(len(stages), level.units, top):
            plan = tuple((f, e, r) for (f, e), r in zip(stages, reps, strict=True))
            if admits(chain, level, span, plan):
                yield plan


@dataclass(frozen=True)
class Optimum:
    """A range's best time at one level (None: no plan) and its plans within :data:`TOL` of it."""

    time: float | None
    plans: tuple[Plan, ...]


def optimum(chain: Chain, level: Level, compute: dict[Span, float | None], span: Span) -> Optimum:
    """The best of every plan of ``span``, by brute force."""
    scored = [(t, p) for p in plans(chain, level, span) if (t := plan_time(chain, level, compute, p)) is not None]
    if not scored:
        return Optimum(None, ())
    best = min(t for t, _ in scored)
    return Optimum(best, tuple(p for t, p in scored if t <= best * (1 + TOL)))


def levels_of(levels: Sequence[tuple[int, float]]) -> list[Level]:
    """planner's ``levels`` argument (units, bandwidth), innermost first, as :class:`Level`."""
    lowers = [1] + [u for u, _ in levels[:-1]]
    return [Level(u, b, low) for (u, b), low in zip(levels, lowers, strict=True)]


def solve(chain: Chain, levels: Sequence[Level]) -> list[dict[Span, Optimum]]:
    """Each level's optimum of every range (the outermost: the whole chain only), innermost first; a level's
    compute time of a range is the level below's best time of it."""
    spans = [(a, b) for a in range(chain.n) for b in range(a + 1, chain.n + 1)]
    compute: dict[Span, float | None] = {s: sum(chain.times[s[0]:s[1]]) for s in spans}
    solved = []
    for depth, level in enumerate(levels):
        wanted = spans if depth < len(levels) - 1 else [(0, chain.n)]
        opt = {s: optimum(chain, level, compute, s) for s in wanted}
        solved.append(opt)
        compute = {s: o.time for s, o in opt.items()}
    return solved


def flat_answers(solved: list[dict[Span, Optimum]], depth: int, span: Span, cap: int = 2) -> set[Plan]:
    """Up to ``cap`` distinct flat answers (first, end, total replicas) that are optimal at every level: an optimal
    plan of ``span`` whose every stage is, inside each of its units, an optimal plan of the level below."""
    found: set[Plan] = set()
    for plan in solved[depth][span].plans:
        options: list[list[Plan]] = []
        for first, end, reps in plan:
            inner = [((first, end, 1),)] if depth == 0 else sorted(flat_answers(solved, depth - 1, (first, end), cap))
            options.append([tuple((f, e, r * reps) for f, e, r in p) for p in inner])
        for combo in itertools.product(*options):
            found.add(tuple(stage for part in combo for stage in part))
            if len(found) >= cap:
                return found
    return found


def nest(stages: Sequence[tuple[int, int, Sequence[tuple[int, ...]]]], depth: int) -> Nested:
    """planner's flat answer (first, end, devices) as a plan per level, read off the devices' paths (outermost index
    first): consecutive stages on the same units of level ``depth`` are one of its stages."""
    groups: list[tuple[frozenset[int], list[tuple[int, int, Sequence[tuple[int, ...]]]]]] = []
    for first, end, devices in stages:
        units = frozenset(d[0] for d in devices)
        if groups and groups[-1][0] == units:
            groups[-1][1].append((first, end, devices))
        else:
            groups.append((units, [(first, end, devices)]))
    out = []
    for units, members in groups:
        one = min(units)
        inner = None if depth == 0 else nest([(f, e, [d[1:] for d in devs if d[0] == one]) for f, e, devs in members],
                                             depth - 1)
        out.append((members[0][0], members[-1][1], len(units), inner))
    return tuple(out)


def nested_time(chain: Chain, levels: Sequence[Level], nested: Nested, depth: int) -> float | None:
    """PipeDream's time of a plan per level, each stage's compute time the time of its inner plan; None when a plan
    breaks a level's rules (:func:`admits`) or a range has no answer."""
    plan = tuple((f, e, r) for f, e, r, _ in nested)
    span = (plan[0][0], plan[-1][1])
    if not admits(chain, levels[depth], span, plan):
        return None
    compute: dict[Span, float | None] = {}
    for f, e, _, inner in nested:
        compute[(f, e)] = sum(chain.times[f:e]) if inner is None else nested_time(chain, levels, inner, depth - 1)
    return plan_time(chain, levels[depth], compute, plan)


def inner_optimal(chain: Chain, levels: Sequence[Level], solved: list[dict[Span, Optimum]], nested: Nested,
                  depth: int) -> bool:
    """Whether every stage of ``nested`` is partitioned optimally by the level below (PipeDream's hierarchy: a unit
    runs its range in the inner level's best time)."""
    for f, e, _, inner in nested:
        if inner is None:
            continue
        best, got = solved[depth - 1][(f, e)].time, nested_time(chain, levels, inner, depth - 1)
        if best is None or got is None or got > best * (1 + TOL) or not inner_optimal(chain, levels, solved, inner,
                                                                                       depth - 1):
            return False
    return True

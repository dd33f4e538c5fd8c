"""The search's problems solved and their solutions collected, best objective first (pure).

:func:`collect` frames one problem per micro-batch count (or per engine grid), solves them in the order their
lower bounds allow (planner.search.framed; the DP's unconstrained solve of the promising ones first,
planner.search.descent) and keeps every solution met while a problem may still beat the best plan's analytic
objective or its simulated iteration. Where a ranked solution's micro-batch count is one the engine refuses on its
stage count, :func:`collect_exact` solves again on the stage counts each count runs on (planner.search.counts).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from planner import ir
from planner.errors import InfeasibleError
from planner.runnable import ENGINES as ENGINE_LIMITS
from planner.search import rerank
from planner.search.counts import exact_count_problems, refusal, refused_error
from planner.search.descent import Opening, open_problem, solve
from planner.search.framed import Framed
from planner.search.nofit import least_need_error, no_batch_shape, no_width_shape
from planner.search.options import Request, problems
from planner.search.solutions import Found, memory_plan
from planner.search.sp import Problem, Solution

__all__ = ["collect", "collect_exact", "refused_met", "solve_one"]


@dataclass
class _Met:
    """What a search has met so far: its solutions, the problems it solved, and the least simulated iteration
    of the best plans it met (other problems are solved while they may beat either)."""

    req: Request
    progress: Callable[[str], None] | None
    found: Found = field(default_factory=list)
    probs: list[Problem] = field(default_factory=list)
    simulated_s: float = math.inf
    mixed: set[int] = field(default_factory=set)
    """The ids of the problems solved again once per mode (their plans all mixed modes)."""

    @property
    def threshold_s(self) -> float:
        return max(self.found[0][0], self.simulated_s) if self.found else math.inf

    @property
    def uniform(self) -> bool:
        """Whether the engine runs one recomputation mode for the whole job (planner.runnable)."""
        limits = ENGINE_LIMITS.get(self.req.engine)
        return limits is not None and limits.uniform_recompute

    def solve(self, item: Problem | Framed, opening: Opening | None) -> bool:
        """Solve one problem, keeping its solutions (only those whose stages share a recomputation mode where
        :attr:`uniform`); False when its best plan mixed modes (then it is solved once per mode)."""
        prob = item.build() if isinstance(item, Framed) else item
        self.probs.append(prob)
        pool: list[Solution] = []
        threshold = self.threshold_s
        sol = solve_one(prob, self.req.solver, pool, threshold, opening)
        if self.progress:
            self.progress(f"M={prob.microbatches}: " + ("no plan fits" if sol is None else f"{sol.objective:.6g} s"))
        kept = [x for x in ([sol] if sol is not None else []) + pool if not (self.uniform and _mixed(x))]
        for x in kept:
            self.found.append((x.objective, len(self.found), prob, x))
        self.found.sort(key=lambda t: (t[0], t[1]))
        if sol is not None and sol in kept and sol.objective < threshold:
            self.simulated_s = min(self.simulated_s, _simulated_s(prob, sol, self.req.engine))
        if sol is not None and sol not in kept:
            self.mixed.add(id(prob))
        return sol is None or sol in kept



def collect(profile: ir.ModelProfile, cluster: ir.Cluster, req: Request, cands: list[int],
             progress: Callable[[str], None] | None, exact_counts: bool = False) -> tuple[Found, list[Problem]]:
    """Every problem (one per micro-batch count, or per engine grid) and the solutions met, best
    objective first; InfeasibleError when no plan fits at all, PlanError when no grid gives whole
    micro-batches. An engine that runs one recomputation mode for the whole job solves a problem whose
    best plan mixed modes again once per mode (exact: together they hold its plans that agree).
    ``exact_counts``: each problem once per stage count the engine runs with its micro-batch count
    (planner.search.counts)."""
    framed = [f for m in cands for f in problems(profile, cluster, m, req) if f.has_moves]
    if exact_counts:
        framed = exact_count_problems(framed, req.engine)
    met = _Met(req, progress)
    split: list[Framed] = []
    for bound_s, item, opening, frame in _in_order(framed, req.solver):
        if isinstance(item, Framed) and bound_s >= met.threshold_s:
            break  # this and every later problem (their bounds only grow) cannot beat it
        if not met.solve(item, opening):
            split += frame.one_mode_each()
    for frame in sorted(split, key=lambda f: f.lower_bound_s()):
        if frame.lower_bound_s() < met.threshold_s:
            met.solve(frame, None)
    if not met.probs:
        raise no_batch_shape(profile, cluster, cands, req)
    if not met.found:  # the least need over the problems whose plans were not all set aside for mixing modes
        raise no_width_shape(profile, req, met.probs) or least_need_error(
            [p for p in met.probs if id(p) not in met.mixed] or met.probs, req, cands)
    return met.found, met.probs


def refused_met(found: Found, engine: str, solver: str) -> ir.Plan | None:
    """The first solution of ``found`` whose micro-batch count ``engine`` refuses on its stages, as a plan (None:
    none)."""
    met = next(((p, s) for _, _, p, s in found if refusal(p.schedule, engine, p.microbatches, len(s.stages))), None)
    return None if met is None else memory_plan(*met, engine=engine, solver=solver)[0]


def collect_exact(profile: ir.ModelProfile, cluster: ir.Cluster, req: Request, cands: list[int],
                  progress: Callable[[str], None] | None, refused: ir.Plan, every: list[int]
                  ) -> tuple[Found, list[Problem]]:
    """:func:`collect` on the stage counts the engine runs each count on; where no plan fits there, an error that
    says so beside the counts ``refused`` (a plan met) had (planner.search.counts.refused_error)."""
    try:
        return collect(profile, cluster, req, cands, progress, exact_counts=True)
    except InfeasibleError as exc:
        raise refused_error(refused, req.engine, exc, every) from None



def _mixed(sol: Solution) -> bool:
    """Whether the solution's stages recompute in more than one way."""
    return len({ch.option.variant.recompute for ch in sol.stages}) > 1


def _in_order(framed: list[Framed], solver: str
              ) -> Iterator[tuple[float, Problem | Framed, Opening | None, Framed]]:
    """The problems in the order to solve them, each with its lower bound (planner.search.framed): those
    whose bound is below the best unconstrained plan's objective met, tabulated and opened (solved once
    unconstrained, planner.search.descent.open_problem), best unconstrained plan first (a good incumbent
    early closes the others' branch and bound sooner); then the others, best bound first, still framed
    (tabulated when reached, if their bound can still win). Brute force: none opened, best bound first."""
    ranked = sorted(((f.lower_bound_s(), i, f) for i, f in enumerate(framed)), key=lambda t: (t[0], t[1]))
    opened: list[tuple[float, Problem, Opening, Framed]] = []
    best_open_s, k = math.inf, 0
    while solver == "dp" and k < len(ranked) and ranked[k][0] < best_open_s:
        prob = ranked[k][2].build()
        opening = open_problem(prob)
        opened.append((ranked[k][0], prob, opening, ranked[k][2]))
        if opening.solution is not None:
            best_open_s = min(best_open_s, opening.solution.objective)
        k += 1
    opened.sort(key=lambda t: math.inf if t[2].solution is None else t[2].solution.objective)
    yield from opened
    for bound_s, _, frame in ranked[k:]:
        yield bound_s, frame, None, frame


def _simulated_s(prob: Problem, sol: Solution, engine: str) -> float:
    """The simulated iteration of a solution: other problems are solved fully while they may hold a
    plan whose analytic objective is below it (the simulator re-ranks the plans met, and the analytic
    objective is optimistic), not only while they may beat the best analytic objective."""
    plan, costs = memory_plan(prob, sol, engine=engine, solver="dp")
    return rerank.simulated(plan, costs).prediction.iteration_s



def solve_one(prob: Problem, solver: str, pool: list[Solution] | None = None,
           incumbent: float = math.inf, opening: Opening | None = None) -> Solution | None:
    """Solve with the chosen solver (the DP, or brute force over the same space); ``incumbent`` the
    best objective of the search's other problems, ``opening`` the DP's first solve made ahead
    (planner.search.descent.solve)."""
    from planner.search.brute import brute

    return brute(prob, pool) if solver == "brute" else solve(prob, pool=pool, incumbent=incumbent, opening=opening)

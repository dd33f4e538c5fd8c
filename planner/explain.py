"""Why this plan: where its iteration goes, what bounds it, what it leaves idle and what came close.

Pure (no torch, click or rich). From a plan, its stage costs (:func:`planner.costmodel.stage_costs`)
and its simulation (:func:`planner.simulate.simulate`) this module computes, per pipeline rank
("stage"; under ``interleaved`` the chunks on one device group add up):

* ``compute_s`` = M x (forward + backward) per micro-batch on the stage's slowest device, as the
  simulation played it (on a node whose devices share processors, faster while fewer compute);
* ``transfer_s`` = M x the busier direction of the stage's incoming transfers (activations from
  the previous stage, gradients from the next; alpha + bytes / bandwidth each, the two directions
  side by side on a full-duplex link): they overlap compute and bound the stage only when they
  exceed it (:func:`planner.costmodel.stage_terms`);
* ``allreduce_s`` and ``optimizer_s``: the gradient all-reduce and optimizer step once per iteration;
  ``allreduce_s`` also holds ZeRO-3's collectives in each micro-batch's forward and backward
  (``zero_gather_s``, M x :attr:`planner.ir.StageCost.zero_gather_s`, as played), which the stage
  waits for like compute but which are data-parallel communication, as ``planner run`` measures them;
* ``engine_s``: what the plan's engine adds (:mod:`planner.costmodel.engine`: per action and
  micro-batch sent, played like compute, and ``engine_step_s`` once per step after the optimizer
  step), left out of ``compute_s`` and ``optimizer_s``; 0 for a plan without an engine;
* ``idle_s`` = iteration - the simulated busy time of the stage's devices (its share of the bubble:
  waiting for the pipeline to fill and drain, or for transfers);
* memory headroom: per device capacity minus the simulated peak, the least over the stage's devices.

The bottleneck is the stage with the most work (``max(compute, transfers) + all-reduce +
optimizer``, the engine's share in each, the steady-state term of the cost model); its bound is its
largest part (compute, transfers, all-reduce, optimizer, engine or bubble).
Given the candidates the search judged (plan and simulated prediction, best first), it names
the runner-up configurations and the best plan that uses every GPU of the cluster (or says
that none was judged), with that plan's own bottleneck: why using the idle GPUs is slower.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from planner import ir
from planner.costmodel import charge_plan, stage_costs_for
from planner.simulate import DeviceResult, SimOptions, SimResult, simulate

RUNNER_UPS = 3
"""How many runner-up configurations an explanation lists."""

TIGHT_MEMORY_SHARE = 0.95
"""A stage whose simulated peak is above this share of its GPU's memory gets a warning
(:meth:`Explanation.tight_memory`): on an 80 GiB GPU, under 4 GiB left for what the cost model does not count."""

Candidate = tuple[ir.Plan, ir.Prediction]
"""A plan the search judged and its simulated prediction."""


@dataclass(frozen=True)
class StageExplanation:
    """Where one pipeline rank's iteration goes (seconds per iteration) and its memory headroom."""

    stage: int
    devices: tuple[str, ...]
    compute_s: float
    transfer_s: float
    allreduce_s: float
    optimizer_s: float
    idle_s: float
    peak_memory_bytes: int
    capacity_bytes: int
    headroom_bytes: int
    engine_s: float = 0.0
    engine_step_s: float = 0.0
    zero_gather_s: float = 0.0

    @property
    def work_s(self) -> float:
        """The stage's steady-state work: transfers hide behind compute and ZeRO-3's gathers unless they
        exceed them."""
        busy_s = self.compute_s + self.zero_gather_s + self.engine_s - self.engine_step_s
        once_s = self.allreduce_s - self.zero_gather_s
        return max(busy_s, self.transfer_s) + once_s + self.optimizer_s + self.engine_step_s

    def terms(self) -> dict[str, float]:
        """The parts of this stage's iteration by name, largest first (transfers overlap compute)."""
        terms = {"compute": self.compute_s, "transfers": self.transfer_s, "all-reduce": self.allreduce_s,
                 "optimizer": self.optimizer_s, "engine": self.engine_s, "bubble": self.idle_s}
        return dict(sorted(terms.items(), key=lambda kv: -kv[1]))

    def bound(self) -> str:
        """The largest part of this stage's iteration (the first named on ties)."""
        return next(iter(self.terms()))

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "devices": list(self.devices), "compute_s": self.compute_s,
                "transfer_s": self.transfer_s, "allreduce_s": self.allreduce_s, "optimizer_s": self.optimizer_s,
                "engine_s": self.engine_s, "engine_step_s": self.engine_step_s, "zero_gather_s": self.zero_gather_s,
                "idle_s": self.idle_s, "peak_memory_bytes": self.peak_memory_bytes,
                "capacity_bytes": self.capacity_bytes, "headroom_bytes": self.headroom_bytes}


@dataclass(frozen=True)
class Alternative:
    """Another judged plan: its shape, simulated time, and what bounds it (``terms``: its bottleneck
    stage's terms, largest first, seconds)."""

    config: str
    microbatches: int
    schedule: str
    world_size: int
    iteration_s: float
    slower_fraction: float
    bottleneck_stage: int
    bound: str
    terms: tuple[tuple[str, float], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config, "microbatches": self.microbatches, "schedule": self.schedule,
                "world_size": self.world_size, "iteration_s": self.iteration_s,
                "slower_fraction": self.slower_fraction, "bottleneck_stage": self.bottleneck_stage,
                "bound": self.bound, "terms": dict(self.terms)}


@dataclass(frozen=True)
class Explanation:
    """The facts behind a plan (see the module doc); ``judged`` is False when no candidates were given."""

    iteration_s: float
    bubble_fraction: float
    stages: tuple[StageExplanation, ...]
    bottleneck: int
    bound: str
    gpus: int
    idle_devices: tuple[str, ...]
    all_gpus: Alternative | None
    runner_ups: tuple[Alternative, ...]
    judged: bool
    dp_iteration_s: float | None
    kept_free: float = 0.0
    """The share of every GPU's memory the plan's cluster holds back (``Cluster.memory_kept_free``)."""

    @property
    def engine_charged(self) -> bool:
        """Whether the plan's engine adds time to any stage (its column and bar are then shown)."""
        return any(s.engine_s > 0 for s in self.stages)

    @property
    def engine_step_charged(self) -> bool:
        """Whether the engine adds a per-step cost (after the optimizer step, in the same bar of the time line)."""
        return any(s.engine_step_s > 0 for s in self.stages)

    def tight_memory(self, source: str) -> list[str]:
        """One warning where a stage's peak is above :data:`TIGHT_MEMORY_SHARE` of its GPU's memory (the tightest
        stage named): the cost model counts what the engine allocates (CUDA's ``max_memory_allocated``), not the
        runtime's own memory or the allocator's fragmentation, which take some GiB on a GPU. Where the plan's cluster
        holds a share back (:attr:`kept_free`, ``--memory-headroom``), the stages' capacities are what is left and the
        share is judged on the whole memory."""
        kept_free = self.kept_free
        whole = 1.0 - kept_free
        tight = [s for s in self.stages if s.capacity_bytes > 0 and s.headroom_bytes >= 0
                 and s.peak_memory_bytes * whole > TIGHT_MEMORY_SHARE * s.capacity_bytes]
        if not tight:
            return []
        worst = max(tight, key=lambda s: s.peak_memory_bytes / s.capacity_bytes)
        memory = worst.capacity_bytes / whole
        more = f" (and {len(tight) - 1} more stage{'s' if len(tight) > 2 else ''})" if len(tight) > 1 else ""
        kept = f", {kept_free:.0%} of which the plan keeps free" if kept_free else ""
        share = max(0.1, round(kept_free + 0.05, 2))
        return [f"{source} leaves little memory free: stage {worst.stage}'s peak is "
                f"{worst.peak_memory_bytes / 2**30:.2f} of {memory / 2**30:.2f} GiB a GPU{kept} "
                f"({worst.peak_memory_bytes / memory:.2%}){more}; the prediction counts the tensors the "
                "engine allocates, not the CUDA context, communication buffers or the allocator's fragmentation "
                f"(together often 1-4 GiB), so a real run may not fit: `planner search --memory-headroom {share:g}` "
                f"plans within {1 - share:.0%} of every GPU"]

    def to_dict(self) -> dict[str, Any]:
        return {"iteration_s": self.iteration_s, "bubble_fraction": self.bubble_fraction,
                "bottleneck_stage": self.bottleneck, "bound": self.bound, "gpus": self.gpus,
                "idle_devices": list(self.idle_devices),
                "all_gpus": None if self.all_gpus is None else self.all_gpus.to_dict(),
                "runner_ups": [a.to_dict() for a in self.runner_ups], "judged": self.judged,
                "dp_iteration_s": self.dp_iteration_s, "stages": [s.to_dict() for s in self.stages]}


def _lane_chunks(n_chunks: int, lanes: int) -> list[list[int]]:
    """The chunks (stages of the plan) each lane runs: chunk c on lane c mod K."""
    return [[c for c in range(n_chunks) if c % lanes == lane] for lane in range(lanes)]


_Costs = tuple[Sequence[ir.StageCost], Sequence[ir.StageCost]]
"""A plan's stage costs without and with its engine's overheads."""


def _stage(lane: int, chunks: Sequence[int], costs: _Costs, microbatches: int,
           devices: Sequence[DeviceResult], iteration_s: float) -> StageExplanation:
    """One lane's terms from its chunks' costs (bare and charged with the engine) and its devices'
    simulated results."""
    bare, charged = costs
    per_mb = sum(charged[c].forward_s + charged[c].backward_s for c in chunks)
    engine_mb = per_mb - sum(bare[c].forward_s + bare[c].backward_s for c in chunks)
    played_s = max((d.compute_s for d in devices), default=microbatches * per_mb)  # shared cores: as played
    as_played = played_s / per_mb if per_mb > 0 else 0.0  # a per-micro-batch part's seconds as played
    engine_actions_s = as_played * engine_mb
    gather_s = as_played * sum(bare[c].zero_gather_s for c in chunks)
    optimizer_s = sum(bare[c].optimizer_step_s for c in chunks)
    engine_step_s = sum(charged[c].optimizer_step_s for c in chunks) - optimizer_s
    activations_in = sum(bare[c - 1].send_s for c in chunks if c > 0)
    gradients_in = sum(bare[c].send_s for c in chunks)  # the same bytes come back as gradients
    recv = max(activations_in, gradients_in)  # the two directions of a full-duplex link run side by side
    busy_s = max((d.busy_s for d in devices), default=0.0)
    peak = max((d.peak_memory_bytes for d in devices), default=0)
    caps = [d.capacity_bytes for d in devices if d.capacity_bytes > 0]
    headroom = min((d.capacity_bytes - d.peak_memory_bytes for d in devices if d.capacity_bytes > 0), default=0)
    return StageExplanation(
        stage=lane, devices=tuple(d.device for d in devices), compute_s=played_s - engine_actions_s - gather_s,
        transfer_s=microbatches * recv, allreduce_s=_allreduce_s(chunks, bare, devices) + gather_s,
        optimizer_s=optimizer_s, idle_s=max(0.0, iteration_s - busy_s), peak_memory_bytes=peak,
        capacity_bytes=min(caps, default=0), headroom_bytes=headroom, engine_s=engine_actions_s + engine_step_s,
        engine_step_s=engine_step_s, zero_gather_s=gather_s)


def _allreduce_s(chunks: Sequence[int], bare: Sequence[ir.StageCost], devices: Sequence[DeviceResult]) -> float:
    """The lane's gradient all-reduce as its devices' busy time holds it (overlapped with the backward,
    only the part compute does not hide), so that the terms add up to the iteration."""
    return max((d.allreduce_s for d in devices), default=sum(bare[c].allreduce_s for c in chunks))


def stage_explanations(plan: ir.Plan, result: SimResult) -> tuple[StageExplanation, ...]:
    """Per pipeline rank: compute, transfers, all-reduce, optimizer, engine, idle and memory headroom
    (``result``: the plan's simulation)."""
    bare = stage_costs_for(plan.profile, plan.cluster, plan.stages, plan.microbatches, plan.optimizer,
                           plan.precision, plan.engine)
    costs = (bare, charge_plan(plan, bare))
    chunks = _lane_chunks(len(bare), len(result.lanes))
    return tuple(_stage(lane, chunks[lane], costs, plan.microbatches,
                        [d for d in result.devices if d.lane == lane], result.iteration_s)
                 for lane in range(len(result.lanes)))


def _quiet_simulation(plan: ir.Plan) -> SimResult:
    """The plan's simulation without an event record (times and memory only)."""
    return simulate(plan, SimOptions(record_events=False))


def bottleneck(stages: Sequence[StageExplanation]) -> int:
    """The stage with the most steady-state work (first on ties)."""
    return max(range(len(stages)), key=lambda s: (stages[s].work_s, -s))


def _alternative(plan: ir.Plan, predicted: ir.Prediction, best_s: float) -> Alternative:
    """A judged candidate as an Alternative, with its own bottleneck and bound."""
    stages = stage_explanations(plan, _quiet_simulation(plan))
    b = bottleneck(stages)
    slower = predicted.iteration_s / best_s - 1.0 if best_s > 0 else 0.0
    terms = tuple((name, t) for name, t in stages[b].terms().items() if t > 0)
    return Alternative(plan.config, plan.microbatches, plan.schedule, plan.world_size, predicted.iteration_s,
                       slower, b, stages[b].bound(), terms)


def runner_ups(plan: ir.Plan, candidates: Sequence[Candidate], n: int = RUNNER_UPS) -> list[Candidate]:
    """The best candidate of each of the next ``n`` configurations other than ``plan``'s, fastest first."""
    seen = {plan.config}
    out: list[Candidate] = []
    for cand, predicted in sorted(candidates, key=lambda c: c[1].iteration_s):
        if cand.config in seen:
            continue
        seen.add(cand.config)
        out.append((cand, predicted))
        if len(out) >= n:
            break
    return out


def best_on_all_gpus(plan: ir.Plan, candidates: Sequence[Candidate]) -> Candidate | None:
    """The fastest candidate whose world size is the cluster's GPU count (None: none judged)."""
    n = len(plan.cluster.gpus)
    full = [c for c in candidates if c[0].world_size == n]
    return min(full, key=lambda c: c[1].iteration_s, default=None)


def explain(plan: ir.Plan, candidates: Sequence[Candidate] | None = None, result: SimResult | None = None,
            n_runner_ups: int = RUNNER_UPS) -> Explanation:
    """The explanation of ``plan`` (module doc); ``candidates``: the plans the search judged
    (None: not known, e.g. for a plan read from a file).

    ``result``: the plan's simulation when already at hand (else simulated here).
    """
    result = _quiet_simulation(plan) if result is None else result
    stages = stage_explanations(plan, result)
    b = bottleneck(stages)
    t = result.iteration_s
    used = {d for s in plan.stages for d in s.devices}
    idle = tuple(g.name for g in plan.cluster.gpus if g.name not in used)
    cands = list(candidates or ())
    full = best_on_all_gpus(plan, cands) if idle else None
    return Explanation(
        iteration_s=t, bubble_fraction=result.bubble_fraction,
        stages=stages, bottleneck=b, bound=stages[b].bound(), gpus=len(plan.cluster.gpus), idle_devices=idle,
        all_gpus=None if full is None else _alternative(*full, t),
        runner_ups=tuple(_alternative(p, pr, t) for p, pr in runner_ups(plan, cands, n_runner_ups)),
        judged=candidates is not None, dp_iteration_s=plan.dp_iteration_s, kept_free=plan.cluster.memory_kept_free)

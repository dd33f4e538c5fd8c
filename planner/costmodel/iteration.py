"""The analytic iteration: memory in flight per schedule, per-stage terms, the iteration time, predictions.

Pure. Iteration time (:func:`analytic_iteration`): with ``l_s`` a stage's per-micro-batch
forward+backward plus the transfers it receives (fill and drain), ``c_s`` its compute,
``x_s`` its incoming transfer and ``ar_s`` its gradient synchronisation followed by its
optimizer step, flush schedules take ``T = sum_s l_s + max_s((M-1) max(c_s, x_s) + ar_s)``
(transfers overlap compute in steady state) -- exactly ``(M+K-1)(t_f+t_b)`` for uniform
stages with free communication (GPipe section 2.2: the bottleneck stage runs all M
micro-batches while the others fill and drain once); asynchronous pipedream has no flush:
``T = max_s(M max(c_s, x_s) + ar_s)`` (PipeDream's steady state). Memory (ZeRO section 3;
GPipe section 2.3): static bytes plus the activations of the micro-batches in flight
(:func:`planner.schedule.in_flight_microbatches`), pipedream's stashed weight versions
(Narayanan et al. SOSP'19, section 3.3) and a recomputing stage's workspace, or, if more, the
engine's flat copy of the gradients while it all-reduces them (planner.costmodel.variant). A plan that names
its engine pays that engine's measured overheads (:mod:`planner.costmodel.engine`): they are in
its stage costs (:func:`planner.costmodel.stage_costs`), so ``l_s``, ``c_s`` and the optimizer
step above include them; a plan whose cluster has none predicts as without them.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner import ir
from planner.costmodel.stage import stage_cost_values, stage_costs
from planner.schedule import in_flight_microbatches, schedule_kind


def in_flight(schedule: str, stages: int, microbatches: int, stage: int, virtual_stages: int = 1) -> int:
    """Micro-batches whose activations ``stage`` holds at its peak (planner.schedule)."""
    return in_flight_microbatches(schedule, stages, microbatches, stage, virtual_stages)


def stage_peak_memory(cost: ir.StageCost, schedule: str, stages: int, microbatches: int, stage: int,
                      virtual_stages: int = 1) -> int:
    """Peak memory per device of a stage: static + activations in flight + workspace (+ stashes),
    or static + the gradient all-reduce's flat copy after the last backward, whichever is more.

    pipedream keeps one extra weight version per extra micro-batch in flight (weight
    stashing, PipeDream section 3.3).
    """
    k = in_flight(schedule, stages, microbatches, stage, virtual_stages)
    stash = schedule_kind(schedule).stash_bytes(k, cost.weight_bytes)
    return int(cost.static_bytes + max(k * cost.activation_bytes + cost.workspace_bytes + stash,
                                       cost.grad_copy_bytes))


def schedule_weights(schedule: str, microbatches: int) -> tuple[float, float]:
    """(a, b) of ``T = a * sum_s l_s + max_s(b * l_s + ar_s)`` for a schedule (see module doc)."""
    return schedule_kind(schedule).objective_weights(microbatches)


def stage_period(costs: Sequence[ir.StageCost]) -> list[float]:
    """``l_s``: forward + backward per micro-batch plus the transfers the stage receives.

    The first micro-batch's activation crosses each stage boundary once on the way in and
    the last one's gradient once on the way out, so fill and drain see ``2 * (alpha + S/B)``.
    """
    periods = []
    for s, c in enumerate(costs):
        recv = 2.0 * costs[s - 1].send_s if s > 0 else 0.0
        periods.append(c.forward_s + c.backward_s + recv)
    return periods


def stage_terms(costs: Sequence[ir.StageCost], schedule: str, microbatches: int) -> list[float]:
    """The steady-state term of each stage: ``b * max(compute, transfer in) + ar_s``.

    Transfers overlap compute (the link works while the device computes, and activations
    and gradients travel in opposite directions of a full-duplex link), so in steady state
    a stage delivers one micro-batch per ``max(t_f + t_b, alpha + S/B)``. Under gpipe
    (F-then-B: all forwards, then all backwards) the two phases stream separately, so a
    stage takes ``max(t_f, x) + max(t_b, x)`` per micro-batch (GPipe section 2.2).
    """
    kind = schedule_kind(schedule)
    _, b = kind.objective_weights(microbatches)
    out = []
    for s, c in enumerate(costs):
        recv = costs[s - 1].send_s if s > 0 else 0.0
        busy = float(kind.steady_busy(c.forward_s, c.backward_s, recv))
        out.append(b * busy + c.allreduce_s + c.optimizer_step_s)
    return out


def analytic_iteration(costs: Sequence[ir.StageCost], schedule: str, microbatches: int) -> tuple[float, float]:
    """Predicted iteration time and bubble fraction of stages under a schedule.

    ``T = a sum_s l_s + max_s(b max(c_s, x_s) + ar_s)`` with ``(a, b)`` from
    :func:`schedule_weights`, ``l_s`` from :func:`stage_period`, ``c_s`` the stage's
    compute and ``x_s`` its incoming transfer per micro-batch; bubble = 1 - (mean stage
    compute M*c_s) / T.
    """
    a, _ = schedule_weights(schedule, microbatches)
    periods = stage_period(costs)
    total = 0.0
    for p in reversed(periods):
        total = p + total
    t = a * total + max(stage_terms(costs, schedule, microbatches))
    busy = sum(microbatches * (c.forward_s + c.backward_s) for c in costs) / len(costs)
    bubble = 0.0 if t <= 0 else min(max(1.0 - busy / t, 0.0), 1.0)
    return t, bubble


def plan_memory(plan: ir.Plan, costs: Sequence[ir.StageCost] | None = None) -> list[int]:
    """Peak memory per device of each stage of ``plan``."""
    costs = stage_costs(plan) if costs is None else costs
    k = plan.pipeline_stages
    return [stage_peak_memory(c, plan.schedule, k, plan.microbatches, s, plan.virtual_stages)
            for s, c in enumerate(costs)]


def predict(plan: ir.Plan) -> ir.Prediction:
    """The analytic prediction for a plan (iteration, samples/s, bubble, peak memory)."""
    costs = stage_costs(plan)
    t, bubble = analytic_iteration(costs, plan.schedule, plan.microbatches)
    peak = max(plan_memory(plan, costs))
    return ir.Prediction.of(t, plan.batch_size, bubble, peak)


# ----------------------------------------------------------------------------- data parallel


def dp_stage(profile: ir.ModelProfile, cluster: ir.Cluster, devices: Sequence[str] | None = None,
             optimizer: str = "sgd", precision: str = "fp32") -> ir.Stage:
    """Pure data parallel as one stage: every layer ``dp`` on ``devices`` (default: every GPU).

    ``memory_bytes`` is filled for one micro-batch (M = 1: the whole batch in one go).
    """
    devs = tuple(devices) if devices is not None else tuple(g.name for g in cluster.gpus)
    n = len(profile.layers)
    stage = ir.Stage((0, n), devs, ("dp",) * n, 0)
    cost = stage_cost_values(profile, cluster, stage, 1, optimizer, None, precision)
    mem = stage_peak_memory(cost, "gpipe", 1, 1, 0)
    return ir.Stage((0, n), devs, ("dp",) * n, mem)


def dp_plan(profile: ir.ModelProfile, cluster: ir.Cluster, optimizer: str = "sgd", precision: str = "fp32",
            engine: str = "any") -> ir.Plan:
    """Plain data parallel over every GPU as a plan run by ``engine``, whose overheads it is charged with
    where the cluster carries them: the yardstick of a plan for it (``speedup_over_dp``). One stage of
    ``dp`` forms, ZeRO-0, no recomputation, M = 1 (each GPU's whole local batch in one micro-batch), as
    planner.render.search names it; on a one-GPU cluster, the whole batch on that GPU in one go."""
    stage = dp_stage(profile, cluster, optimizer=optimizer, precision=precision)
    return ir.Plan(profile, cluster, "1f1b", 1, optimizer, (stage,), ir.Prediction(0.0, 0.0, 0.0, 0),
                   precision=precision, engine=engine)


def dp_iteration(profile: ir.ModelProfile, cluster: ir.Cluster, optimizer: str = "sgd",
                 precision: str = "fp32", engine: str = "any") -> tuple[float, int, bool]:
    """:func:`dp_plan` (plain data parallel: ZeRO-0, no recomputation, M = 1), run by ``engine``:
    (iteration seconds, peak bytes per device, whether that peak fits the GPUs' memory)."""
    plan = dp_plan(profile, cluster, optimizer, precision, engine)
    (cost,) = stage_costs(plan)
    t, _ = analytic_iteration([cost], "gpipe", 1)
    stage = plan.stages[0]
    return t, stage.memory_bytes, stage.memory_bytes <= cost.capacity_bytes

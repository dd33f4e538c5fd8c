"""Event-driven simulation of a plan's pipeline schedule (pure: no torch, click or rich).

A package: :mod:`~planner.simulate.engine` (the lanes and the run), :mod:`~planner.simulate.links`
(transfers), :mod:`~planner.simulate.memory` (bytes per lane), :mod:`~planner.simulate.measure`
(iteration, busy time, bubble), :mod:`~planner.simulate.result` (SimOptions, SimResult),
:mod:`~planner.simulate.trace` (Chrome trace), :mod:`~planner.simulate.events` (the queue).
Plans are checked by :func:`planner.validate.validate_plan` first. This module holds the
entry points and the model:

The simulator plays a :class:`planner.schedule.Schedule` over per-stage costs
(:class:`planner.ir.StageCost`, from :func:`planner.costmodel.stage_costs`) step by step:

* **Devices.** The K pipeline ranks ("lanes") each run their actions in the schedule's
  order, one at a time; an action starts when the lane is free and its inputs have
  arrived. All devices of a stage's group do the same work at the same time (the cost
  model gives per-device times, split-form collectives included), so a lane stands for
  every device of its group. Under ``interleaved`` a lane hosts the chunks c with
  c mod K equal to it.
* **Links.** Activations (after F) go to the next chunk over that chunk boundary's link
  (``send_link``), gradients (after B) come back over the same link, same size. A
  transfer waits the link latency, then its bytes flow. Transfers of one flow (a stage
  boundary and direction) go one after another, in order, as sends on one channel do in
  NCCL and gloo; flows on the same link id in the same direction (towards later or
  earlier device groups: ``<id> fwd`` / ``<id> bwd``) share its bandwidth equally
  (processor sharing), so two flows at once each take twice as long.
  ``SimOptions.duplex=False`` makes both directions share; ``share_links=False`` gives
  every transfer the whole link at once (alpha + n/beta). Transfers overlap compute. A
  boundary with no link or no bytes, or between chunks on the same lane, is free.
* **Gradient all-reduce.** After a stage's last backward (B, or W when the schedule splits
  the weight gradient, ``zb-h1``) its ``allreduce_s`` runs on the lane and blocks it (the
  default; what the analytic cost model adds). With ``SimOptions.overlap_allreduce`` it
  runs as DDP does: gradients in buckets of ``bucket_bytes``, bucket i ready at (i+1)/n of
  the last backward, all-reduced one after another on the lane's communication stream,
  overlapping compute.
* **Optimizer step.** ``optimizer_step_s`` of a stage runs on its lane right after its
  all-reduce (after the last backward when it has none; with ``overlap_allreduce``, once
  the lane's last all-reduce bucket is done), blocks the lane, and counts as busy time:
  it is part of the iteration.
* **Engine overhead.** A plan that names its engine, on a cluster that carries that engine's
  measured overheads, plays its stage costs charged with them
  (:mod:`planner.costmodel.engine`): every F, B and W action ``per_action_s`` longer, every
  micro-batch sent over a boundary ``per_microbatch_s`` on the sender, every device group's
  optimizer step ``per_step_s`` longer. Without them the costs are those of the cost model alone.
* **Shared cores.** On a node that runs more devices than it has processors for
  (``concurrent_devices``: CPU processes on fewer cores, :mod:`planner.simulate.cores`), a
  lane's F, B and W run faster than their nominal (all-computing) time while fewer of the
  node's devices compute: processor sharing of its cores among the computing lanes; a lane
  whose devices lie on several nodes runs in lockstep, at its slowest node's rate at each moment
  (``compute_s``, ``busy_s`` and the bubble count each lane's compute at the rates it ran:
  its nominal work over its mean rate, ``Engine.compute_rate``).
* **Memory** per lane over time: static bytes (weights, gradients, optimizer state) of its
  chunks; + ``activation_bytes`` of a chunk from the start of a micro-batch's F until the
  end of its B (its W under ``zb-h1``); + ``workspace_bytes`` during B and W; when the
  schedule stashes weights (``pipedream``) + ``weight_bytes`` per stashed weight version: a
  stage with n micro-batches in flight keeps n versions, one of which is the live weights
  (so n - 1 extra); + ``grad_copy_bytes`` during a blocking all-reduce (the engine's flat copy
  of the gradients; not tracked under ``overlap_allreduce``).

Times and the bubble:

* ``iteration_s``: for the flushing schedules, from 0 to the end of the last action,
  transfer or all-reduce. For a schedule that does not flush (``pipedream``) the schedule runs iterations of M
  micro-batches back to back: S = ceil(2K/M) to fill the pipeline, ``pipedream_blocks``
  (default 4) measured ones, and S more so that the final drain does not touch them. An
  iteration ends when every stage has finished the backward of its last micro-batch (and
  that iteration's all-reduce). ``iteration_s`` is the steady-state time per M
  micro-batches: the mean time of the measured iterations over a whole number of their
  period (the steady state of a pipeline without flush repeats, but not always every
  iteration: 5 stages of 1 + 1 s at M = 1, 1 s links into the last two, take 2, 4, 4, 2, 4, 4, ... s,
  :func:`planner.simulate.measure.steady_period`); while they show no period seen twice
  (a pipeline whose backlog builds up slowly, or a longer period) S and the measured
  iterations are doubled, up to 3 times, and then all of them are averaged. A slow build-up
  can still look steady for a while, so the result is never less than the busiest
  resource's work per iteration (a device group's compute and all-reduce, one flow's
  transfers, or a link's, where links are shared), which bounds every steady state from below. With free
  communication this is exactly M times the slowest stage's F + B. The run stops as soon
  as the last measured iteration has ended (later events cannot move it), so a pipedream
  run's ``makespan_s``, events and memory timeline end there (the trailing S iterations
  only fix the schedule's order up to that point).
* **Shortcuts** (``SimOptions.shortcuts``, on by default, same times): a link pool that
  carries one flow is first in, first out at full bandwidth, computed directly instead of
  through the sharing code; and the pipedream stop above. Off, every event is played.
* ``busy_s`` of a device: its compute (F, B, W) for one iteration of M micro-batches plus
  the all-reduce time it is blocked for (with ``overlap_allreduce``, what the compute does not
  hide: waiting for its reduction before its optimizer step, or the reduction's tail after its
  last action). ``bubble_fraction`` = 1 - sum(busy) / (K * iteration_s): the share of device
  time spent idle (waiting for inputs or transfers).
  Uniform stages and free communication give (K-1)/(M+K-1) under gpipe and 1f1b.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from planner import ir
from planner.costmodel import stage_costs
from planner.errors import PlanError, ScheduleError
from planner.schedule import Schedule, schedule_kind
from planner.simulate.engine import Engine
from planner.simulate.events import Event
from planner.simulate.measure import result as _result
from planner.simulate.result import MAX_PIPEDREAM_BLOCKS, PIPEDREAM_MEASURED, DeviceResult, SimOptions, SimResult
from planner.validate import validate_plan

__all__ = ["DeviceResult", "Event", "SimOptions", "SimResult", "pipedream_settle_blocks", "plan_options", "simulate",
           "simulate_costs", "validate_plan"]


def pipedream_settle_blocks(stages: int, microbatches: int) -> int:
    """Iterations of M micro-batches run before the measured ones (warm-up), and after them
    (so that the final drain does not touch them), for a schedule without flush: at first ceil(2K/M)."""
    return -(-2 * stages // microbatches)


def simulate_costs(costs: Sequence[ir.StageCost], schedule: str | Schedule, microbatches: int,
                   virtual_stages: int = 1, options: SimOptions | None = None) -> SimResult:
    """Simulate ``schedule`` over per-chunk ``costs`` (K*v of them, in model order).

    ``schedule`` is a name from :data:`planner.schedule.SCHEDULES` or a ready Schedule.
    """
    opts = options or SimOptions()
    n_chunks = len(costs)
    if n_chunks == 0:
        raise PlanError("no stages to simulate", "a plan needs at least one stage")
    v = virtual_stages
    if n_chunks % v:
        raise PlanError(f"{n_chunks} stages do not split into {v} virtual stages per device",
                        "interleaved plans list K*v chunks")
    k = n_chunks // v
    if isinstance(schedule, Schedule):
        if schedule.chunks != n_chunks:
            raise ScheduleError(f"schedule has {schedule.chunks} stages, the costs {n_chunks}", "match them")
        return _run(costs, schedule, v, opts, pipedream_settle_blocks(k, schedule.microbatches))[0]
    kind = schedule_kind(schedule)
    if kind.flushes:
        return _run(costs, kind.make(k, microbatches, v), v, opts, 0)[0]
    # No flush: lengthen the warm-up and the measured iterations until these repeat with a period.
    measured = max(2, opts.pipedream_blocks or PIPEDREAM_MEASURED)
    settle = pipedream_settle_blocks(k, microbatches)
    for _ in range(4):
        sched = kind.make(k, microbatches, v, blocks=2 * settle + measured)
        sim, stable = _run(costs, sched, v, opts, settle)
        if stable:
            break
        settle *= 2
        measured = min(2 * measured, MAX_PIPEDREAM_BLOCKS)
    return sim


def _run(costs: Sequence[ir.StageCost], sched: Schedule, v: int, opts: SimOptions,
         settle: int) -> tuple[SimResult, bool]:
    """Run the engine; for a schedule without flush measure the iterations after ``settle``
    warm-up ones and before the last ``settle`` (returns whether they all took the same time)."""
    engine = Engine(costs, sched, v, opts, settle)
    engine.run()
    return _result(engine)


def plan_options(plan: ir.Plan, options: SimOptions | None = None) -> SimOptions:
    """``options`` (default ones when None) with the plan's cluster's nodes where some share their
    cores (``concurrent_devices``; :mod:`planner.simulate.cores`: the others bound the lanes that
    also lie on them), unless they name some already."""
    opts = options or SimOptions()
    if opts.core_nodes or not any(n.shares_cores for n in plan.cluster.nodes):
        return opts
    return dataclasses.replace(opts, core_nodes=plan.cluster.nodes)


def simulate(plan: ir.Plan, options: SimOptions | None = None) -> SimResult:
    """Simulate one training iteration of ``plan`` (checked with :func:`validate_plan`)."""
    validate_plan(plan)
    costs = stage_costs(plan)
    return simulate_costs(costs, plan.schedule, plan.microbatches, plan.virtual_stages, plan_options(plan, options))

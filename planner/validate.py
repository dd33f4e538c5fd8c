"""Whether a plan is consistent before anything judges it (pure: no torch, click or rich).

Owns :func:`validate_plan`: a known schedule (and virtual stages only where the schedule
takes them), stages that cover every layer exactly once in order with one form per layer,
devices of the plan's cluster that no two pipeline ranks share, chunk c on the devices of
chunk c mod K, micro-batches that divide the batch (and whose samples per rank the tensor group divides
where it runs ``dp`` layers), and tensor x data grids whose ``tp``
divides the stage and is given wherever a form splits a layer (``tp`` is never inferred:
split forms with ``tp == 1`` are an error, :meth:`planner.ir.Stage.grid_problem`). The simulator and the judge
(:mod:`planner.judge`) call it; whether an engine can run the plan is
:mod:`planner.runnable`'s question.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from planner import ir
from planner.errors import PlanError, ScheduleError, shown_devices
from planner.schedule import SCHEDULES, schedule_kind, virtual_stage_schedules


def validate_plan(plan: ir.Plan) -> None:
    """Raise PlanError unless ``plan`` is consistent: a known schedule, stages that cover every
    layer exactly once in order, one form per layer, devices that exist in its cluster and are
    not shared between pipeline ranks, micro-batches that divide the batch, and consistent grids."""
    _check_plan_fields(plan)
    _check_layer_cover(plan.stages, len(plan.profile.layers))
    _check_stage_devices(plan)
    for i, stage in enumerate(plan.stages):
        problem = stage.grid_problem()
        if problem is not None:
            raise PlanError(f"stage {i}: {problem[0]}", problem[1])
        _check_tensor_samples(plan, i)


def _check_tensor_samples(plan: ir.Plan, i: int) -> None:
    """A ``dp`` layer in a tensor group splits each micro-batch's samples over the group's ``tp`` GPUs, so ``tp``
    must divide them (the cost model's rule, :func:`planner.costmodel.layers.layer_table`, here with the numbers)."""
    stage = plan.stages[i]
    if stage.tp == 1 or "dp" not in stage.forms:
        return
    samples = plan.micro_batch_size(stage)
    if not math.isclose(samples / stage.tp, round(samples / stage.tp)):
        raise PlanError(f"stage {i}: its 'dp' layers split each micro-batch's {samples:.6g} samples per data-parallel "
                        f"rank (batch {plan.batch_size} / ({plan.microbatches} micro-batches x dp {stage.dp})) over "
                        f"its tensor group of {stage.tp} GPUs, which does not divide them",
                        f"use fewer micro-batches, so that a multiple of {stage.tp} samples reach each rank, or 'tp' "
                        "and split forms for those layers (planner search emits only such plans)")


def _check_plan_fields(plan: ir.Plan) -> None:
    """The schedule, virtual stages, stage count and micro-batches."""
    try:
        kind = schedule_kind(plan.schedule)
    except ScheduleError:
        raise PlanError(f"plan asks for unknown schedule {plan.schedule!r}",
                        f"use one of {', '.join(SCHEDULES)}") from None
    v = plan.virtual_stages
    if not isinstance(v, int) or v < 1:
        raise PlanError(f"plan.virtual_stages must be a positive integer, got {v!r}", "fix virtual_stages")
    if v != 1 and not kind.takes_virtual_stages:
        raise PlanError(f"plan has virtual_stages={v} under schedule {plan.schedule!r}",
                        f"virtual stages need --schedule {' or '.join(virtual_stage_schedules())}")
    stages = plan.stages
    if not stages:
        raise PlanError("plan has no stages", "re-create the plan with planner search")
    if len(stages) % v:
        raise PlanError(f"plan lists {len(stages)} stages, not a multiple of virtual_stages={v}",
                        "an interleaved plan lists K*v model chunks")
    if plan.microbatches < 1:
        raise PlanError(f"plan.microbatches must be positive, got {plan.microbatches}", "fix microbatches")
    if plan.batch_size % plan.microbatches:
        raise PlanError(f"{plan.microbatches} micro-batches do not divide the batch size {plan.batch_size}",
                        "choose a divisor of the batch size")


def _check_layer_cover(stages: Sequence[ir.Stage], n_layers: int) -> None:
    """The stages cover layers 0..n_layers-1 exactly once, in order, with one form per layer."""
    expect = 0
    for i, s in enumerate(stages):
        first, end = s.layers
        if first > expect:
            missing = f"layer {expect}" if first == expect + 1 else f"layers {expect}..{first - 1}"
            raise PlanError(f"stage {i} starts at layer {first}: {missing} in no stage",
                            "stages must cover every layer exactly once, in order")
        if first < expect:
            raise PlanError(f"stage {i} starts at layer {first}: layer {first} is in two stages",
                            "stages must cover every layer exactly once, in order")
        if end <= first:
            raise PlanError(f"stage {i} has an empty layer range {list(s.layers)}", "give each stage a layer")
        if len(s.forms) != end - first:
            raise PlanError(f"stage {i}: {len(s.forms)} forms for {end - first} layers", "give one form per layer")
        expect = end
    if expect != n_layers:
        if expect < n_layers:
            raise PlanError(f"layers {expect}..{n_layers - 1} are in no stage (the model has {n_layers})",
                            "stages must cover every layer exactly once")
        raise PlanError(f"stages cover layers up to {expect}, the model has only {n_layers}",
                        "the plan does not match its profile")


def _check_stage_devices(plan: ir.Plan) -> None:
    """Every stage has devices of the cluster, each listed once; chunk c runs on the devices of
    chunk c mod K; no device is in two pipeline ranks."""
    stages = plan.stages
    known = {g.name for g in plan.cluster.gpus}
    k = plan.pipeline_stages
    owner: dict[str, int] = {}
    for i, s in enumerate(stages):
        if not s.devices:
            raise PlanError(f"stage {i} has no devices", "give each stage at least one device")
        for d in s.devices:
            if d not in known:
                raise PlanError(f"stage {i} uses device {d!r}, which is not in cluster {plan.cluster.name!r}",
                                "use device names from the plan's cluster")
        if len(set(s.devices)) != len(s.devices):
            twice = sorted({d for d in s.devices if s.devices.count(d) > 1})
            raise PlanError(f"stage {i} lists a device twice: {shown_devices(twice)} in {shown_devices(s.devices)}",
                            "list each device once")
        if i >= k and tuple(s.devices) != tuple(stages[i % k].devices):
            raise PlanError(f"stage {i} (chunk of device group {i % k}) runs on {shown_devices(s.devices)}, not on "
                            f"{shown_devices(stages[i % k].devices)}", "chunk c runs on the devices of chunk c mod K")
        if i < k:
            for d in s.devices:
                if d in owner:
                    raise PlanError(f"device {d!r} is in stage {owner[d]} and stage {i}",
                                    "each device belongs to one pipeline stage")
                owner[d] = i

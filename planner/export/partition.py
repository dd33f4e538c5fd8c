"""The plan's pipeline as both engines lay it out: stage layer ranges, boundaries, one width.

Both engines run a ``K x W`` grid (K stages, each on W devices; stage ``s``'s device ``j``
is global rank ``s * W + j``). :func:`check_common` refuses the plans neither engine can lay
out that way; :func:`manual_plan` makes a plan from given boundaries (tests, comparisons
with the engines' own partitions).
"""

from __future__ import annotations

from collections.abc import Sequence

from planner import ir
from planner.errors import ExportError


def ranges(plan: ir.Plan) -> list[tuple[int, int]]:
    """Layer range [first, end) of each plan stage."""
    return [tuple(s.layers) for s in plan.stages]  # type: ignore[misc]


def boundaries(plan: ir.Plan) -> list[int]:
    """Stage boundaries as DeepSpeed's ``parts``: [0, b1, ..., N]."""
    return [s.layers[0] for s in plan.stages] + [plan.stages[-1].layers[1]]


def check_common(plan: ir.Plan, engine: str) -> int:
    """Checks every engine needs; returns the common stage width.

    An interleaved plan (``virtual_stages`` v > 1) lists K*v chunks on K device groups.
    """
    n = len(plan.profile.layers)
    expect = 0
    for i, st in enumerate(plan.stages):
        if st.layers[0] != expect:
            raise ExportError(f"stage {i} starts at layer {st.layers[0]}, expected {expect}: stages must be "
                              "contiguous", "re-run planner search")
        expect = st.layers[1]
    if expect != n:
        raise ExportError(f"the stages cover layers 0..{expect} of {n}", "re-run planner search")
    widths = [s.width for s in plan.stages]
    for i, w in enumerate(widths):
        if w != widths[0]:
            raise ExportError(f"stage {i} has {w} devices but stage 0 has {widths[0]}: {engine} runs a "
                              "pipeline x data-parallel grid with every stage the same width (config "
                              f"{plan.config})", f"search a runnable plan with `planner search --engine {engine}`")
    groups = len(plan.stages) // max(plan.virtual_stages, 1)
    if plan.world_size != groups * widths[0]:
        raise ExportError(f"the plan's stages share devices ({plan.world_size} distinct for {groups} "
                          f"stages of width {widths[0]})", f"search with `planner search --engine {engine}`")
    w = widths[0]
    b, m = plan.batch_size, plan.microbatches
    if b % (m * w):
        raise ExportError(f"batch {b} cannot be cut into {m} micro-batches over {w} data-parallel devices "
                          "of equal size", "choose --microbatches so that batch / (microbatches x width) is whole")
    return w


def micro_batch_size(plan: ir.Plan, width: int) -> int:
    return plan.batch_size // (plan.microbatches * width)


def manual_plan(profile: ir.ModelProfile, cluster: ir.Cluster, parts: Sequence[int], width: int = 1, *,
                microbatches: int = 1, schedule: str = "1f1b", optimizer: str = "sgd",
                forms: Sequence[Sequence[str]] | None = None, tp: int | None = None,
                predicted: ir.Prediction | None = None) -> ir.Plan:
    """A plan with given stage boundaries ``parts`` ([0, b1, ..., N]) on ``width`` devices per stage.

    ``tp``: every stage's tensor degree; None gives a stage with a split form ``tp = width``
    (its forms split over all its devices) and the others ``tp = 1``.

    For comparisons with engines' own partitions (DeepSpeed's ``partition_method``) and
    for tests. Devices are taken from the cluster in order; the prediction is a
    placeholder unless given (``planner.simulate`` can predict it).
    """
    devices = [g.name for g in cluster.gpus]
    k = len(parts) - 1
    if k * width > len(devices):
        raise ExportError(f"{k} stages x {width} devices need {k * width} devices; the cluster has "
                          f"{len(devices)}", "use a larger cluster")
    stages = tuple(
        ir.Stage((parts[s], parts[s + 1]), tuple(devices[s * width:(s + 1) * width]),
                 tuple(forms[s]) if forms else ("dp",) * (parts[s + 1] - parts[s]), 0,
                 tp=tp if tp is not None else (width if forms and set(forms[s]) - {"dp"} else 1))
        for s in range(k))
    pred = predicted or ir.Prediction(0.0, 0.0, 0.0, 0)
    return ir.Plan(profile=profile, cluster=cluster, schedule=schedule, microbatches=microbatches,
                   optimizer=optimizer, stages=stages, predicted=pred)

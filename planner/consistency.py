"""A plan file's own agreement, checked wherever a plan is read (pure).

:func:`load_plan` reads a plan file (schema-checked by :func:`planner.jsonio.read_json`, then
``ir.Plan.from_dict``) and refuses what a hand edit can break that neither catches: the plan's
``model``, ``batch_size``, ``config`` and per-stage ``dp`` and ``micro_batch_size`` must agree with
its embedded profile and stages, ``solver`` must be known (``engine`` is the schema's), stages must cover the
model and name devices of the embedded cluster. What can still be simulated but is suspicious
comes back as warnings: a plan its engine cannot run (:mod:`planner.runnable`), and a prediction
that differs from the plan's simulation by more than :data:`TOLERANCE` (times edited, or an
analytic ``--rerank 0`` prediction).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from planner import ir, runnable
from planner.errors import FormatError, PlanError, PlannerError
from planner.jsonio import read_json

if TYPE_CHECKING:
    from planner.simulate import SimResult

TOLERANCE = 0.02
"""Relative difference between a plan's predicted and simulated iteration that is worth a warning."""

MAX_SIMULATED_ACTIONS = 200_000
"""Stages x micro-batches above which loading skips the prediction check (a few seconds of simulation)."""

def known_solvers() -> tuple[str, ...]:
    """The search's solvers and the baselines' names (a compare row's plan names its strategy)."""
    from planner.search import SOLVERS
    from planner.search.baselines import STRATEGIES

    return tuple(dict.fromkeys((*SOLVERS, *STRATEGIES)))  # 'dp' is a solver and a baseline


def load_plan(path: str | os.PathLike[str], *, check_prediction: bool = True) -> tuple[ir.Plan, list[str]]:
    """Read and check a plan file: the plan and its warnings (errors raise :class:`FormatError`)."""
    source = str(path)
    doc = read_json(path, "plan")
    plan = ir.Plan.from_dict(doc, source)
    check_plan(doc, plan, source)
    warnings = [f"{source}: the plan cannot run on {plan.engine}: {p}" for p in runnable.problems(plan)[:3]]
    unrun = runnable.unrun_note(plan)  # searched for no engine, and none runs it
    warnings += [f"{source}: {unrun[0]}; {unrun[1]}"] if unrun is not None else []
    warnings += idle_settings(plan, source)
    if check_prediction:
        warnings += prediction_warnings(plan, source)
    return plan, warnings


def idle_settings(plan: ir.Plan, source: str) -> list[str]:
    """Warnings for settings that change nothing: sequence parallelism without a tensor group or a block in the
    ``tp`` form, selective
    recomputation (of attention cores) in a model without transformer blocks."""
    out = [f"{source}: stage {i} sets sequence_parallel "
           + ("at tp 1" if st.tp == 1 else "with no transformer block in the 'tp' form")
           + ", which changes nothing (it shards the norms and dropout of a tensor group's blocks over the sequence)"
           for i, st in enumerate(plan.stages) if st.sequence_parallel and (st.tp == 1 or "tp" not in st.forms)]
    if not plan.profile.has_blocks:
        out += [f"{source}: stage {i} recomputes 'selective' (the attention cores), but the model has no "
                "transformer block: it keeps every activation, as 'none' does"
                for i, st in enumerate(plan.stages) if st.recompute == "selective"]
    return out


def _refuse(source: str, what: str, hint: str = "re-create the plan with planner search") -> FormatError:
    return FormatError(f"{source}: {what}", hint)


def check_plan(doc: Mapping[str, Any], plan: ir.Plan, source: str) -> None:
    """Raise :class:`FormatError` (or the simulator's :class:`PlanError`: stages that do not cover the
    model, devices not in the cluster) where the plan's fields disagree with each other or its profile."""
    for key, own in (("model", plan.model), ("batch_size", plan.batch_size)):
        if key in doc and doc[key] != own:
            raise _refuse(source, f"'{key}' is {doc[key]!r:.60} but the plan's profile gives {own!r:.60}")
    if plan.solver not in known_solvers():
        raise _refuse(source, f"'solver' is {plan.solver!r:.40}", f"use one of {', '.join(known_solvers())}")
    from planner.simulate import validate_plan

    try:
        validate_plan(plan)  # schedule, layer cover, devices, virtual stages, micro-batches dividing the batch
    except PlanError as exc:
        raise PlanError(f"{source}: {exc.cause}", exc.hint) from None
    if doc.get("config", plan.config) != plan.config:
        raise _refuse(source, f"'config' is {doc['config']!r:.60} but the stages give {plan.config!r}")
    _check_stages(doc, plan, source)


def _check_stages(doc: Mapping[str, Any], plan: ir.Plan, source: str) -> None:
    for i, (stage, raw) in enumerate(zip(plan.stages, doc["stages"], strict=True)):
        where = f"stages[{i}]"
        if "dp" in raw and raw["dp"] != stage.dp:
            raise _refuse(source, f"{where}.dp is {raw['dp']!r} but its {stage.width} devices at tp {stage.tp} "
                                  f"give {stage.dp}")
        mbs = raw.get("micro_batch_size")
        if mbs is not None and not math.isclose(mbs, plan.micro_batch_size(stage), rel_tol=1e-9):
            raise _refuse(source, f"{where}.micro_batch_size is {mbs!r} but batch {plan.batch_size} / "
                                  f"({plan.microbatches} micro-batches x dp {stage.dp}) is "
                                  f"{plan.micro_batch_size(stage):.6g}")


def prediction_warnings(plan: ir.Plan, source: str) -> list[str]:
    """Warnings from the plan's simulation: its predicted iteration or peak memory and the simulated one differ
    by more than :data:`TOLERANCE`; devices overflow their memory (as the simulator plays the plan on its
    cluster)."""
    if len(plan.stages) * plan.microbatches > MAX_SIMULATED_ACTIONS:
        return []
    from planner.simulate import simulate

    try:
        result = simulate(plan)
    except PlannerError:  # what the plan's own command meets, it reports in its own words
        return []
    return (prediction_gap(plan.predicted.iteration_s, result.iteration_s, source)
            + memory_gap(plan.predicted.peak_memory_bytes, result.peak_memory_bytes, source)
            + stage_memory_gap(plan, result, source) + memory_warnings(result, source))


def stage_memory_gap(plan: ir.Plan, result: SimResult, source: str) -> list[str]:
    """One warning for the first stage whose ``memory_bytes`` (the peak per device that ``planner run`` reports as
    each rank's prediction) differs from the simulated peak of its devices by more than :data:`TOLERANCE`."""
    peaks = {d.device: d.peak_memory_bytes for d in result.devices}
    for i, stage in enumerate(plan.stages):
        simulated = max(peaks.get(d, 0) for d in stage.devices)
        if abs(simulated - stage.memory_bytes) > TOLERANCE * max(simulated, 1):
            return [f"{source}: stage {i} predicts {stage.memory_bytes / 2**30:.4g} GiB per device but its devices "
                    f"simulate to {simulated / 2**30:.4g} GiB (more than {TOLERANCE:.0%} apart): its memory_bytes may "
                    "have been edited, or the plan was searched by an earlier planner; planner search writes it again"]
    return []


def memory_warnings(result: SimResult, source: str) -> list[str]:
    """One warning when devices overflow their memory: how many, the worst one and its bytes."""
    over = [d for d in result.devices if not d.fits]
    if not over:
        return []
    worst = max(over, key=lambda d: d.peak_memory_bytes - d.capacity_bytes)
    return [f"{source}: the plan does not fit: {len(over)} of {len(result.devices)} devices need more memory than "
            f"they have (worst {worst.device}: {worst.peak_memory_bytes / 2**30:.2f} GiB of "
            f"{worst.capacity_bytes / 2**30:.2f}); planner search finds a plan that fits"]


def prediction_gap(predicted_s: float, simulated_s: float, source: str) -> list[str]:
    """The warning of :func:`prediction_warnings` for two iteration times (empty when they agree)."""
    if abs(simulated_s - predicted_s) <= TOLERANCE * predicted_s or simulated_s == predicted_s == 0:
        return []
    apart = (f"{simulated_s / predicted_s:.3g}x, more than {TOLERANCE:.0%} apart" if predicted_s > 0
             else "no time at all predicted")
    return [f"{source}: the plan predicts {predicted_s * 1000:.4g} ms per iteration but simulates to "
            f"{simulated_s * 1000:.4g} ms ({apart}): "
            "its times may have been edited, or it was searched with --rerank 0 (an analytic prediction)"]


def memory_gap(predicted_bytes: int, simulated_bytes: int, source: str) -> list[str]:
    """The warning of :func:`prediction_warnings` for two peak memories (empty when they agree): a figure edited
    by hand, or a plan searched by an earlier cost model."""
    if abs(simulated_bytes - predicted_bytes) <= TOLERANCE * max(predicted_bytes, 1):
        return []
    return [f"{source}: the plan predicts a peak of {predicted_bytes / 2**30:.4g} GiB per device but simulates to "
            f"{simulated_bytes / 2**30:.4g} GiB (more than {TOLERANCE:.0%} apart): its memory may have been "
            "edited, or the plan was searched by an earlier planner; planner search writes it again"]

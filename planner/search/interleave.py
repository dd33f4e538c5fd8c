"""Interleaved plans with v > 1 model chunks per device group (Megatron's virtual stages).

Owns how ``planner search --schedule interleaved --virtual-stages V`` turns the stage DP's
K-stage plans into K*v-chunk plans, and how it judges them. Pure: no torch, click or rich.

Method (a documented heuristic, not an exact optimum over the interleaved space):

1. The stage DP (:func:`planner.search.search`, schedule ``interleaved``) finds K-stage
   plans: the device groups, their order, widths and recomputation.
2. :func:`chunk_plan` keeps those K groups and re-cuts the N layers into K*v contiguous
   chunks in model order, chunk c on group c mod K (chunk 0 on group 0, ..., chunk K on
   group 0 again), as Megatron-LM assigns virtual stages (Narayanan et al., SC'21,
   section 2.2). The layer boundaries are a balanced contiguous partition: the one that
   minimises the slowest chunk, a chunk's time per micro-batch being
   ``max(forward + backward on its own group under its HPP forms, receiving its input)``
   (:func:`planner.search.hpp.stage_tables`; the transfer, alpha + S/B from the previous
   chunk's group, overlaps compute in steady state as in planner.costmodel.stage_terms).
   So a faster or wider group takes more layers, and cuts avoid large activations on slow
   links. The all-reduce, paid once per iteration, is left out of the balance. Each
   chunk's forms are HPP's on its group.
3. The simulator judges (:func:`planner.judge.judge`): every candidate the DP met is chunked and played
   under the interleaved schedule with v chunks (memory: static bytes of the group's
   chunks plus the activations of the chunk micro-batches in flight,
   :func:`planner.schedule.in_flight_microbatches`); the fastest candidate whose devices
   all fit wins, and its ``predicted`` is that simulation. The DP's own memory check is the
   v = 1 one, so a K-stage plan that fits may not fit once interleaved (more micro-batches
   in flight): such candidates are skipped, and none fitting is an InfeasibleError.

M need not be a multiple of K: the schedule adds the warm-up forwards that avoid a
deadlock (:func:`planner.schedule.interleaved_extra_warmup`). For ``--engine torch``,
``ScheduleInterleaved1F1B`` (torchtitan's too) needs M divisible by max(1, M // K), and runs the order simulated only
where its rounds of micro-batches are K long or M is below K (:func:`planner.schedule.kinds.torch_order_matches`): the
K-stage search keeps to the counts that run on K ranks of v chunks (planner.search.counts.CHUNKS).
``--engine deepspeed`` runs no interleaved schedule (UsageError).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from planner import ir
from planner.cluster import link_between
from planner.costmodel import layer_table, p2p_s, stage_grid
from planner.errors import InfeasibleError, UsageError
from planner.judge import Judged, judge
from planner.schedule import schedule_kind
from planner.search.counts import CHUNKS
from planner.search.hpp import hpp, stage_tables
from planner.search.options import DEFAULT_VIRTUAL_STAGES, engine_forms, resolve_virtual_stages

__all__ = ["DEFAULT_VIRTUAL_STAGES", "balanced_bounds", "chunk_plan", "resolve_virtual_stages", "search_interleaved"]


def balanced_bounds(chunk_time: Sequence[np.ndarray], n_layers: int, v: int,
                    recv_time: Sequence[np.ndarray] | None = None) -> list[int]:
    """Layer boundaries [0, b1, ..., N] of K*v contiguous chunks, minimising the slowest chunk.

    Chunk c > 0 starting at layer a and ending before b takes ``max(chunk_time[c % K][a, b],
    recv_time[c % K][a])`` (its compute, and receiving its input from the previous chunk's
    group; no receive when ``recv_time`` is None), chunk 0 ``chunk_time[0][0, b]``. A min-max
    chain DP over (chunk, end layer), O(K v N^2); ties go to the earliest cut. ValueError
    when N < K*v (every chunk needs a layer).
    """
    k = len(chunk_time)
    n_chunks = k * v
    if n_layers < n_chunks:
        raise ValueError(f"{n_layers} layers cannot make {n_chunks} chunks")
    best = np.full((n_chunks + 1, n_layers + 1), np.inf)
    cut = np.zeros((n_chunks + 1, n_layers + 1), dtype=int)
    best[0, 0] = 0.0
    for c in range(1, n_chunks + 1):
        t = np.asarray(chunk_time[(c - 1) % k])
        for j in range(c, n_layers - (n_chunks - c) + 1):
            starts = np.arange(c - 1, j)
            own = t[starts, j]
            if recv_time is not None and c > 1:
                own = np.maximum(own, np.asarray(recv_time[(c - 1) % k])[starts])
            cand = np.maximum(best[c - 1, starts], own)
            i = int(np.argmin(cand))
            best[c, j] = cand[i]
            cut[c, j] = starts[i]
    bounds = [n_layers]
    for c in range(n_chunks, 0, -1):
        bounds.append(int(cut[c, bounds[-1]]))
    return bounds[::-1]


def chunk_plan(plan: ir.Plan, v: int) -> ir.Plan:
    """The K-stage ``plan`` re-cut into K*v chunks on its K device groups (module doc, step 2).

    The result has ``schedule="interleaved"``, ``virtual_stages=v``, stage memory 0 and the
    K-stage prediction (:func:`planner.judge.judge` fills both in); ValueError when the model has fewer
    than K*v layers.
    """
    profile, cluster, m = plan.profile, plan.cluster, plan.microbatches
    groups = [s.devices for s in plan.stages]
    n_layers = len(profile.layers)
    forms, rules = engine_forms(plan.engine)  # the engine's own limits, as the K-stage search had them
    tables = [layer_table(profile, stage_grid(cluster, s, plan.precision, plan.engine), m, plan.optimizer, forms, rules)
              for s in plan.stages]
    times = [stage_tables(t, np.arange(n_layers + 1), m).time for t in tables]
    k = len(groups)
    bounds = balanced_bounds(times, n_layers, v, _receive_times(plan, tables[0].out_bytes))
    stages = []
    for c in range(k * v):
        first, end = bounds[c], bounds[c + 1]
        forms, _ = hpp(tables[c % k], first, end, m)
        base = plan.stages[c % k]  # sequence parallelism where the chunk has a block to shard, as the search sets it
        sequence = base.sequence_parallel and rules.shards_sequence(forms, base.tp)
        stages.append(dataclasses.replace(base, layers=(first, end), forms=forms, memory_bytes=0,
                                          sequence_parallel=sequence))
    return dataclasses.replace(plan, schedule="interleaved", virtual_stages=v, stages=tuple(stages))


def _receive_times(plan: ir.Plan, out_bytes: np.ndarray) -> list[np.ndarray] | None:
    """Per group g, receiving layer a's input from group g-1 mod K per micro-batch (alpha + S/B,
    planner.costmodel.p2p_s; index a, 0 at a = 0); None with one group (chunks share devices)."""
    groups = [s.devices for s in plan.stages]
    if len(groups) == 1:
        return None
    out = []
    for g, devs in enumerate(groups):
        link, _ = link_between(plan.cluster, groups[g - 1], devs)
        recv = np.array([0.0] + [p2p_s(float(b), link) for b in out_bytes[:-1]])
        out.append(recv)
    return out


def search_interleaved(profile: ir.ModelProfile, cluster: ir.Cluster, virtual_stages: int, *,
                       microbatches: int | str = "auto", optimizer: str = "sgd", solver: str = "dp",
                       engine: str = "any", config: Sequence[int] | None = None, candidates: int = 16,
                       progress: Callable[[str], None] | None = None, **space: Any) -> ir.Plan:
    """The fastest interleaved plan with ``virtual_stages`` chunks per group that fits (module doc).

    ``virtual_stages=1`` is the plain search under ``interleaved``; ``space`` passes the grid
    options (precision, tp, zero, recompute, micro_batch_size) to :func:`planner.search.search`.
    """
    from planner.search import _with_prediction, search

    v = virtual_stages
    _check_virtual_stages(v, engine)
    _check_chunks(v, len(profile.layers), config)
    if v == 1:
        return search(profile, cluster, microbatches=microbatches, schedule="interleaved", optimizer=optimizer,
                      solver=solver, engine=engine, config=config, progress=progress, candidates=candidates,
                      virtual_stages=1, **space)
    judged: dict[tuple, Judged | None] = {}

    def evaluate(base: ir.Plan) -> float:
        key = _base_key(base)
        if key not in judged:
            judged[key] = _judge_base(base, v, engine)
        one = judged[key]
        return one.prediction.iteration_s if one is not None and one.fits else math.inf

    token = CHUNKS.set(v)  # the micro-batch counts the engine runs on K ranks of v chunks (planner.search.counts)
    try:
        base = search(profile, cluster, microbatches=microbatches, schedule="interleaved", optimizer=optimizer,
                      solver=solver, engine=engine, config=config, progress=progress, evaluate=evaluate,
                      candidates=candidates, virtual_stages=1, **space)
    except InfeasibleError as exc:  # its least memory is one chunk per group's: v chunks hold more in flight
        raise InfeasibleError(f"{exc.cause}; that is with one chunk per device group, and {v} chunks a group hold "
                              "more micro-batches in flight, so an interleaved plan needs more", exc.hint) from None
    finally:
        CHUNKS.reset(token)
    score = evaluate(base)
    best = judged[_base_key(base)]
    if best is None or not best.fits or not math.isfinite(score):
        raise InfeasibleError(
            f"no plan the search met runs interleaved with {v} chunks per device group: too few layers for "
            f"K*{v} chunks, the extra micro-batches in flight do not fit in memory"
            + (f", or {engine} runs no micro-batch count met in the order simulated (M a multiple of K, or below K)"
               if engine in ("torch", "torchtitan") else ""),
            "try --virtual-stages 1, more micro-batches, a smaller batch, or a larger cluster")
    return _with_prediction(best.plan, best.prediction)  # the candidates judged carry no data-parallel time


def _check_chunks(v: int, n_layers: int, config: Sequence[int] | None) -> None:
    """A UsageError when even the fewest stages the request allows (``--config``'s, else one) cut into ``v``
    chunks each make more chunks than the model has layers: no plan can, whatever the memory."""
    stages = len(config) if config else 1
    if stages * v > n_layers:
        given = f"--config {'-'.join(map(str, config))}'s {stages} stages" if config else "one stage"
        raise UsageError(f"--virtual-stages {v} on {given} cuts the model into {stages * v} chunks of one layer or "
                         f"more, and it has {n_layers} layers",
                         f"use --virtual-stages {max(1, n_layers // stages)} or fewer"
                         + (", or fewer stages in --config" if config else ""))


def _check_virtual_stages(v: object, engine: str) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise UsageError(f"--virtual-stages must be a positive integer, got {v!r}", "e.g. --virtual-stages 2")
    if v > 1 and engine == "deepspeed":
        raise UsageError("DeepSpeed's pipeline engine runs no interleaved schedule",
                         "use --engine torch or any, or --virtual-stages 1")


def _base_key(base: ir.Plan) -> tuple:
    """What makes two K-stage candidates chunk into the same plan."""
    return base.microbatches, tuple((s.layers, s.devices, s.tp, s.zero, s.recompute) for s in base.stages)


def _judge_base(base: ir.Plan, v: int, engine: str) -> Judged | None:
    """Chunk and judge one K-stage candidate; None when it cannot run interleaved."""
    k = base.pipeline_stages
    refused = schedule_kind("interleaved").engine_refusal(engine, base.microbatches, k, v)  # torch and torchtitan
    if len(base.profile.layers) < k * v or refused is not None:
        return None
    return judge(chunk_plan(base, v))

"""The search's inputs: the user's options checked, and turned into the problems the stage DP solves.

Pure. Owns every rule that makes a requested search impossible before it starts (with the
numbers and a fix): precision, tensor degree, ZeRO stage, recomputation, micro-batch counts
and sizes (``batch = micro_batch_size x microbatches x dp``, Megatron-LM's batch
arithmetic), ``--config`` and the engine's limits (planner.engines.ENGINES); and which
problems a search solves: one over the whole space, or, for an engine that runs one grid
for every stage, one per stage width and tensor degree (and ZeRO stage where the engine
takes one for the whole job).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from planner import ir
from planner.cluster import server_share
from planner.costmodel import default_precision
from planner.errors import UsageError, is_whole
from planner.runnable import ANY_FORMS, EngineLimits, FormRules, llama_problem, tied_layers
from planner.runnable import ENGINES as ENGINE_LIMITS
from planner.schedule import SCHEDULES, schedule_kind, virtual_stage_schedules
from planner.search.framed import Framed, frame_problem
from planner.search.space import Space, pow2_upto

SOLVERS = ("dp", "brute")
ENGINES = ("any", *ENGINE_LIMITS)


def parse_config(text: str) -> tuple[int, ...]:
    """PipeDream notation ``2-1-1`` -> (2, 1, 1); UsageError names the value."""
    try:
        widths = tuple(int(x) for x in text.split("-"))
    except ValueError:
        raise UsageError(f"--config {text!r} is not in PipeDream notation", "write devices per stage, e.g. 2-1-1") \
            from None
    if not widths or any(w <= 0 for w in widths):
        raise UsageError(f"--config {text!r} has a stage with no devices", "every stage needs at least one device")
    return widths


def config_widths(config: str | Sequence[int] | None) -> tuple[int, ...] | None:
    """A ``config`` as the library takes it, ``"2-1-1"`` or ``(2, 1, 1)``, as widths; UsageError otherwise."""
    if config is None or isinstance(config, str):
        return parse_config(config) if config is not None else None
    try:
        widths = tuple(config)
    except TypeError:  # a library caller's config=21
        raise UsageError(f"config {config!r:.40} is not a sequence of devices per stage",
                         'pass whole numbers of at least 1, e.g. (2, 1, 1), or the text "2-1-1"') from None
    if not widths or not all(isinstance(w, int) and not isinstance(w, bool) and w > 0 for w in widths):
        raise UsageError(f"config {widths!r} is not a sequence of devices per stage",
                         'pass whole numbers of at least 1, e.g. (2, 1, 1), or the text "2-1-1"')
    return widths


def check_hooks(candidates: object, progress: object, alternatives: object, evaluate: object = None) -> None:
    """The library's search arguments that are no grid option: ``candidates`` a whole number (0 or more),
    ``progress`` and ``evaluate`` a callable or None, ``alternatives`` a list (which receives the judged
    candidates) or None."""
    if evaluate is not None and not callable(evaluate):
        raise UsageError(f"evaluate must be a function of a plan or None, got {type(evaluate).__name__}",
                         "e.g. evaluate=lambda plan: my_measurement(plan)")
    if not is_whole(candidates, 0):
        raise UsageError(f"candidates must be a whole number of 0 or more, got {candidates!r:.40}",
                         "e.g. candidates=16 (the default), or 0 for the analytic optimum")
    if progress is not None and not callable(progress):
        raise UsageError(f"progress must be a function of one string or None, got {type(progress).__name__}",
                         "e.g. progress=print")
    if alternatives is not None and not isinstance(alternatives, list):
        raise UsageError(f"alternatives must be a list (it receives the judged candidates) or None, got "
                         f"{type(alternatives).__name__}", "pass an empty list: alternatives=[]")


DEFAULT_VIRTUAL_STAGES = 2
"""Chunks per device group when ``--schedule interleaved`` is given without ``--virtual-stages``."""


def resolve_virtual_stages(value: int | None, schedule: str) -> int:
    """``--virtual-stages``: default :data:`DEFAULT_VIRTUAL_STAGES` under a schedule that takes
    virtual stages (interleaved), else 1; v > 1 under another schedule is a UsageError."""
    takes_virtual = schedule_kind(schedule).takes_virtual_stages
    if value is None:
        return DEFAULT_VIRTUAL_STAGES if takes_virtual else 1
    if not is_whole(value, 1):
        raise UsageError(f"--virtual-stages must be a positive integer, got {value!r}", "e.g. --virtual-stages 2")
    if value > 1 and not takes_virtual:
        names = " or ".join(virtual_stage_schedules())
        raise UsageError(f"--virtual-stages {value} needs --schedule {names}, not {schedule}",
                         f"add --schedule {names}, or drop --virtual-stages")
    return value


@dataclass(frozen=True)
class Request:
    """What the user asked for, checked: everything but the profile, cluster and micro-batch counts."""

    schedule: str
    optimizer: str
    solver: str
    engine: str
    config: tuple[int, ...] | None
    space: Space
    max_blocks: int | None = None


def _choice(name: str, value: object, allowed: Sequence[object]) -> None:
    if value not in allowed:
        raise UsageError(f"unknown {name} {value!r}", f"use one of {', '.join(map(str, allowed))}")


def _one_or_all(option: str, value: object, every: Sequence[object], allowed: Sequence[object], engine: str,
                noun: str, under: str = "") -> tuple[Any, ...]:
    """``auto``: every value the engine runs; else ``value``, which must be known and run by the engine."""
    if value == "auto":
        return tuple(allowed)
    if isinstance(value, (bool, float)):  # equal to 1 or 0 in ``in``, but not a stage's value
        raise UsageError(f"unknown {option} {value!r}", f"use one of {', '.join(map(str, (*every, 'auto')))}")
    _choice(option, value, (*every, "auto"))
    if value not in allowed:
        shown = ", ".join(map(str, allowed))
        raise UsageError(f"--engine {engine} runs {noun} {shown}{under}, not {value!r}",
                         f"use {option} auto or one of {shown}, or another {'--schedule or ' if under else ''}--engine")
    return (value,)


def _allowed(engine: str, schedule: str, zero: bool) -> tuple[tuple[Any, ...], str]:
    """The ZeRO stages (``zero``) or recomputation modes the engine runs under ``schedule`` (every one for ``any``),
    and, where the schedule's split backward narrows them, the words that say so."""
    limits, split = ENGINE_LIMITS.get(engine), schedule_kind(schedule).splits_weight_grad
    if limits is None:
        return (ir.ZERO_STAGES if zero else ir.RECOMPUTE), ""
    allowed = limits.zero_stages(split) if zero else limits.recompute_modes(split)
    narrowed = allowed != (limits.zero_stages() if zero else limits.recompute_modes())
    return allowed, f" under {schedule}'s split backward" if narrowed else ""


def _zero_set(zero: int | str, engine: str, cluster: ir.Cluster, schedule: str) -> tuple[int, ...]:
    allowed, under = _allowed(engine, schedule, zero=True)
    zeros = _one_or_all("--zero", zero, ir.ZERO_STAGES, allowed, engine, "ZeRO stages", under)
    if zero != "auto" and zero and len(cluster.gpus) == 1:
        raise UsageError(f"--zero {zero} shards over data-parallel ranks, the cluster {cluster.name!r} has one GPU",
                         "use --zero 0 (or auto) on one device")
    return tuple(int(z) for z in zeros)


def _check_zero_widths(zeros: tuple[int, ...], config: Sequence[int] | None, tp: int | None, gpus: int) -> None:
    """A fixed ZeRO stage shards over a stage's data-parallel ranks: a --config stage with one, or a --tp that leaves
    one in a stage of all ``gpus``, has nothing to shard, so no plan exists (the search would blame the batch's
    divisors)."""
    if 0 not in zeros and tp and gpus // tp < 2:
        raise UsageError(f"--zero {zeros[0]} shards over two or more data-parallel ranks, and at --tp {tp} a stage of "
                         f"all {gpus} GPUs has {gpus // tp}", "use --zero 0 or auto, or a smaller --tp")
    narrow = [w for w in config or () if w // (tp or 1) < 2]
    if 0 not in zeros and narrow:
        text = "-".join(map(str, config or ()))
        raise UsageError(f"--zero {zeros[0]} shards over two or more data-parallel ranks, and a stage of --config "
                         f"{text} has {narrow[0]} device{'s' if narrow[0] > 1 else ''}"
                         + (f" at --tp {tp}" if tp and tp > 1 else ""), "use --zero 0 or auto, or wider stages")


def _recompute_set(recompute: str, engine: str, schedule: str) -> tuple[str, ...]:
    allowed, under = _allowed(engine, schedule, zero=False)
    return _one_or_all("--recompute", recompute, ir.RECOMPUTE, allowed, engine, "recomputation", under)


def _check_tp(tp: int | None, profile: ir.ModelProfile, cluster: ir.Cluster, engine: str) -> None:
    if tp is None:
        return
    biggest = max(len(n.gpus) for n in cluster.nodes)
    if tp < 1 or tp not in pow2_upto(biggest):
        raise UsageError(f"--tp {tp}: tensor groups are powers of two inside one server; the largest server of "
                         f"{cluster.name!r} has {biggest} GPUs", f"use --tp among {pow2_upto(biggest)} or auto")
    limits = ENGINE_LIMITS.get(engine)
    if tp > 1 and limits is not None and not limits.tensor_parallel:
        raise UsageError(f"--engine {engine} runs no tensor parallelism (--tp {tp})", "use --tp 1, or --engine torch")
    norms = [x.name for x in profile.layers if limits is not None and not limits.form_rules.splits_samples(x)]
    if tp > 1 and norms:
        named = f"{', '.join(norms[:3])}{', ...' if len(norms) > 3 else ''}"
        raise UsageError(f"--tp {tp}: {len(norms)} layer{'s' if len(norms) > 1 else ''} ({named}) hold batch norms, "
                         f"whose samples --engine {engine} does not split over a tensor group",
                         "use --tp 1 or auto for this model")
    blocks = [x.block for x in profile.layers if x.block is not None]
    if tp > 1 and any(not b.shardable for b in blocks):
        raise UsageError(f"--tp {tp}: the engines' tensor parallelism does not shard the model's transformer blocks "
                         f"({ir.UNSHARDABLE})",
                         "use --tp 1 or auto (its blocks run data and pipeline parallel)")
    bad = [b for b in blocks if not b.splits_over(tp)]
    if bad:
        raise UsageError(f"--tp {tp} does not divide the model's {bad[0].heads} attention heads and "
                         f"{bad[0].kv_heads} KV heads", "use a tensor degree that divides both, or auto")


def _whole_or_none(option: str, value: object) -> None:
    """UsageError unless ``value`` is None or a whole number (a library caller's ``tp="2"`` or ``2.0``)."""
    if value is not None and not is_whole(value):
        raise UsageError(f"{option} must be a whole number, got {value!r}", f"e.g. {option} 2")


def _check_sample_split(profile: ir.ModelProfile, engine: str, tp: int | None, micro_batch_size: int | None) -> None:
    """A fixed micro-batch a fixed tensor degree cannot split, where some layer runs only the dp form in a tensor
    group (which splits each micro-batch's samples over it): no grid can hold that layer."""
    if tp is None or tp == 1 or micro_batch_size is None or micro_batch_size % tp == 0:
        return
    limits = ENGINE_LIMITS.get(engine)
    rules, tied = limits.form_rules if limits is not None else ANY_FORMS, tied_layers(profile)
    stuck = [x.name for i, x in enumerate(profile.layers) if not rules.shards(x, i in tied)]
    if stuck:
        named = f"{', '.join(stuck[:3])}{', ...' if len(stuck) > 3 else ''}"
        many = len(stuck) > 1
        raise UsageError(f"--micro-batch-size {micro_batch_size} with --tp {tp}: {len(stuck)} "
                         f"layer{'s' if many else ''} ({named}) take{'' if many else 's'} no sharded form under "
                         f"--engine {engine}, so a tensor group splits {'their' if many else 'its'} samples, and "
                         f"{micro_batch_size} sample"
                         f"{'s do' if micro_batch_size > 1 else ' does'} not split over {tp} devices",
                         f"use a --micro-batch-size that {tp} divides ({tp}, {2 * tp}, ...), or --tp auto")


def engine_forms(engine: str) -> tuple[tuple[str, ...], FormRules]:
    """The forms a layer may take under ``engine`` and the engine's limits on which layers take which."""
    limits = ENGINE_LIMITS.get(engine)
    if limits is None:
        return ir.ALL_FORMS, ANY_FORMS
    return (ir.ALL_FORMS if limits.tensor_parallel else ("dp",)), limits.form_rules


def check_request(profile: ir.ModelProfile, cluster: ir.Cluster, *, schedule: str, optimizer: str, solver: str,
                  engine: str, config: str | Sequence[int] | None, precision: str | None, tp: int | None,
                  zero: int | str, recompute: str, micro_batch_size: int | None,
                  max_blocks: int | None = None, sequence_parallel: bool = True) -> Request:
    """Check every option (UsageError with the values and a fix) and gather them."""
    for option, value in (("--tp", tp), ("--micro-batch-size", micro_batch_size), ("max_blocks", max_blocks)):
        _whole_or_none(option, value)
    if not isinstance(sequence_parallel, bool):
        raise UsageError(f"sequence_parallel must be True or False, got {sequence_parallel!r:.40}",
                         "sequence_parallel=False keeps tensor-parallel stages' norms whole on every rank")
    if max_blocks is not None and max_blocks < 1:
        raise UsageError(f"max_blocks must be at least 1, got {max_blocks}", "leave it None (256 blocks)")
    _choice("schedule", schedule, SCHEDULES)
    _choice("solver", solver, SOLVERS)
    _choice("engine", engine, ENGINES)
    from planner.costmodel.precision import check_optimizer, check_precision

    check_optimizer(optimizer)
    if engine in ENGINE_LIMITS and optimizer not in ENGINE_LIMITS[engine].optimizers:
        builds = ENGINE_LIMITS[engine].optimizers
        raise UsageError(f"--engine {engine} trains with the optimizer {', '.join(builds)}, not {optimizer}"
                         + ("" if optimizer != "sgd" else " (the default)"),
                         f"pass --optimizer {builds[0]}, or another --engine")
    if engine in ENGINE_LIMITS and not schedule_kind(schedule).runs_on(engine):
        runs = [name for name in SCHEDULES if schedule_kind(name).runs_on(engine)]
        raise UsageError(f"--engine {engine} runs the schedules {', '.join(runs)}, not {schedule}",
                         f"use --schedule {runs[0]}, or another --engine")
    prec = check_precision(precision) if precision is not None else default_precision(profile)
    if ENGINE_LIMITS.get(engine) is not None and prec not in ENGINE_LIMITS[engine].precisions:
        raise UsageError(f"--engine {engine} trains in {', '.join(ENGINE_LIMITS[engine].precisions)}, not {prec}"
                         + ("" if precision else " (the profile's dtype)"),
                         f"pass --precision {ENGINE_LIMITS[engine].precisions[-1]}, or another --engine")
    _check_tp(tp, profile, cluster, engine)
    _check_sample_split(profile, engine, tp, micro_batch_size)
    config = config_widths(config)
    if config is not None:
        _check_config(config, profile, cluster, engine, tp)
    limits = ENGINE_LIMITS.get(engine)
    family = llama_problem(profile) if limits is not None and limits.llama_only else None
    if family is not None:
        raise UsageError(f"--engine {engine}: {family}",
                         f"{engine} trains its own Llama definition only: search with --engine torch or deepspeed "
                         "(or any)")
    _check_sequence(profile, engine, tp)
    _check_tp_without_sequence(engine, tp, sequence_parallel)
    forms, rules = engine_forms(engine)
    zeros = _zero_set(zero, engine, cluster, schedule)
    _check_zero_widths(zeros, config, tp, len(cluster.gpus))
    _check_min_batch(profile, micro_batch_size)
    space = Space(prec, tp, zeros, _recompute_set(recompute, engine, schedule), forms, micro_batch_size, rules=rules,
                  min_batch=profile.min_batch, max_tp=_max_tp(limits, profile, sequence_parallel),
                  sequence_parallel=sequence_parallel)
    return Request(schedule, optimizer, solver, engine, tuple(config) if config else None, space, max_blocks)


def _check_tp_without_sequence(engine: str, tp: int | None, sequence_parallel: bool) -> None:
    """A fixed --tp above 1 without sequence parallelism, for an engine whose Llama shards its norms over the
    sequence under tensor parallelism (torchtitan: ``EngineLimits.llama_only``, planner.runnable)."""
    limits = ENGINE_LIMITS.get(engine)
    if not sequence_parallel and limits is not None and limits.llama_only and tp is not None and tp > 1:
        raise UsageError(f"--engine {engine} --tp {tp} --no-sequence-parallel: {engine}'s Llama shards its norms "
                         "over the sequence under tensor parallelism", "drop --no-sequence-parallel, or use --tp 1")


def _max_tp(limits: EngineLimits | None, profile: ir.ModelProfile, sequence_parallel: bool) -> int | None:
    """The space's largest tensor degree: the engine's for the sequence (``EngineLimits.largest_tp``), 1 for one
    that shards its norms over the sequence under tensor parallelism when sequence parallelism is off."""
    if limits is None:
        return None
    return 1 if limits.llama_only and not sequence_parallel else limits.largest_tp(profile)


def _check_sequence(profile: ir.ModelProfile, engine: str, tp: int | None) -> None:
    """A sequence ``engine`` runs at no tensor degree (torchtitan: an odd one), or not at a fixed ``--tp``."""
    limits = ENGINE_LIMITS.get(engine)
    problem = None if limits is None else limits.sequence_problem(profile, tp or 1)
    if problem is not None:
        raise UsageError(f"--engine {engine}{f' --tp {tp}' if tp else ''}: {problem}",
                         "profile the model with another --input-shape, or search with another --engine or --tp")


def _check_min_batch(profile: ir.ModelProfile, micro_batch_size: int | None) -> None:
    """A --micro-batch-size below the fewest samples the model trains on (its profile's ``min_batch``) is refused."""
    if micro_batch_size is not None and micro_batch_size < profile.min_batch:
        raise UsageError(f"--micro-batch-size {micro_batch_size} is below the {profile.min_batch} samples the model "
                         "trains on at a time (its profile's min_batch; a batch norm over (N, C) needs 2)",
                         f"use --micro-batch-size {profile.min_batch} or more")


def _check_config(config: Sequence[int], profile: ir.ModelProfile, cluster: ir.Cluster, engine: str,
                  tp: int | None = None) -> None:
    text = "-".join(map(str, config))
    narrow = [w for w in config if tp is not None and w % tp]
    if narrow:
        raise UsageError(f"--tp {tp} does not divide the {narrow[0]} devices of a stage of --config {text}: a stage "
                         f"runs tp x dp devices", f"give every stage a multiple of {tp} devices, or --tp auto")
    n_gpu, n_layers = len(cluster.gpus), len(profile.layers)
    if sum(config) > n_gpu:
        raise UsageError(f"--config {text} needs {sum(config)} devices, the cluster {cluster.name!r} has {n_gpu}",
                         "use fewer devices per stage")
    if len(config) > n_layers:
        raise UsageError(f"--config {text} has {len(config)} stages, the model has only {n_layers} layers",
                         "use at most one stage per layer")
    limits = ENGINE_LIMITS.get(engine)
    if limits is not None and limits.uniform_stages and len(set(config)) > 1:
        raise UsageError(f"--engine {engine} runs stages of one width, --config {text} mixes widths",
                         "give every stage the same width")


def engine_widths(cluster: ir.Cluster) -> list[int]:
    """Stage widths a one-grid engine may use: up to a server, or whole servers of an even cluster."""
    sizes = {len(n.gpus) for n in cluster.nodes}
    total, g = len(cluster.gpus), min(sizes)
    return [w for w in range(1, total + 1) if w <= max(sizes) or (len(sizes) == 1 and w % g == 0)]


def problems(profile: ir.ModelProfile, cluster: ir.Cluster, m: int, req: Request) -> list[Framed]:
    """The problems one micro-batch count ``m`` solves (module doc), framed: tabulated by their
    ``build`` (planner.search.framed)."""
    common = dict(microbatches=m, schedule=req.schedule, optimizer=req.optimizer, max_blocks=req.max_blocks,
                  engine=req.engine, max_stages=schedule_kind(req.schedule).most_stages(req.engine, m))
    limits = ENGINE_LIMITS.get(req.engine)
    if limits is None or not limits.uniform_stages:
        return [frame_problem(profile, cluster, config=req.config, space=req.space, **common)]  # type: ignore[arg-type]
    out = []
    widths = sorted(set(req.config)) if req.config else engine_widths(cluster)
    for w in widths:
        devices = [g.name for g in cluster.gpus][:w]
        share = server_share(cluster, devices)  # every tensor group inside one server
        for tp in (pow2_upto(share) if limits.tensor_parallel else [1]):
            if w % tp or share % tp or (req.space.tp is not None and tp != req.space.tp):
                continue
            for zero in _uniform_zeros(req.space.zero, limits.uniform_zero, w // tp):
                space = dataclasses.replace(req.space, tp=tp, zero=zero)
                out += _uniform_problems(profile, cluster, req, limits, w, space, common)
    return out


def _uniform_problems(profile: ir.ModelProfile, cluster: ir.Cluster, req: Request, limits: EngineLimits, width: int,
                      space: Space, common: dict[str, object]) -> list[Framed]:
    """The problem of one grid; for an engine whose ZeRO runs otherwise without a pipeline
    (``EngineLimits.sync_depends_on_stages``), two: its plans of two stages or more, and of one."""
    framed = frame_problem(profile, cluster, config=req.config, mode="contiguous", widths=[width], space=space,
                           **common)  # type: ignore[arg-type]
    if not framed.has_moves:
        return []
    if not limits.sync_depends_on_stages or req.config is not None:
        return [framed]
    return [framed.with_stages(least=2), framed.with_stages(exact=1)]


def _uniform_zeros(zeros: tuple[int, ...], uniform: bool, dp: int) -> list[tuple[int, ...]]:
    """ZeRO stages to try one at a time for an engine that takes one for the whole job (torch's
    FSDP wraps each stage on its own, so it takes them all at once); none on one data-parallel rank when the
    user fixed a ZeRO stage (``--zero N``: it shards over two or more)."""
    usable = tuple(z for z in zeros if z == 0 or dp > 1)
    if not usable:
        return []
    if not uniform:
        return [usable]
    return [(z,) for z in usable]

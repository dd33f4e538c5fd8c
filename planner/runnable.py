"""Whether a plan can run: batch shapes, grids and what each engine accepts (pure).

One check, used by everything that emits a plan (search, compare and its baselines,
interleaving) and by export before it writes a program, so that a plan the tool shows
is a plan the engine it names can run (``../shared/DESIGN.md`` section 6):

- batch shape: for every stage, ``batch_size == micro_batch_size * microbatches * dp`` with a whole
  ``micro_batch_size >= 1`` (Megatron-LM's global batch = micro-batch x accumulation steps x dp), and at
  least the profile's ``min_batch`` (the fewest samples the model trains on: a batch norm over ``(N, C)``
  needs 2), also where a tensor group splits a micro-batch's samples over its ranks;
- grid: ``tp`` divides the stage's devices; ``tp`` forms only on transformer blocks whose
  attention heads and KV heads ``tp`` divides (Megatron shards whole heads); ZeRO needs a
  data-parallel group of two or more;
- stages contiguous and covering the model;
- the engine's own limits (:data:`planner.engines.ENGINES`, re-exported here).

:func:`problems` lists every reason (empty: runnable); :func:`check_runnable` raises the
first as a :class:`~planner.errors.PlanError` with the numbers and a fix.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from planner import ir
from planner.cluster import spanning_tensor_group, uneven_servers
from planner.engines import ANY_FORMS, ENGINES, EngineLimits, FormRules, tied_layers
from planner.errors import PlanError
from planner.schedule import SCHEDULE_KINDS, find_kind

__all__ = ["ANY_FORMS", "ENGINES", "EngineLimits", "FormRules", "batch_problems", "check_runnable", "cover_problems",
           "engine_problems", "engines_running", "frozen_stage_problems", "grid_problems", "is_runnable",
           "llama_problem", "optimizer_needing_weights", "problems", "refusals", "setting_problems", "tied_layers",
           "unrun_note"]


def _fix(engine: str) -> str:
    flag = "" if engine in ("", "any") else f" --engine {engine}"
    return f"search a runnable plan with `planner search{flag}`"


def batch_problems(plan: ir.Plan) -> list[str]:
    """Stages whose data-parallel ranks would get a fractional or empty micro-batch."""
    out = []
    b, m = plan.batch_size, plan.microbatches
    for i, st in enumerate(plan.stages):
        if b % (m * st.dp):  # b >= 1 and a whole quotient: at least one sample per rank
            out.append(f"stage {i}: batch {b} is not {m} micro-batches x {st.dp} data-parallel ranks of whole "
                       f"samples ({b / (m * st.dp):.4g} per rank)")
        elif b // (m * st.dp) < plan.profile.min_batch:
            out.append(f"stage {i}: a micro-batch of {b // (m * st.dp)} sample(s) per data-parallel rank (batch {b} "
                       f"over {m} micro-batches x {st.dp} ranks), and the model trains on {plan.profile.min_batch} or "
                       f"more at a time (its profile's min_batch; a batch norm over (N, C) needs 2); use fewer "
                       f"micro-batches or data-parallel ranks, or --micro-batch-size {plan.profile.min_batch}")
    return out


def grid_problems(plan: ir.Plan) -> list[str]:
    """Grids that do not divide, tensor forms on layers that cannot take them, ZeRO on one rank."""
    out = []
    for i, st in enumerate(plan.stages):
        problem = st.grid_problem()
        if problem is not None:
            out.append(f"stage {i}: {problem[0]}")
            continue
        if st.zero and st.dp == 1:
            out.append(f"stage {i}: ZeRO stage {st.zero} with a data-parallel group of 1 shards nothing")
        seq = plan.profile.uneven_sequence(st.tp) if st.sequence_parallel and st.tp > 1 else None
        if seq is not None:
            out.append(f"stage {i}: sequence parallelism cuts the sequence of {seq} tokens over tp {st.tp}, which does "
                       f"not divide it (use a sequence length that {st.tp} divides, or sequence_parallel false)")
        for j, form in enumerate(st.forms):
            out += _form_problems(plan.profile.layers[st.layers[0] + j], form, st.tp, i, st.layers[0] + j)
        out += _sample_split_problems(plan, i)
    return out


def _sample_split_problems(plan: ir.Plan, index: int) -> list[str]:
    """A dp form inside a tensor group splits the micro-batch's samples over it: tp must divide them."""
    st = plan.stages[index]
    samples = plan.micro_batch_size(st)
    if st.tp == 1 or "dp" not in st.forms:
        return []
    first = st.layers[0] + st.forms.index("dp")
    if samples % st.tp == 0:
        least = plan.profile.min_batch
        return [] if samples // st.tp >= least else [
            f"stage {index}: layer {first} runs the dp form, which splits a micro-batch's {samples:g} samples over "
            f"the tensor group of {st.tp}, {samples / st.tp:g} per rank, and the model trains on {least} or more "
            f"at a time (its profile's min_batch); use a micro-batch size of {least * st.tp} or more"]
    return [f"stage {index}: layer {first} runs the dp form, which splits a micro-batch's {samples:g} samples over "
            f"the tensor group of {st.tp}; {st.tp} does not divide them (use a micro-batch size divisible by "
            f"{st.tp}, or split/tp forms for those layers)"]


def _form_problems(layer: ir.LayerProfile, form: str, tp: int, stage: int, index: int) -> list[str]:
    if form != "tp":
        return []
    if layer.block is None:
        return [f"stage {stage}: layer {index} ({layer.name}) runs the tp form but is not a transformer block"]
    blk = layer.block
    if not blk.shardable and tp > 1:
        return [f"stage {stage}: layer {index} runs the tp form, but the engines' tensor parallelism does not shard "
                f"its block ({ir.UNSHARDABLE})"]
    if not blk.splits_over(tp):
        return [f"stage {stage}: layer {index} has {blk.heads} heads and {blk.kv_heads} KV heads, which tp {tp} "
                "does not divide"]
    return []


def cover_problems(plan: ir.Plan) -> list[str]:
    """Stages that are not contiguous or do not cover the model."""
    expect, n = 0, len(plan.profile.layers)
    for i, st in enumerate(plan.stages):
        if st.layers[0] != expect:
            return [f"stage {i} starts at layer {st.layers[0]}, expected {expect}: stages must be contiguous"]
        expect = st.layers[1]
    return [] if expect == n else [f"the stages cover layers 0..{expect} of the model's {n}"]


def engine_problems(plan: ir.Plan, engine: str) -> list[str]:
    """What ``engine`` (deepspeed, torch, torchtitan) cannot run in ``plan``; nothing for ``any``."""
    limits = ENGINES.get(engine)
    if limits is None:
        return []
    kind = find_kind(plan.schedule)
    out = _schedule_problems(plan, engine)
    refusal = (kind.engine_refusal(engine, plan.microbatches, plan.pipeline_stages, plan.virtual_stages)
               if kind is not None else None)
    if refusal is not None:
        out.append(refusal)
    out += _precision_problems(plan, engine)
    if plan.virtual_stages > 1 and not limits.virtual_stages:
        out.append(f"{engine} runs one model chunk per device, the plan has {plan.virtual_stages}")
    out += _uniform_problems(plan.stages, engine, limits.uniform_zero) if limits.uniform_stages else []
    out += _llama_problems(plan, engine) if limits.llama_only else []
    for tp in sorted({st.tp for st in plan.stages}):
        seq = limits.sequence_problem(plan.profile, tp)
        out += [] if seq is None else [seq]
    out += _split_problems(plan, engine, limits.form_rules) + _server_problems(plan, engine)
    out += frozen_stage_problems(plan, engine) if limits.frozen_stage_fp32_only else []
    if limits.uniform_recompute and len({st.recompute for st in plan.stages}) > 1:
        out.append(f"the stages recompute {', '.join(sorted({st.recompute for st in plan.stages}))}; {engine} runs "
                   "one recomputation mode for the whole job")
    for i, st in enumerate(plan.stages):
        if not limits.tensor_parallel and st.tp > 1:
            out.append(f"stage {i} is tensor parallel (tp {st.tp}, forms {', '.join(sorted(set(st.forms)))}), "
                       f"which {engine} does not run")
        if st.zero not in limits.zero:
            out.append(f"stage {i} uses ZeRO stage {st.zero}; {engine} runs {', '.join(map(str, limits.zero))}")
        if st.recompute not in limits.recompute:
            out.append(f"stage {i} recomputes {st.recompute!r}; {engine} runs {', '.join(limits.recompute)}")
    if plan.optimizer not in limits.optimizers:
        out.append(f"{engine} trains with the optimizer {', '.join(limits.optimizers)}, not {plan.optimizer} (search "
                   f"with --optimizer {limits.optimizers[0]})")
    return out + (_split_backward_problems(plan, engine, limits) if kind is not None and kind.splits_weight_grad
                  else [])


def _split_backward_problems(plan: ir.Plan, engine: str, limits: EngineLimits) -> list[str]:
    """Recomputation modes and ZeRO stages ``engine`` does not run under a schedule that splits the backward."""
    out = []
    modes, zeros = limits.recompute_modes(split_backward=True), limits.zero_stages(split_backward=True)
    for i, st in enumerate(plan.stages):
        if st.recompute in limits.recompute and st.recompute not in modes:
            out.append(f"stage {i} recomputes {st.recompute!r} under {plan.schedule}, whose split backward {engine} "
                       f"runs with {', '.join(modes)} only (use another --schedule or --recompute)")
        if st.zero in limits.zero and st.zero not in zeros:
            out.append(f"stage {i} uses ZeRO stage {st.zero} under {plan.schedule}, whose split backward {engine} runs "
                       f"with ZeRO {', '.join(map(str, zeros))} only (use another --schedule or --zero)")
    return out


def optimizer_needing_weights(plan: ir.Plan, stage: ir.Stage) -> str | None:
    """The optimizer that cannot step ``stage`` when it trains no weight under an engine whose limits say
    :attr:`EngineLimits.frozen_stage_fp32_only` ("ZeRO stage 1", "bf16", "fp16"), or None (fp32 without ZeRO,
    which steps nothing). One rule for the plan's profile (:func:`frozen_stage_problems`) and for the model's
    own layers (planner.export.deepspeed.check_trainable)."""
    if stage.zero:
        return f"ZeRO stage {stage.zero}"
    return None if plan.precision == "fp32" else plan.precision


def frozen_stage_problems(plan: ir.Plan, engine: str) -> list[str]:
    """Stages that train no weight (all frozen) where ``engine``'s optimizer cannot step them
    (:func:`optimizer_needing_weights`), and, under bf16 without ZeRO, stages whose trainable layers all share a
    weight with an earlier stage (:func:`_tie_copies_only`)."""
    out = []
    for i, st in enumerate(plan.stages):
        what = optimizer_needing_weights(plan, st)
        trainable = [j for j in range(*st.layers) if plan.profile.layers[j].trainable_params]
        if what is None:
            continue
        if not trainable:
            out.append(f"stage {i} trains no weight (all frozen), and {engine}'s {what} optimizer cannot step a "
                       "stage without any (fp32 without ZeRO can)")
        elif what == "bf16" and _tie_copies_only(plan, st, trainable):
            which = f"{'layer' if len(trainable) == 1 else 'layers'} {', '.join(map(str, trainable))}"
            out.append(f"stage {i} trains only layers that share a weight with an earlier stage ({which}); {engine} "
                       "counts such a layer's every weight on the earlier stage, and its bf16 optimizer without ZeRO "
                       "cannot step a stage left with none (use --zero 1, --precision fp32, or another --config)")
    return out


def _tie_copies_only(plan: ir.Plan, stage: ir.Stage, trainable: list[int]) -> bool:
    """Whether every one of the stage's ``trainable`` layers is in a tie group whose first layer lies on an earlier
    stage: DeepSpeed builds a tie group's layers as one module on every stage holding one, and counts all of its
    weights on the first stage only (``ds_pipe_replicated``), so its bf16 optimizer finds no gradient of the stage's
    own to take a norm of ("stack expects a non-empty TensorList"; planner.export.deepspeed_ties)."""
    def copied(j: int) -> bool:
        return any(j in tie.layers and min(tie.layers) < stage.layers[0] for tie in plan.profile.ties)

    return all(copied(j) for j in trainable)


def llama_problem(profile: ir.ModelProfile) -> str | None:
    """Why ``profile`` is not a Llama-family model (one embedding, gated-MLP transformer blocks, one norm + head,
    as torchtitan defines it), or None."""
    shapes = [(i, lp.block) for i, lp in enumerate(profile.layers) if lp.block is not None]
    n = len(profile.layers)
    split = str(profile.meta.get("split_method", "structure:llama"))  # profiles before the field: Llama's shape
    if shapes and all(b.gated for _, b in shapes) and [i for i, _ in shapes] == list(range(1, n - 1)):
        if split == "structure:llama" or not split.startswith("structure:"):
            return None
        return (f"{profile.model} is a {split.removeprefix('structure:')} model with Llama's shape, not Llama (its "
                "blocks or embedding differ from torchtitan's: q/k/v biases, q/k norms, sliding windows, fused "
                "projections, GeGLU or a scaled embedding)")
    return (f"{profile.model} is not a Llama-family model (one embedding, gated-MLP transformer blocks, one norm + "
            f"head; its layers are {', '.join(lp.type for lp in profile.layers[:4])}{'...' if n > 4 else ''})")


def _llama_problems(plan: ir.Plan, engine: str) -> list[str]:
    """What an engine that trains its own Llama (torchtitan) cannot run: another model; under tensor parallelism,
    a block not in the ``tp`` form or a stage without sequence parallelism."""
    family = llama_problem(plan.profile)
    out = [f"{family}, which {engine} trains only"] if family else []
    own = next((lp.block for lp in plan.profile.layers if lp.block is not None and lp.block.head_dim), None)
    if own is not None:
        out.append(f"its blocks have {own.heads} heads of {own.head_dim} on a width of {own.hidden}; {engine}'s Llama "
                   f"makes each head dim / n_heads = {own.hidden // own.heads} wide")
    for i, st in enumerate(plan.stages):
        blocks = [st.layers[0] + j for j, form in enumerate(st.forms)
                  if form != "tp" and plan.profile.layers[st.layers[0] + j].block is not None]
        if st.tp > 1 and blocks:
            out.append(f"stage {i} runs transformer block(s) {', '.join(map(str, blocks[:4]))} in a tensor group of "
                       f"{st.tp} without the tp form; {engine} shards every block Megatron-style")
        if st.tp > 1 and not st.sequence_parallel:
            out.append(f"stage {i} runs tp {st.tp} without sequence parallelism; {engine}'s Llama shards its norms "
                       "over the sequence under tensor parallelism")
    return out + _pinned_problems(plan, engine)


def _pinned_problems(plan: ir.Plan, engine: str) -> list[str]:
    """Layers in a tensor group in another form than the one ``engine`` runs them in (``FormRules.pinned``: its
    embedding and head shard their vocabulary)."""
    out = []
    pinned = ENGINES[engine].form_rules.pinned(plan.profile)
    for i, st in enumerate(plan.stages):
        for layer, form in pinned.items():
            if st.tp > 1 and st.layers[0] <= layer < st.layers[1] and st.forms[layer - st.layers[0]] != form:
                out.append(f"stage {i} runs layer {layer} ({plan.profile.layers[layer].name}) as "
                           f"{st.forms[layer - st.layers[0]]} in a tensor group of {st.tp}; {engine} runs it {form} "
                           "(its vocabulary sharded)")
    return out


def _split_problems(plan: ir.Plan, engine: str, rules: FormRules) -> list[str]:
    """Forms the engine cannot run: split forms beyond its :class:`FormRules`, a batch norm's samples split."""
    tied = tied_layers(plan.profile)
    for i, st in enumerate(plan.stages):
        for j, form in enumerate(st.forms):
            index = st.layers[0] + j
            layer = plan.profile.layers[index]
            if form == "dp" and st.tp > 1 and not rules.splits_samples(layer):
                return [f"stage {i}: layer {index} ({layer.name}) runs the dp form in a tensor group of {st.tp}, which "
                        f"splits its samples, and its batch norm takes statistics over them; use tp 1 there"]
            uneven = rules.uneven_split(layer, form, st.tp, engine) if form.startswith("split") else None
            if uneven is not None:
                return [f"stage {i}: layer {index} ({layer.name}) {uneven}"]
            if not form.startswith("split") or rules.splits(layer, index in tied):
                continue
            if rules.splits(layer):
                return [f"stage {i}: layer {index} ({layer.name}) runs the {form} form but shares a parameter with "
                        f"another layer (a tie); {engine} splits no tied layer"]
            return [f"stage {i}: layer {index} ({layer.name}, of type {layer.type}) runs the {form} form; "
                    f"{engine} splits the weight of {', '.join(rules.split_types or ())} layers only"]
    return []


def _server_problems(plan: ir.Plan, engine: str) -> list[str]:
    """Tensor groups across servers (every engine here keeps a tensor group on one server's link); servers running
    different numbers of the plan's processes (every engine here starts under torchrun, ``planner run`` or the
    exported launch scripts, which starts as many on each)."""
    out = []
    for i, st in enumerate(plan.stages):
        spanning = spanning_tensor_group(plan.cluster, st)
        if spanning is not None:
            out.append(f"stage {i}: tensor group {list(spanning[0])} (tp {st.tp}) spans servers "
                       f"{', '.join(spanning[1])}; give tp a value that divides the stage's GPUs in every server")
    shown = uneven_servers(plan)
    if shown is not None:
        out.append(f"the plan runs different numbers of processes per server ({shown}); {engine}'s launcher starts "
                   "the same number on every server")
    return out


def _uniform_problems(stages: Sequence[ir.Stage], engine: str, uniform_zero: bool) -> list[str]:
    first = stages[0]
    for i, st in enumerate(stages):
        if (st.tp, st.dp) != (first.tp, first.dp) or (uniform_zero and st.zero != first.zero):
            return [f"stage {i} is a tp {st.tp} x dp {st.dp} grid with ZeRO {st.zero}, stage 0 tp {first.tp} x "
                    f"dp {first.dp} with ZeRO {first.zero}: {engine} runs one grid for every stage"]
    return []


def problems(plan: ir.Plan, engine: str | None = None) -> list[str]:
    """Every reason ``plan`` cannot run (on ``engine``, default the plan's own); empty when it can. Stages that do not
    cover the model are the only reasons given for such a plan (the other checks read each stage's layers)."""
    engine = plan.engine if engine is None else engine
    cover = cover_problems(plan)
    if cover:
        return cover
    return batch_problems(plan) + grid_problems(plan) + engine_problems(plan, engine)


def check_runnable(plan: ir.Plan, engine: str | None = None) -> None:
    """Raise :class:`PlanError` with the first reason ``plan`` cannot run (see :func:`problems`)."""
    found = problems(plan, engine)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        hint = _fix(plan.engine if engine is None else engine)
        if engine not in (None, plan.engine) and plan.engine != "any" and not problems(plan):
            hint = (f"the plan was searched for {plan.engine}, which runs it (`planner export --to {plan.engine}`); "
                    f"for {engine}, {hint}")
        raise PlanError(found[0] + more, hint)


def is_runnable(plan: ir.Plan, engine: str | None = None) -> bool:
    """Whether :func:`problems` finds nothing."""
    return not problems(plan, engine)


def engines_running(plan: ir.Plan) -> list[str]:
    """The engines of :data:`ENGINES` that run ``plan``."""
    return [name for name in ENGINES if is_runnable(plan, name)]


def _schedule_problems(plan: ir.Plan, engine: str) -> list[str]:
    kind = find_kind(plan.schedule)
    if kind is not None and kind.runs_on(engine):
        return []
    names = [k.name for k in SCHEDULE_KINDS.values() if k.runs_on(engine)]
    return [f"{engine} runs the schedules {', '.join(names)}, not {plan.schedule!r}"]


def _precision_problems(plan: ir.Plan, engine: str) -> list[str]:
    precisions = ENGINES[engine].precisions
    return [] if plan.precision in precisions else [f"{engine} trains in {', '.join(precisions)}, not {plan.precision}"]


def setting_problems(plan: ir.Plan, engine: str) -> list[str]:
    """What ``engine`` refuses in the settings a search for it takes as given (its schedule, precision, optimizer and
    model: ``planner search --engine`` refuses them before it searches), where no plan it searches could run."""
    limits = ENGINES[engine]
    family = llama_problem(plan.profile) if limits.llama_only else None
    out = [f"{family}, which {engine} trains only"] if family else []
    out += _schedule_problems(plan, engine) + _precision_problems(plan, engine)
    if plan.optimizer not in limits.optimizers:
        out.append(f"{engine} trains with the optimizer {', '.join(limits.optimizers)}, not {plan.optimizer}")
    return out


def refusals(plan: ir.Plan) -> str:
    """What each engine refuses first in ``plan`` (its settings before its layout), engines refusing alike said once
    ("deepspeed, torch: stage 1 is ... each engine runs one grid ..."); empty where every engine runs it."""
    firsts: dict[str, list[str]] = {}  # each engine's first reason, its name as "each engine": alike ones once
    for name in ENGINES:
        found = setting_problems(plan, name) or problems(plan, name)
        if found:
            firsts.setdefault(re.sub(rf"\b{name}\b", "each engine", found[0]), []).append(name)
    return "; ".join(f"{', '.join(names)}: {why if len(names) > 1 else why.replace('each engine', names[0])}"
                     for why, names in firsts.items())


def unrun_note(plan: ir.Plan) -> tuple[str, str] | None:
    """For a plan searched for no engine (``any``, the whole search space: stages of different widths, any schedule)
    that no engine here runs: (what each engine refuses first, how to get one that runs); None where one runs it, the
    plan names its engine, or it cannot run at all (:func:`check_runnable` says why). An engine that refuses the
    search's settings (:func:`setting_problems`) is said to, and the hint names only the engines that take them."""
    if plan.engine != "any" or problems(plan) or engines_running(plan):
        return None
    searchable = [name for name in ENGINES if not setting_problems(plan, name)]
    if not searchable:
        fix = ("no engine here takes its schedule, precision, optimizer and model together; search with another "
               "--schedule, --precision or --optimizer and --engine")
    else:
        fix = f"`planner search --engine {'|'.join(searchable)}` finds the fastest plan that engine runs"
    return f"no engine runs this plan ({refusals(plan)})", f"it is the fastest plan searched for no engine; {fix}"

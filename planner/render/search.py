"""Terminal output of ``planner search`` and ``planner clusters`` (rich, on stderr)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.table import Table

from planner import ir
from planner.explain import Explanation
from planner.render import GIB, stderr_console
from planner.render.explain import print_explanation
from planner.render.text import count, device_noun, safe_text
from planner.render.text import ms as _ms


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def _forms(forms: Sequence[str]) -> str:
    """Run-length summary of per-layer forms: ``dp x12, split_out x2``."""
    out: list[str] = []
    for f in forms:
        if out and out[-1].startswith(f + " x"):
            name, count = out[-1].rsplit(" x", 1)
            out[-1] = f"{name} x{int(count) + 1}"
        else:
            out.append(f"{f} x1")
    return ", ".join(x[:-3] if x.endswith(" x1") else x for x in out)


def _devices(devices: Sequence[str]) -> str:
    shown = [safe_text(d) for d in devices]
    return ", ".join(shown) if len(shown) <= 3 else f"{shown[0]} .. {shown[-1]} ({len(shown)})"


def plan_table(plan: ir.Plan, bottleneck: int) -> Table:
    """One row per stage: layers, devices, forms, costs per micro-batch, memory against capacity."""
    from planner.costmodel import stage_costs

    costs = stage_costs(plan)
    table = Table(title=f"plan for {safe_text(plan.model)} on {safe_text(plan.cluster.name)}: config {plan.config}",
                  title_justify="left")
    for col in ("stage", "layers", "devices", "tp x dp", "forms", "fwd+bwd / mb", "recv / mb", "all-reduce",
                "memory / device", "capacity"):
        table.add_column(col, justify="right" if col not in ("layers", "devices", "forms") else "left",
                         overflow="fold")
    layers = plan.profile.layers
    for s, (stage, cost) in enumerate(zip(plan.stages, costs, strict=True)):
        first, end = stage.layers
        span = f"{first}-{end - 1}" if end - first > 1 else f"{first}"
        names = safe_text(f"{layers[first].name}..{layers[end - 1].name}" if end - first > 1 else layers[first].name)
        recv = 2 * costs[s - 1].send_s if s > 0 else 0.0
        mark = " *" if s % plan.pipeline_stages == bottleneck and plan.pipeline_stages > 1 else ""
        forms = _forms(stage.forms) + (f" +recompute {stage.recompute}" if stage.recomputes else "") + (
            f" +zero {stage.zero}" if stage.zero else "") + (" +sequence parallel" if stage.sequence_parallel else "")
        table.add_row(f"{s}{mark}", safe_text(f"{span} ({names})"), safe_text(_devices(stage.devices)),
                      f"{stage.tp} x {stage.dp}", forms,
                      _ms(cost.forward_s + cost.backward_s), _ms(recv), _ms(cost.allreduce_s),
                      _gib(stage.memory_bytes), _gib(cost.capacity_bytes))
    table.caption = _shared_cores_caption(plan)
    table.caption_justify = "left"
    return table


def _shared_cores_caption(plan: ir.Plan) -> str | None:
    """What ``fwd+bwd / mb`` means on nodes whose devices share processors (CPU processes), else None."""
    shared = [n for n in plan.cluster.nodes if n.core_share < 1.0]
    if not shared:
        return None
    node = min(shared, key=lambda n: n.core_share)
    return (f"fwd+bwd / mb: with all {len(node.gpus)} processes of {safe_text(node.name)} computing at once; "
            f"one computing alone runs up to {1 / node.core_share:.2f}x faster (the simulation plays that)")


def print_plan(plan: ir.Plan, explanation: Explanation, *, elapsed_s: float | None = None, output: str | None = None,
               long: bool = False) -> None:
    """The plan's stages (bottleneck marked), a summary and its explanation, on stderr."""
    console = stderr_console()
    console.print(plan_table(plan, explanation.bottleneck))
    p = plan.predicted
    mbs = plan.batch_size // plan.microbatches
    per = ("GPUs per stage" if plan.virtual_stages == 1
           else f"GPUs per device group, each running {plan.virtual_stages} chunks")
    console.print(f"config [bold]{plan.config}[/] (PipeDream notation: {per}), "
                  f"{count(plan.microbatches, 'micro-batch')} of {mbs}, schedule {plan.schedule}, "
                  f"optimizer {plan.optimizer}, precision {plan.precision}", soft_wrap=True)
    console.print(f"predicted iteration {_ms(p.iteration_s)}, {p.samples_per_s:.1f} samples/s, bubble "
                  f"{p.bubble_fraction:.1%}, peak memory {_gib(p.peak_memory_bytes)} per device"
                  + ("  (* bottleneck stage)" if plan.pipeline_stages > 1 else ""), soft_wrap=True)
    console.print(dp_line(plan), soft_wrap=True)
    print_explanation(explanation, console, long=long)
    tail = []
    if elapsed_s is not None:
        tail.append(f"searched in {elapsed_s:.2f} s ({plan.solver})")
    if output:
        tail.append(f"plan written to {safe_text(output)}")
    if tail:
        console.print("; ".join(tail), soft_wrap=True)


def dp_baseline(plan: ir.Plan) -> str:
    """The yardstick of ``speedup_over_dp`` (planner.costmodel.dp_plan) named exactly: plain data parallel,
    ZeRO-0, no recomputation, each device's whole local batch in one micro-batch; on one device, no data
    parallelism at all."""
    n, noun = len(plan.cluster.gpus), device_noun(g.name for g in plan.cluster.gpus)
    if n == 1:
        return f"the whole batch of {plan.batch_size} in one micro-batch on the one {noun} (no recomputation)"
    return (f"plain data parallel on all {count(n, noun)} (ZeRO-0, no recomputation, each {noun}'s "
            f"{count(plan.batch_size // n, 'sample')} in one micro-batch)")


def _data_parallel(plan: ir.Plan) -> bool:
    """Whether the plan itself is data parallel on every device: one stage, tensor degree 1, ``dp`` forms."""
    first = plan.stages[0]
    return (len(plan.stages) == 1 and first.tp == 1 and len(first.devices) == len(plan.cluster.gpus)
            and set(first.forms) == {"dp"})


def _fits_with(plan: ir.Plan) -> str:
    """What a data-parallel plan does that the baseline does not: ZeRO, recomputation, more micro-batches."""
    stage, noun = plan.stages[0], device_noun(g.name for g in plan.cluster.gpus)
    done = [f"ZeRO-{stage.zero}"] if stage.zero else []
    done += [f"{stage.recompute} recomputation"] if stage.recomputes else []
    if plan.microbatches > 1:
        size = plan.batch_size // (plan.microbatches * stage.dp)
        done.append(f"{count(plan.microbatches, 'micro-batch')} of {count(size, 'sample')} per {noun}")
    return (", ".join(done[:-1]) + " and " if len(done) > 1 else "") + done[-1] if done else "the same settings"


def dp_line(plan: ir.Plan) -> str:
    """The plan against :func:`dp_baseline`: its time and the speedup, or why it has none; where the plan is
    itself data parallel (or on one device) and the baseline does not fit, what lets the plan fit."""
    n, noun = len(plan.cluster.gpus), device_noun(g.name for g in plan.cluster.gpus)
    base = dp_baseline(plan)
    if plan.batch_size % n:
        return (f"plain data parallel on all {count(n, noun)} does not run: the batch of {plan.batch_size} does "
                f"not split into whole samples per {noun}")
    if plan.dp_iteration_s is not None and plan.speedup_over_dp is not None:
        return f"{base}: {_ms(plan.dp_iteration_s)} -> speedup [bold]{plan.speedup_over_dp:.2f}x[/]"
    line = f"{base} does not fit in memory"
    if n == 1 or _data_parallel(plan):
        line += f"; this plan{' is data parallel too and' if n > 1 else ''} fits with {_fits_with(plan)}"
    return line


def _peaks_text(gpu: ir.GPU) -> str:
    """``19.5 fp32, 312 bf16``: the fp32 peak and the 16-bit one a transformer trains in, where the GPU has one."""
    peaks = dict(gpu.peak_flops)
    half = next((f for f in ("bf16", "fp16") if f in peaks), None)
    return f"{gpu.flops / 1e12:g} fp32" + (f", {peaks[half] / 1e12:g} {half}" if half else "")


def print_clusters(clusters: Sequence[ir.Cluster], descriptions: Mapping[str, str]) -> None:
    """A table of cluster presets on stderr."""
    console = stderr_console()
    table = Table(title="cluster presets (use with --cluster NAME)", title_justify="left")
    for col in ("name", "servers x GPUs", "peak TFLOP/s per GPU", "memory per GPU", "intra-node", "inter-node"):
        table.add_column(col, no_wrap=col == "name", overflow="fold")
    for c in clusters:
        sizes = sorted({len(n.gpus) for n in c.nodes})
        shape = f"{len(c.nodes)} x {sizes[0]}" if len(sizes) == 1 else f"{len(c.nodes)} x {sizes}"
        flops = sorted({_peaks_text(g) for g in c.gpus})
        mems = sorted({g.memory_bytes for g in c.gpus})
        intra, inter = c.link("intra_node"), c.link("inter_node")
        table.add_row(safe_text(c.name), shape, "; ".join(flops), ", ".join(_gib(m) for m in mems),
                      f"{intra.bandwidth_Bps * 8 / 1e9:g} Gbit/s", f"{inter.bandwidth_Bps * 8 / 1e9:g} Gbit/s")
    console.print(table)
    for c in clusters:
        if descriptions.get(c.name):
            console.print(f"[bold]{safe_text(c.name)}[/]: {safe_text(descriptions[c.name])}", soft_wrap=True)

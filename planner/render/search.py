"""Terminal output of ``planner search`` and ``planner clusters`` (rich, on stderr)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.table import Table

from planner import ir
from planner.render import GIB, stderr_console
from planner.render.text import safe_text


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def _ms(s: float) -> str:
    return f"{s * 1e3:.2f} ms"


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


def print_plan(plan: ir.Plan, *, elapsed_s: float | None = None, output: str | None = None) -> None:
    """A table of the plan's stages (bottleneck marked) and a summary, on stderr."""
    from planner.costmodel import stage_costs, stage_terms

    console = stderr_console()
    costs = stage_costs(plan)
    terms = stage_terms(costs, plan.schedule, plan.microbatches)
    bottleneck = max(range(len(terms)), key=lambda i: terms[i])
    table = Table(title=f"plan for {safe_text(plan.model)} on {safe_text(plan.cluster.name)}: config {plan.config}",
                  title_justify="left")
    for col in ("stage", "layers", "devices", "forms", "fwd+bwd / mb", "recv / mb", "all-reduce", "memory / device",
                "capacity"):
        table.add_column(col, justify="right" if col not in ("devices", "forms") else "left")
    layers = plan.profile.layers
    for s, (stage, cost) in enumerate(zip(plan.stages, costs, strict=True)):
        first, end = stage.layers
        span = f"{first}-{end - 1}" if end - first > 1 else f"{first}"
        names = safe_text(f"{layers[first].name}..{layers[end - 1].name}" if end - first > 1 else layers[first].name)
        recv = 2 * costs[s - 1].send_s if s > 0 else 0.0
        mark = " *" if s == bottleneck and len(plan.stages) > 1 else ""
        forms = _forms(stage.forms) + (f" +recompute {stage.recompute}" if stage.recomputes else "")
        table.add_row(f"{s}{mark}", f"{span} ({names})", _devices(stage.devices), forms,
                      _ms(cost.forward_s + cost.backward_s), _ms(recv), _ms(cost.allreduce_s),
                      _gib(stage.memory_bytes), _gib(cost.capacity_bytes))
    console.print(table)
    p = plan.predicted
    console.print(f"config [bold]{plan.config}[/] (PipeDream notation), {plan.microbatches} micro-batches of "
                  f"{plan.batch_size // plan.microbatches}, schedule {plan.schedule}, optimizer {plan.optimizer}")
    console.print(f"predicted iteration {_ms(p.iteration_s)}, {p.samples_per_s:.1f} samples/s, bubble "
                  f"{p.bubble_fraction:.1%}, peak memory {_gib(p.peak_memory_bytes)} per device"
                  + ("  (* bottleneck stage)" if len(plan.stages) > 1 else ""))
    if plan.dp_iteration_s is not None and plan.speedup_over_dp is not None:
        console.print(f"pure data parallel on all {len(plan.cluster.gpus)} GPUs: {_ms(plan.dp_iteration_s)} -> "
                      f"speedup [bold]{plan.speedup_over_dp:.2f}x[/]")
    else:
        console.print(f"pure data parallel on all {len(plan.cluster.gpus)} GPUs does not fit in memory")
    tail = []
    if elapsed_s is not None:
        tail.append(f"searched in {elapsed_s:.2f} s ({plan.solver})")
    if output:
        tail.append(f"plan written to {safe_text(output)}")
    if tail:
        console.print("; ".join(tail))


def print_clusters(clusters: Sequence[ir.Cluster], descriptions: Mapping[str, str]) -> None:
    """A table of cluster presets on stderr."""
    console = stderr_console()
    table = Table(title="cluster presets (use with --cluster NAME)", title_justify="left")
    for col in ("name", "servers x GPUs", "TFLOP/s per GPU", "memory per GPU", "intra-node", "inter-node"):
        table.add_column(col)
    for c in clusters:
        sizes = sorted({len(n.gpus) for n in c.nodes})
        shape = f"{len(c.nodes)} x {sizes[0]}" if len(sizes) == 1 else f"{len(c.nodes)} x {sizes}"
        flops = sorted({g.flops / 1e12 for g in c.gpus})
        mems = sorted({g.memory_bytes for g in c.gpus})
        intra, inter = c.link("intra_node"), c.link("inter_node")
        table.add_row(safe_text(c.name), shape, ", ".join(f"{f:g}" for f in flops), ", ".join(_gib(m) for m in mems),
                      f"{intra.bandwidth_Bps * 8 / 1e9:g} Gbit/s", f"{inter.bandwidth_Bps * 8 / 1e9:g} Gbit/s")
    console.print(table)
    for c in clusters:
        if descriptions.get(c.name):
            console.print(f"[bold]{safe_text(c.name)}[/]: {safe_text(descriptions[c.name])}")

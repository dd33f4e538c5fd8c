"""Terminal output of a plan's explanation (planner.explain): a few lines, or tables with ``--explain``."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from planner.explain import Alternative, Explanation, StageExplanation
from planner.render import GIB
from planner.render.text import count, device_noun, ms, safe_text


def _share(part_s: float, whole_s: float) -> str:
    return f"{part_s / whole_s:.0%}" if whole_s > 0 else "-"


def _devices(devices: Sequence[str]) -> str:
    return ", ".join(devices) if len(devices) <= 4 else f"{devices[0]} .. {devices[-1]}"


def bound_line(e: Explanation) -> str:
    """What bounds the iteration: the bottleneck stage and its largest term, with the others beside it."""
    s = e.stages[e.bottleneck]
    terms = s.terms()
    rest = ", ".join(f"{name} {ms(v)}" for name, v in terms.items() if v > 0 and name != e.bound)
    where = f"stage {s.stage} ({safe_text(_devices(s.devices))})" if len(e.stages) > 1 else "its one stage"
    note = "; transfers overlap compute" if "transfers" in rest or e.bound == "transfers" else ""
    bound = "bubble (idle: pipeline fill and drain, waiting for transfers)" if e.bound == "bubble" else e.bound
    return (f"bound by {where}: {bound} {ms(terms[e.bound])} = {_share(terms[e.bound], e.iteration_s)} "
            f"of the {ms(e.iteration_s)} iteration" + (f" (then {rest}{note})" if rest else ""))


def _alt(a: Alternative, detail: bool = False) -> str:
    """``4-2 (M=16) 503.41 ms (+1.1%, stage 0: transfers)``; with ``detail`` its stage's top three terms."""
    terms = ", ".join(f"{name} {ms(t)}" for name, t in a.terms[:3]) if detail and a.terms else a.bound
    return (f"{a.config} (M={a.microbatches}) {ms(a.iteration_s)} ({a.slower_fraction:+.1%}, "
            f"stage {a.bottleneck_stage}: {terms})")


def idle_line(e: Explanation) -> str | None:
    """Which GPUs the plan leaves idle and what the best plan that uses them costs (None: none idle)."""
    if not e.idle_devices:
        return None
    noun = device_noun([*e.idle_devices, *(d for s in e.stages for d in s.devices)])
    head = f"idle: {len(e.idle_devices)} of {count(e.gpus, noun)} ({safe_text(_devices(e.idle_devices))})"
    if e.all_gpus is not None:
        why = f"the best judged plan on all {e.gpus} is {_alt(e.all_gpus, detail=True)}"
    elif e.judged:
        why = (f"no plan on all {e.gpus} was simulated (none among the candidates fits, or its busiest GPU's own "
               f"work already exceeds this plan's time)")
    else:
        why = "planner search shows what using them costs"
    dp = (f"; plain data parallel on all {e.gpus} (ZeRO-0, no recomputation, one micro-batch): "
          f"{ms(e.dp_iteration_s)}" if e.dp_iteration_s else "")
    return f"{head}: {why}{dp}"


def headroom_line(e: Explanation) -> str:
    """Memory left per stage (capacity minus the simulated peak, the tightest device of each)."""
    parts = [f"stage {s.stage} {s.headroom_bytes / GIB:.2f} of {s.capacity_bytes / GIB:.2f} GiB"
             for s in e.stages[:8] if s.capacity_bytes > 0]
    more = f", ... ({len(e.stages) - 8} more)" if len(e.stages) > 8 else ""
    return "memory headroom: " + (", ".join(parts) + more if parts else "capacity unknown")


def short_lines(e: Explanation) -> list[str]:
    """The explanation in a few lines (the end of planner search and simulate)."""
    lines = [bound_line(e)]
    idle = idle_line(e)
    if idle:
        lines.append(idle)
    if e.runner_ups:
        lines.append("runner-ups: " + "; ".join(_alt(a) for a in e.runner_ups))
    lines.append(headroom_line(e))
    return lines


def stage_table(e: Explanation) -> Table:
    """Per stage: where its iteration goes and its memory headroom (the bottleneck marked)."""
    table = Table(title=f"where the {ms(e.iteration_s)} iteration goes, per stage", title_justify="left")
    engine = e.engine_charged
    for col in ("stage", "devices", "compute", "transfers", "all-reduce", "optimizer", *(("engine",) if engine else ()),
                "idle", "peak GiB", "capacity GiB", "headroom GiB"):
        table.add_column(col, justify="left" if col == "devices" else "right", overflow="fold")
    for s in e.stages:
        mark = " *" if s.stage == e.bottleneck and len(e.stages) > 1 else ""
        table.add_row(f"{s.stage}{mark}", safe_text(_devices(s.devices)), *_stage_times(s, e.iteration_s, engine),
                      *(f"{b / GIB:.2f}" for b in (s.peak_memory_bytes, s.capacity_bytes, s.headroom_bytes)),
                      style="bold" if mark else "")
    return table


def _stage_times(s: StageExplanation, iteration_s: float, engine: bool) -> list[str]:
    """Compute, transfers, all-reduce, optimizer, the engine's overheads (when shown) and idle, each
    in ms and as a share of the iteration."""
    values = (s.compute_s, s.transfer_s, s.allreduce_s, s.optimizer_s, *((s.engine_s,) if engine else ()), s.idle_s)
    return [f"{ms(v)} ({_share(v, iteration_s)})" for v in values]


def alternatives_table(e: Explanation) -> Table:
    """The runner-ups and the best plan on all GPUs, with what bounds each."""
    table = Table(title="other plans the search judged", title_justify="left")
    for col in ("config", "M", "GPUs", "iteration", "vs this plan", "bound by"):
        table.add_column(col, justify="left" if col in ("config", "bound by") else "right", overflow="fold")
    rows = list(e.runner_ups) + ([e.all_gpus] if e.all_gpus and e.all_gpus not in e.runner_ups else [])
    for a in rows:
        table.add_row(a.config, str(a.microbatches), str(a.world_size), ms(a.iteration_s), f"{a.slower_fraction:+.1%}",
                      f"stage {a.bottleneck_stage}: " + ", ".join(f"{name} {ms(t)}" for name, t in a.terms[:3]))
    return table


def print_explanation(e: Explanation, console: Console, long: bool = False) -> None:
    """The short form, or with ``long`` the per-stage and alternatives tables before it."""
    if long:
        console.print(stage_table(e))
        if e.runner_ups or e.all_gpus:
            console.print(alternatives_table(e))
    console.print("[bold]why this plan[/]" + ("" if long else " (--explain for the tables)"))
    for line in short_lines(e):
        console.print("  " + line, soft_wrap=True)

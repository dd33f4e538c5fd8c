"""Output of ``planner compare``: a rich table on stderr and a bar chart PNG (matplotlib Agg)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from rich.table import Table

from planner.compare import Comparison, StrategyResult
from planner.render import GIB, stderr_console, write_png
from planner.render.text import plot_text, safe_text
from planner.runnable import refusals


def _fmt(value: float | None, fmt: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{fmt}}{suffix}"


def comparison_table(comparison: Comparison) -> Table:
    """One row per strategy at its best setting (named): time, throughput, speedup over dp, memory per
    GPU, fits, config."""
    model, cluster = safe_text(comparison.model), safe_text(comparison.cluster)
    table = Table(title=f"{model} (batch {comparison.batch_size}) on {cluster}, "
                        f"optimizer {comparison.optimizer}", title_justify="left")
    for col, justify in (("strategy", "left"), ("setting", "left"), ("config", "left"), ("schedule", "left"),
                         ("M", "right"),
                         ("iter ms", "right"), ("samples/s", "right"), ("vs dp", "right"),
                         ("GiB/GPU", "right"), ("fits", "left")):
        table.add_column(col, justify=justify, no_wrap=col in ("strategy", "fits"), overflow="fold")  # type: ignore[arg-type]
    fastest = min((s.iteration_s for s in comparison.strategies if s.fits and s.iteration_s), default=None)
    for s in comparison.strategies:
        style = "bold green" if s.fits and s.iteration_s == fastest else ("dim" if not s.fits else "")
        table.add_row(
            safe_text(s.name), safe_text(f"{s.setting or '-'} ({s.flags})" if s.flags else s.setting or "-"),
            safe_text(s.config or "-"), s.schedule or "-",
            _fmt(s.microbatches, "d"),
            _fmt(None if s.iteration_s is None else s.iteration_s * 1000, ".1f"),
            _fmt(s.samples_per_s, ".1f"), _fmt(s.speedup_over_dp, ".2f", "x"),
            _fmt(None if s.peak_memory_bytes is None else s.peak_memory_bytes / GIB, ".2f"),
            "yes" if s.fits else "no", style=style,
        )
    return table


def print_comparison(comparison: Comparison) -> None:
    """The table on stderr, then one line per strategy that does not fit, with its reason, and one per strategy whose
    plan no engine here runs (PipePar's stages of different widths, say), with what each engine refuses."""
    console = stderr_console()
    console.print(comparison_table(comparison))
    for s in comparison.strategies:
        if not s.fits:
            console.print(f"[dim]{safe_text(s.name)} does not fit:[/dim] {safe_text(s.reason)}", soft_wrap=True)
        elif s.plan is not None and not s.engines:
            console.print(f"[dim]no engine runs {safe_text(s.name)}'s plan:[/dim] {safe_text(refusals(s.plan))}",
                          soft_wrap=True)


COLORS = {"dp": "#7f7f7f", "accpar": "#8c564b", "gpipe-uniform": "#1f77b4", "torchgpipe": "#17becf",
          "deepspeed": "#9467bd", "pipedream": "#ff7f0e", "megatron": "#bcbd22",
          "planner": "#d62728"}


def _capacity_gib(s: StrategyResult) -> float | None:
    """The memory of the smallest GPU the strategy's plan uses (its peak must stay under it)."""
    if s.plan is None:
        return None
    used = {d for st in s.plan.stages for d in st.devices}
    caps = [g.memory_bytes for g in s.plan.cluster.gpus if g.name in used]
    return min(caps) / GIB if caps else None


def _panel(ax: Any, rows: Sequence[StrategyResult], values: Sequence[float | None], title: str, fmt: str,
           notes: Sequence[str] = (), text_at: Sequence[float] = ()) -> None:
    """One horizontal bar per strategy with its value written beside it (or at ``text_at``, past a mark);
    a strategy that does not fit gets a faded, hatched bar (where it has a value) and 'does not fit'."""
    ys = list(range(len(rows)))
    colours = [COLORS.get(s.name, "#333333") for s in rows]
    for y, v, s, colour in zip(ys, values, rows, colours, strict=True):
        ax.barh(y, v or 0.0, color=colour, height=0.7, alpha=1.0 if s.fits else 0.35,
                hatch=None if s.fits else "//", edgecolor="white" if s.fits else colour)
    top = max((v for v in values if v), default=1.0)
    notes = [*notes, *[""] * len(rows)]
    places = [*text_at, *[0.0] * len(rows)]
    for y, v, s, note, at in zip(ys, values, rows, notes, places, strict=False):
        text = "-" if v is None else format(v, fmt) + note
        if not s.fits:
            text = "does not fit" if v is None else f"{text}  does not fit"
        ax.text(max(v or 0.0, at) + top * 0.02, y, text, va="center", fontsize=8,
                color="black" if s.fits else "0.35")
    ax.set_title(title, fontsize=9, loc="left")
    ax.set_xlim(0, top * 1.7)
    ax.grid(axis="x", alpha=0.3)


def _throughput_panel(ax: Any, rows: Sequence[StrategyResult]) -> None:
    """Speedup over dp with each strategy's config, or samples/s when dp does not fit (no yardstick)."""
    configs = [plot_text(f"   ({s.config}, M={s.microbatches})") if s.fits and s.config else "" for s in rows]
    if any(s.speedup_over_dp for s in rows):
        _panel(ax, rows, [s.speedup_over_dp for s in rows], "speedup over dp (config, micro-batches)", ".2f",
               ["x" + c for c in configs])
        ax.axvline(1.0, color="black", linewidth=0.6, linestyle=":")
    else:
        _panel(ax, rows, [s.samples_per_s for s in rows], "samples/s (dp does not fit) (config, micro-batches)",
               ".1f", configs)


def plot_comparison(comparison: Comparison, path: str | os.PathLike[str]) -> None:
    """The chart of :func:`comparison_figure` as PNG (atomically)."""
    write_png(path, comparison_figure(comparison), dpi=120, bbox_inches="tight")


def comparison_figure(comparison: Comparison) -> Any:
    """Three panels, one row per strategy: speedup over dp (with its config), iteration time, and peak
    memory per GPU with each strategy's GPU capacity marked (red '|'); a strategy that does not fit
    is marked 'does not fit'. The caller closes the figure."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["text.parse_math"] = False  # names from files are text, not mathtext
    import matplotlib.pyplot as plt

    rows = list(comparison.strategies)
    fig, axes = plt.subplots(1, 3, figsize=(14.0, 1.3 + 0.42 * len(rows)), sharey=True)
    _throughput_panel(axes[0], rows)
    _panel(axes[1], rows, [None if s.iteration_s is None else s.iteration_s * 1e3 for s in rows],
           "iteration time (ms)", ".1f")
    mem = [None if s.peak_memory_bytes is None else s.peak_memory_bytes / GIB for s in rows]
    caps = [_capacity_gib(s) for s in rows]
    _panel(axes[2], rows, mem, "peak memory per GPU (GiB); red |: GPU capacity", ".2f",
           text_at=[c or 0.0 for c in caps])
    for y, cap in enumerate(caps):
        if cap is not None:
            axes[2].plot([cap, cap], [y - 0.42, y + 0.42], color="red", linewidth=1.6)
    axes[2].set_xlim(0, max([*(m or 0.0 for m in mem), *(c or 0.0 for c in caps), 1e-9]) * 1.6)
    axes[0].set_yticks(list(range(len(rows))), [s.name for s in rows])
    axes[0].invert_yaxis()
    fig.suptitle(plot_text(f"{comparison.model}, batch {comparison.batch_size}, on {comparison.cluster}, "
                           f"optimizer {comparison.optimizer}"), fontsize=11, x=0.01, ha="left")
    fig.tight_layout()
    return fig


def _speedup_bars(ax: Any, comparisons: Sequence[Comparison], name: str, k: int, width: float) -> float:
    """Strategy ``name``'s bars (the k-th of each model's group) with their values, an 'x' where it
    does not fit; returns its highest speedup (0 when none)."""
    xs, ys, misses = [], [], []
    for i, c in enumerate(comparisons):
        x = i - 0.4 + width * (k + 0.5)
        try:
            s = c.get(name)
        except KeyError:
            continue
        if s.fits and s.speedup_over_dp:
            xs.append(x)
            ys.append(s.speedup_over_dp)
        else:
            misses.append(x)
    ax.bar(xs, ys, width, label=name, color=COLORS.get(name, "#333333"))
    for x, y in zip(xs, ys, strict=True):
        ax.text(x, y, f"{y:.2f}", ha="center", va="bottom", fontsize=5.5, rotation=90)
    ax.plot(misses, [0.05] * len(misses), "x", color=COLORS.get(name, "#333333"), markersize=4)
    return max(ys, default=0.0)


def plot_speedup_groups(groups: Sequence[tuple[str, Sequence[Comparison]]], path: str | os.PathLike[str],
                        strategies: Sequence[str], title: str) -> None:
    """Grouped bars of speedup over dp, one panel per group (e.g. per batch size), one group of
    bars per model, in the style of Figure 4 of the PipePar paper. A strategy that does
    not fit gets an 'x' at the base of its bar's place."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["text.parse_math"] = False  # names from files are text, not mathtext
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(groups), 1, figsize=(11.0, 3.6 * len(groups)), squeeze=False)
    width = 0.8 / max(1, len(strategies))
    for ax, (label, comparisons) in zip(axes[:, 0], groups, strict=True):
        top = max([1.0, *(_speedup_bars(ax, comparisons, name, k, width) for k, name in enumerate(strategies))])
        ax.axhline(1.0, color="black", linewidth=0.6, linestyle=":")
        ax.set_xticks(range(len(comparisons)), [c.model for c in comparisons])
        ax.set_ylabel("speedup over dp")
        ax.set_ylim(0, top * 1.25)
        ax.set_title(label, fontsize=10)
    axes[0, 0].legend(ncol=4, fontsize=7, loc="upper right")
    fig.suptitle(title, fontsize=11)
    write_png(path, fig, dpi=120, bbox_inches="tight")

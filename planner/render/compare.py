"""Output of ``planner compare``: a rich table on stderr and a bar chart PNG (matplotlib Agg)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from rich.table import Table

from planner.compare import Comparison, StrategyResult
from planner.render import GIB, stderr_console, write_png
from planner.render.text import safe_text


def _fmt(value: float | None, fmt: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{fmt}}{suffix}"


def comparison_table(comparison: Comparison) -> Table:
    """One row per strategy: time, throughput, speedup over dp, memory per GPU, fits, config."""
    model, cluster = safe_text(comparison.model), safe_text(comparison.cluster)
    table = Table(title=f"{model} (batch {comparison.batch_size}) on {cluster}, "
                        f"optimizer {comparison.optimizer}", title_justify="left")
    for col, justify in (("strategy", "left"), ("config", "left"), ("schedule", "left"), ("M", "right"),
                         ("iter ms", "right"), ("samples/s", "right"), ("vs dp", "right"),
                         ("GiB/GPU", "right"), ("fits", "left")):
        table.add_column(col, justify=justify, no_wrap=col in ("strategy", "fits"))  # type: ignore[arg-type]
    fastest = min((s.iteration_s for s in comparison.strategies if s.fits and s.iteration_s), default=None)
    for s in comparison.strategies:
        style = "bold green" if s.fits and s.iteration_s == fastest else ("dim" if not s.fits else "")
        table.add_row(
            safe_text(s.name), safe_text(s.config or "-"), s.schedule or "-", _fmt(s.microbatches, "d"),
            _fmt(None if s.iteration_s is None else s.iteration_s * 1000, ".1f"),
            _fmt(s.samples_per_s, ".1f"), _fmt(s.speedup_over_dp, ".2f", "x"),
            _fmt(None if s.peak_memory_bytes is None else s.peak_memory_bytes / GIB, ".2f"),
            "yes" if s.fits else "no", style=style,
        )
    return table


def print_comparison(comparison: Comparison) -> None:
    """The table on stderr, then one line per strategy that does not fit, with its reason."""
    console = stderr_console()
    if not console.is_terminal:  # logs and CI: no terminal to fit, keep every column whole
        console.width = max(console.width, 132)
    console.print(comparison_table(comparison))
    for s in comparison.strategies:
        if not s.fits:
            console.print(f"[dim]{safe_text(s.name)} does not fit:[/dim] {safe_text(s.reason)}", soft_wrap=True)


def _bar_values(strategies: Sequence[StrategyResult]) -> tuple[list[float], str]:
    """Speedup over dp when dp fits, else samples per second."""
    if any(s.speedup_over_dp for s in strategies):
        return [s.speedup_over_dp or 0.0 for s in strategies], "speedup over dp"
    return [s.samples_per_s or 0.0 for s in strategies], "samples / s"


COLORS = {"dp": "#7f7f7f", "accpar": "#8c564b", "gpipe-uniform": "#1f77b4", "torchgpipe": "#17becf",
          "deepspeed-uniform": "#9467bd", "deepspeed-parameters": "#e377c2", "pipedream": "#ff7f0e",
          "planner": "#d62728"}


def plot_comparison(comparison: Comparison, path: str | os.PathLike[str]) -> None:
    """A bar chart of every strategy (not fitting: an empty bar marked 'does not fit')."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["text.parse_math"] = False  # names from files are text, not mathtext
    import matplotlib.pyplot as plt

    rows = list(comparison.strategies)
    values, label = _bar_values(rows)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(rows)), 4.0))
    xs = range(len(rows))
    ax.bar(xs, values, color=[COLORS.get(s.name, "#333333") for s in rows])
    top = max(values, default=1.0) or 1.0
    for x, s, v in zip(xs, rows, values, strict=True):
        text = f"{v:.2f}" if s.fits else "does not fit"
        ax.text(x, v + top * 0.01, text, ha="center", va="bottom", fontsize=8,
                rotation=0 if s.fits else 90)
        if s.fits and s.config:
            ax.text(x, top * 0.02, s.config, ha="center", va="bottom", fontsize=6, rotation=90, color="white")
    ax.set_xticks(list(xs), [s.name for s in rows], rotation=30, ha="right")
    ax.set_ylabel(label)
    if label.startswith("speedup"):
        ax.axhline(1.0, color="black", linewidth=0.6, linestyle=":")
    ax.set_title(f"{comparison.model}, batch {comparison.batch_size}, on {comparison.cluster}")
    ax.set_ylim(0, top * 1.18)
    write_png(path, fig, dpi=120, bbox_inches="tight")


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
        top = 1.0
        for k, name in enumerate(strategies):
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
            top = max([top, *ys])
        ax.axhline(1.0, color="black", linewidth=0.6, linestyle=":")
        ax.set_xticks(range(len(comparisons)), [c.model for c in comparisons])
        ax.set_ylabel("speedup over dp")
        ax.set_ylim(0, top * 1.25)
        ax.set_title(label, fontsize=10)
    axes[0, 0].legend(ncol=4, fontsize=7, loc="upper right")
    fig.suptitle(title, fontsize=11)
    write_png(path, fig, dpi=120, bbox_inches="tight")

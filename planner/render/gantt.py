"""The picture of a simulation (``planner simulate --plot``), matplotlib Agg, PNG.

Three panels on one time axis: the Gantt of every device group and link (stage colours,
forward light, backward dark, weight gradient hatched, grey all-reduce, optimizer step and
the two transfer directions; micro-batch numbers only on bars wide enough to hold them, so
labels never overlap), each device group's memory over time with the GPU capacities, and,
given the plan's explanation (planner.explain), where each stage's iteration goes
(compute, all-reduce, optimizer, idle; transfers, which overlap compute, as a thin bar).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from planner.explain import Explanation
from planner.render import GIB, write_png
from planner.render.text import count, plain_text, plot_text
from planner.simulate import SimResult

DPI = 110
LABEL_PT = 6.5
MAX_LABELS = 3000
MAX_LEGEND = 12
MAX_PANEL_IN = 12.0
"""Tallest Gantt panel (inches); past it rows get thinner (64 stages and their links still fit)."""
SHADE = {"AR": "0.35", "OPT": "0.15", "act": "0.6", "grad": "0.8", "engine": "0.5"}
"""Grey levels of the collectives and transfers (activations forward, gradients backward), and of the
engine's overheads."""


def lane_label(devices: Sequence[str]) -> str:
    """A device group's name: ``n0.g0`` or ``n0.g0 +3`` (three more devices doing the same work)."""
    return plain_text(devices[0] if len(devices) == 1 else f"{devices[0]} +{len(devices) - 1}")


GREYS = {"tab10": (7,), "tab20": (14, 15)}
"""Grey entries of the stage colour maps, left out: grey means all-reduce, optimizer and transfers."""


def _color(cmap: Any, index: int) -> Any:
    """The colormap's colour for a stage or lane, never a grey (colours repeat after the map's size)."""
    skip = GREYS.get(getattr(cmap, "name", ""), ())
    colours = [i for i in range(getattr(cmap, "N", 10)) if i not in skip]
    return cmap(colours[index % len(colours)])


def _bar_style(op: str, color: Any) -> dict[str, Any]:
    """Forward light, backward dark, weight gradient hatched (stage colour); collectives and transfers grey."""
    if op == "F":
        return {"facecolor": color, "alpha": 0.5, "edgecolor": "white", "linewidth": 0.3}
    if op == "B":
        return {"facecolor": color, "alpha": 1.0, "edgecolor": "white", "linewidth": 0.3}
    if op == "W":
        return {"facecolor": color, "alpha": 0.8, "hatch": "///", "edgecolor": "white", "linewidth": 0.3}
    return {"facecolor": SHADE.get(op, "0.6"), "alpha": 0.9}


def _rows(result: SimResult) -> dict[str, int]:
    """The Gantt row of each event track: lanes first, then links."""
    n = len(result.lanes)
    rows = {f"lane:{i}": i for i in range(n)}
    rows.update({f"link:{link}": n + j for j, link in enumerate(result.links)})
    return rows


def _draw_bars(ax: Any, result: SimResult, cmap: Any) -> list[tuple[float, float, int, str]]:
    """Every event as a bar, grouped by (row, op, stage); returns (start ms, length ms, row, micro-batch)
    of the compute bars, the candidates for labels."""
    row_of = _rows(result)
    bars: dict[tuple[int, str, int], list[tuple[float, float]]] = {}
    labels: list[tuple[float, float, int, str]] = []
    for e in result.events:
        row = row_of.get(e.track)
        if row is None:
            continue
        span = (e.start * 1e3, (e.end - e.start) * 1e3)
        bars.setdefault((row, e.op, e.stage), []).append(span)
        if e.op in ("F", "B", "W"):
            labels.append((*span, row, str(e.mb)))
    for (row, op, stage), spans in bars.items():
        height = 0.8 if row < len(result.lanes) else 0.5
        ax.broken_barh(spans, (row - height / 2, height), **_bar_style(op, _color(cmap, stage)))
    return labels


def _draw_labels(ax: Any, labels: Sequence[tuple[float, float, int, str]]) -> int:
    """Micro-batch numbers on the bars that can hold them (after layout; none when too many fit): no label
    is wider than its bar or taller than its row, so none overlaps another. Returns how many were drawn."""
    x0, _ = ax.transData.transform((0.0, 0.0))
    x1, y1 = ax.transData.transform((1.0, 1.0))
    px_per_ms, px_per_row = abs(x1 - x0), abs(ax.transData.transform((0.0, 0.0))[1] - y1)
    char_px, text_px = 0.62 * LABEL_PT * DPI / 72, 1.1 * LABEL_PT * DPI / 72
    if px_per_row * 0.8 < text_px:
        return 0
    fitting = [(x + w / 2, row, text) for x, w, row, text in labels if w * px_per_ms >= len(text) * char_px + 3]
    if len(fitting) > MAX_LABELS:
        return 0
    for x, row, text in fitting:
        ax.text(x, row, text, ha="center", va="center", fontsize=LABEL_PT, color="black")
    return len(fitting)


def _legend_handles(result: SimResult, cmap: Any, engine_step: bool = False) -> list[Any]:
    """Stage colours (the first few), then every kind of bar the Gantt draws (``engine_step``: the
    optimizer step's bar holds the engine's per-step cost too)."""
    from matplotlib.patches import Patch

    stages = sorted({e.stage for e in result.events if e.op in ("F", "B", "W")})
    handles = [Patch(facecolor=_color(cmap, s), label=f"stage {s}") for s in stages[:MAX_LEGEND]]
    if len(stages) > MAX_LEGEND:
        handles.append(Patch(facecolor="white", label=f"... {len(stages)} stages (colours repeat)"))
    if any(len(devices) > 1 for devices in result.lanes):
        handles.append(Patch(facecolor="none", edgecolor="none",
                             label="row 'g +n': device g and n more\nof its group, doing the same work"))
    grey = _color(cmap, stages[0] if stages else 0)
    handles += [Patch(label="forward (light)", **_bar_style("F", grey)),
                Patch(label="backward (dark)", **_bar_style("B", grey)),
                Patch(label="weight gradient (hatched)", **_bar_style("W", grey)),
                Patch(facecolor=SHADE["AR"], label="gradient all-reduce"),
                Patch(facecolor=SHADE["OPT"], label="optimizer step" + ("\n+ the engine's per-step cost" if engine_step
                                                                         else "")),
                Patch(facecolor=SHADE["act"], label="transfer: activations (fwd)"),
                Patch(facecolor=SHADE["grad"], label="transfer: gradients (bwd)")]
    return handles


def _gantt_axes(ax: Any, result: SimResult, title: str | None, cmap: Any, engine_step: bool = False) -> None:
    """Row names, time range, a steady-state run's measured window, title and the complete legend."""
    links = list(result.links)
    n_rows = len(result.lanes) + len(links)
    step = max(1, -(-n_rows // 40))  # at most 40 row names, so that they stay readable
    ax.set_yticks(range(0, n_rows, step))
    names = [plot_text(f"{i}: {lane_label(d)}") for i, d in enumerate(result.lanes)] + [plot_text(x) for x in links]
    ax.set_yticklabels(names[::step], fontsize=7 if n_rows > 16 else 8)
    ax.set_ylabel("stage: devices, then links", fontsize=7)
    ax.set_ylim(n_rows - 0.5, -0.5)
    ax.set_xlim(0, max(result.makespan_s * 1000, 1e-12))
    if result.steady_state:
        for t in result.window:
            ax.axvline(t * 1000, color="red", linestyle=":", linewidth=1)
    ax.set_title(plot_text(title) if title else (f"{result.schedule}: {count(result.stages, 'stage')} x "
                           f"{count(result.microbatches, 'micro-batch')}, iteration "
                           f"{result.iteration_s * 1000:.3f} ms, bubble {result.bubble_fraction:.1%}"),
                 fontsize=10, loc="left")
    ax.legend(handles=_legend_handles(result, cmap, engine_step), fontsize=7, loc="upper left",
              bbox_to_anchor=(1.0, 1.0))


def _capacities(result: SimResult) -> dict[int, list[str]]:
    """Each distinct device capacity (bytes) and the devices that have it."""
    caps: dict[int, list[str]] = {}
    for d in result.devices:
        if d.capacity_bytes > 0:
            caps.setdefault(d.capacity_bytes, []).append(d.device)
    return caps


def _draw_memory(axm: Any, result: SimResult, cmap: Any) -> None:
    """Each device group's memory over time (its first device), and a dashed red line per GPU capacity
    (in scale when under 1.6x the peak, else named above the panel with the least headroom)."""
    for i, d in enumerate(result.devices):
        if i and d.lane == result.devices[i - 1].lane:
            continue
        pts = [*d.memory, (result.makespan_s, d.memory[-1][1])]
        label = plot_text(lane_label(result.lanes[d.lane])) if d.lane < MAX_LEGEND else None
        axm.step([t * 1000 for t, _ in pts], [b / GIB for _, b in pts], where="post",
                 color=_color(cmap, d.lane), label=label, linewidth=1.2)
    peak = max((d.peak_memory_bytes for d in result.devices), default=0)
    above = []
    for cap, devices in sorted(_capacities(result).items()):
        who = plot_text(devices[0]) if len(devices) == 1 else f"{count(len(devices), 'device')}"
        if cap <= 1.6 * peak:
            axm.axhline(cap / GIB, color="red", linestyle="--", linewidth=0.9,
                        label=f"capacity {cap / GIB:.1f} GiB ({who})")
        else:
            above.append(f"{cap / GIB:.1f} GiB ({who})")
    axm.set_ylim(0, max(peak, *(c for c in _capacities(result) if c <= 1.6 * peak), 1) / GIB * 1.12)
    title = "memory per device group over time"
    if above:
        title += "; capacity above the scale: " + ", ".join(above)
    axm.set_title(title, fontsize=8, loc="left")
    axm.set_ylabel("GiB")
    axm.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    axm.grid(alpha=0.3)


def _draw_breakdown(axb: Any, e: Explanation, cmap: Any) -> None:
    """Per stage, stacked: compute, all-reduce, optimizer step, the engine's overheads (when any),
    idle; transfers (overlapping) as a thin bar."""
    ys = range(len(e.stages))
    left = [0.0] * len(e.stages)
    engine = e.engine_charged
    parts = (("compute", "compute_s", None), ("all-reduce", "allreduce_s", SHADE["AR"]),
             ("optimizer step", "optimizer_s", SHADE["OPT"]), *((("engine", "engine_s", SHADE["engine"]),) if engine
                                                                else ()), ("idle (bubble)", "idle_s", "white"))
    for name, attr, color in parts:
        widths = [getattr(s, attr) * 1e3 for s in e.stages]
        colors = [_color(cmap, s.stage) for s in e.stages] if color is None else color
        axb.barh(ys, widths, left=left, height=0.6, color=colors, edgecolor="0.5", linewidth=0.4,
                 hatch=".." if name.startswith("idle") else None, label=name)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    axb.barh([y + 0.38 for y in ys], [s.transfer_s * 1e3 for s in e.stages], height=0.14, color=SHADE["act"],
             label="transfers in (overlap compute)")
    step = max(1, -(-len(e.stages) // 32))
    names = [plot_text(f"{s.stage}: {lane_label(s.devices)}") + (" *" if s.stage == e.bottleneck else "")
             for s in e.stages]
    axb.set_yticks(list(ys)[::step], names[::step], fontsize=7 if len(e.stages) > 16 else 8)
    axb.set_ylim(len(e.stages) - 0.4, -0.6)
    axb.set_title(f"where each stage's iteration goes (* bottleneck: {e.bound})", fontsize=8, loc="left")
    axb.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def figure(result: SimResult, title: str | None = None, explanation: Explanation | None = None) -> Any:
    """The matplotlib figure of :func:`plot_simulation` (the caller closes it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_rows = len(result.lanes) + len(result.links)
    heights = [min(MAX_PANEL_IN, max(1.5, 0.3 * n_rows if n_rows > 16 else 0.42 * n_rows)), 2.4]
    if explanation is not None:
        heights.append(min(MAX_PANEL_IN / 2, max(1.2, 0.22 * len(explanation.stages) + 0.6)))
    fig, axes = plt.subplots(len(heights), 1, figsize=(13, 1.2 + sum(heights)), sharex=True,
                             gridspec_kw={"height_ratios": heights})
    try:
        cmap = plt.get_cmap("tab20" if result.stages * result.virtual_stages > 9 else "tab10")
        labels = _draw_bars(axes[0], result, cmap)
        engine_step = explanation is not None and explanation.engine_step_charged
        _gantt_axes(axes[0], result, title, cmap, engine_step)
        _draw_memory(axes[1], result, cmap)
        if explanation is not None:
            _draw_breakdown(axes[2], explanation, cmap)
        axes[-1].set_xlabel("time (ms)")
        fig.set_dpi(DPI)
        fig.tight_layout()
        _draw_labels(axes[0], labels)
    except BaseException:
        plt.close(fig)
        raise
    return fig


def plot_simulation(result: SimResult, path: str | os.PathLike[str], title: str | None = None,
                    explanation: Explanation | None = None) -> None:
    """The Gantt, memory over time and (given ``explanation``) the per-stage breakdown, as PNG.

    Written atomically: on any failure no file (or a previous one, untouched) is left.
    """
    write_png(path, figure(result, title, explanation), dpi=DPI)

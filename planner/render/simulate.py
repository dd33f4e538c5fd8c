"""Output of ``planner simulate``: a text Gantt and summary for the terminal, a PNG picture.

The text Gantt has one row per device group (pipeline rank) and one per link; each column
is a slice of the iteration showing what runs at its middle: the micro-batch number of a
forward (blue), backward (green) or weight-gradient pass (yellow), ``#`` for a gradient
all-reduce, ``=`` for a transfer on a link, ``·`` for idle. The PNG draws the same Gantt
with one colour per stage and micro-batch numbers on the bars (after the GPipe and
PipeDream figures), and each device group's memory over time under it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from planner.render import GIB, stderr_console, write_png
from planner.render.text import plain_text, safe_text
from planner.simulate import Event, SimResult

MARK = {"F": "blue", "B": "green", "W": "yellow", "AR": "red", "OPT": "bright_red", "act": "cyan", "grad": "magenta"}
IDLE = "·"


def lane_label(devices: Sequence[str]) -> str:
    """A device group's name: ``n0.g0`` or ``n0.g0 +3``."""
    return plain_text(devices[0] if len(devices) == 1 else f"{devices[0]} +{len(devices) - 1}")


def gantt_rows(result: SimResult, width: int = 96) -> list[tuple[str, list[tuple[str, str]]]]:
    """Rows of (label, cells); each cell a character and its op (``""`` for idle).

    Column j covers [t0 + j*dt, t0 + (j+1)*dt) of the simulated span (the whole run, or for
    pipedream the measured steady-state window) and shows the event at its middle.
    """
    width = max(8, width)
    t0, t1 = (result.window if result.steady_state else (0.0, result.makespan_s))
    span = max(t1 - t0, 1e-30)
    dt = span / width
    tracks: dict[str, list[Event]] = {}
    for e in result.events:
        tracks.setdefault(e.track, []).append(e)
    order = [(f"lane:{i}", lane_label(devs)) for i, devs in enumerate(result.lanes)]
    order += [(f"link:{link}", plain_text(link)) for link in result.links]
    rows = []
    for track, label in order:
        cells: list[tuple[str, str]] = [(IDLE, "")] * width
        for e in tracks.get(track, ()):
            if e.end <= t0 or e.start >= t1:
                continue
            j0 = max(0, int((e.start - t0) / dt + 0.5))
            j1 = min(width, int((e.end - t0) / dt + 0.5))
            if j1 <= j0 and e.end > e.start:  # too short for a column: give it the one it starts in
                j0 = min(width - 1, j0)
                j1 = j0 + 1
            if e.op in ("F", "B", "W"):
                char = str(e.mb % 10)
            elif e.op == "AR":
                char = "#"
            elif e.op == "OPT":
                char = "o"
            else:
                char = "="
            for j in range(j0, j1):
                cells[j] = (char, e.op)
        rows.append((label, cells))
    return rows


def gantt_text(result: SimResult, width: int = 96) -> Text:
    """The text Gantt as rich Text (styles by op)."""
    rows = gantt_rows(result, width)
    label_w = max((len(label) for label, _ in rows), default=4)
    out = Text()
    for label, cells in rows:
        out.append(label.ljust(label_w) + " │", style="bold")
        for char, op in cells:
            out.append(char, style=MARK.get(op, "dim"))
        out.append("│\n")
    t0, t1 = (result.window if result.steady_state else (0.0, result.makespan_s))
    end = f"{t1 * 1000:.4g} ms"
    out.append(" " * (label_w + 2) + f"{t0 * 1000:.4g} ms".ljust(max(8, width) - len(end)) + end + "\n", style="dim")
    out.append(" " * (label_w + 2) + "digits: micro-batch of ", style="dim")
    for op, name in (("F", "forward"), ("B", "backward"), ("W", "weight grad")):
        out.append(name + " ", style=MARK[op])
    out.append("#", style=MARK["AR"])
    out.append(" all-reduce  ", style="dim")
    out.append("o", style=MARK["OPT"])
    out.append(" optimizer step  ", style="dim")
    out.append("=", style=MARK["act"])
    out.append(" transfer  · idle\n", style="dim")
    return out


def gantt_plain(result: SimResult, width: int = 96) -> str:
    """The text Gantt without styles (for tests and logs)."""
    rows = gantt_rows(result, width)
    label_w = max((len(label) for label, _ in rows), default=4)
    return "\n".join(label.ljust(label_w) + " │" + "".join(c for c, _ in cells) + "│" for label, cells in rows)


def headline(result: SimResult, batch_size: int | None = None) -> str:
    """One line: schedule, shape, iteration time, bubble (and throughput)."""
    line = (f"{result.schedule}: {result.stages} stages x {result.microbatches} micro-batches"
            + (f" x {result.virtual_stages} chunks" if result.virtual_stages > 1 else "")
            + f", iteration {result.iteration_s * 1000:.3f} ms, bubble {result.bubble_fraction:.1%}")
    if batch_size:
        line += f", {batch_size / result.iteration_s:.1f} samples/s"
    if result.steady_state:
        line += " (steady state)"
    return line


def summary_table(result: SimResult, batch_size: int | None = None, title: bool = True) -> Table:
    """One row per device: group, busy time and share, peak memory against capacity."""
    table = Table(title=headline(result, batch_size) if title else None, title_justify="left")
    for col, justify in (("device", "left"), ("stage", "right"), ("busy ms", "right"), ("busy", "right"),
                         ("in flight", "right"), ("peak GiB", "right"), ("capacity GiB", "right"), ("fits", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for d in result.devices:
        share = d.busy_s / result.iteration_s if result.iteration_s > 0 else 0.0
        table.add_row(safe_text(d.device), str(d.lane), f"{d.busy_s * 1000:.3f}", f"{share:.0%}", str(d.peak_in_flight),
                      f"{d.peak_memory_bytes / GIB:.3f}",
                      f"{d.capacity_bytes / GIB:.2f}" if d.capacity_bytes > 0 else "-",
                      "yes" if d.fits else "NO", style="" if d.fits else "bold red")
    return table


def print_simulation(result: SimResult, batch_size: int | None = None, width: int | None = None) -> None:
    """The text Gantt and the summary on stderr."""
    console = stderr_console()
    w = width if width is not None else max(24, min(160, console.width) - 4 - max(
        (len(lane_label(d)) for d in result.lanes), default=8) - 4)
    console.print(gantt_text(result, w), soft_wrap=True)
    console.print(headline(result, batch_size), soft_wrap=True, style="bold")
    console.print(summary_table(result, batch_size, title=False))


# ----------------------------------------------------------------------------- picture


MAX_LABELS = 1500


_Bars = dict[tuple[int, str, int], list[tuple[float, float]]]
"""(row, op, stage) -> the (start ms, length ms) of its bars."""


def _color(cmap: Any, index: int) -> Any:
    """The colormap's colour for a stage or lane (colours repeat after the map's size)."""
    return cmap(index % getattr(cmap, "N", 10))


def _bars_and_labels(result: SimResult, row_of: dict[str, int]) -> tuple[_Bars, list[tuple[float, int, str]]]:
    """Every event's bar by (row, op, stage), and (middle ms, row, micro-batch) labels of compute events."""
    bars: _Bars = {}
    labels: list[tuple[float, int, str]] = []
    for e in result.events:
        row = row_of.get(e.track)
        if row is None:
            continue
        key = (row, e.op, e.stage)
        bars.setdefault(key, []).append((e.start * 1000, (e.end - e.start) * 1000))
        if e.op in ("F", "B", "W") and len(labels) < MAX_LABELS:
            labels.append(((e.start + e.end) * 500, row, str(e.mb)))
    return bars, labels


def _bar_style(op: str, color: Any) -> dict[str, Any]:
    """Forward light, backward dark, weight gradient hatched (stage colour); collectives and transfers grey."""
    if op == "F":
        return {"facecolor": color, "alpha": 0.55, "edgecolor": "white", "linewidth": 0.3}
    if op == "B":
        return {"facecolor": color, "alpha": 1.0, "edgecolor": "white", "linewidth": 0.3}
    if op == "W":
        return {"facecolor": color, "alpha": 0.8, "hatch": "///", "edgecolor": "white", "linewidth": 0.3}
    if op in ("AR", "OPT"):
        return {"facecolor": "0.35" if op == "AR" else "0.2", "alpha": 0.9}
    return {"facecolor": "0.6" if op == "act" else "0.8", "alpha": 0.9}


def _draw_bars(ax: Any, result: SimResult, cmap: Any) -> None:
    """One row per lane then per link: the bars, and micro-batch numbers unless there are too many."""
    n_lanes = len(result.lanes)
    row_of = {f"lane:{i}": i for i in range(n_lanes)}
    row_of.update({f"link:{link}": n_lanes + j for j, link in enumerate(result.links)})
    bars, labels = _bars_and_labels(result, row_of)
    for (row, op, stage), spans in bars.items():
        height = 0.8 if row < n_lanes else 0.5
        ax.broken_barh(spans, (row - height / 2, height), **_bar_style(op, _color(cmap, stage)))
    if len(labels) < MAX_LABELS:
        fontsize = max(4.0, min(8.0, 600 / max(1, len(labels)) ** 0.5))
        for x, row, text in labels:
            ax.text(x, row, text, ha="center", va="center", fontsize=fontsize, color="black")


def _gantt_axes(ax: Any, result: SimResult, title: str | None, cmap: Any) -> None:
    """Row names, time range, pipedream's measured window, title and stage legend of the Gantt."""
    from matplotlib.patches import Patch

    links = list(result.links)
    n_rows = len(result.lanes) + len(links)
    ax.set_yticks(range(n_rows))
    ax.set_yticklabels([lane_label(d) for d in result.lanes] + links, fontsize=8)
    ax.set_ylim(n_rows - 0.5, -0.5)
    ax.set_xlim(0, max(result.makespan_s * 1000, 1e-12))
    if result.steady_state:
        for t in result.window:
            ax.axvline(t * 1000, color="red", linestyle=":", linewidth=1)
    ax.set_title(title or (f"{result.schedule}: {result.stages} stages x {result.microbatches} micro-batches, "
                           f"iteration {result.iteration_s * 1000:.3f} ms, bubble {result.bubble_fraction:.1%}"),
                 fontsize=10, loc="left")
    stages = sorted({e.stage for e in result.events if e.op in ("F", "B", "W")})
    handles = [Patch(facecolor=_color(cmap, s), label=f"stage {s}") for s in stages[:12]]
    handles += [Patch(facecolor="white", edgecolor="black", label="light: F, dark: B, hatched: W"),
                Patch(facecolor="0.35", label="all-reduce"), Patch(facecolor="0.6", label="transfer")]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def _draw_memory(axm: Any, result: SimResult, cmap: Any) -> None:
    """Each lane's memory over time (its first device), with the capacities near the peak as dashed lines."""
    for i, d in enumerate(result.devices):
        if i and d.lane == result.devices[i - 1].lane:
            continue
        pts = [*d.memory, (result.makespan_s, d.memory[-1][1])]
        axm.step([t * 1000 for t, _ in pts], [b / GIB for _, b in pts], where="post",
                 color=_color(cmap, d.lane), label=lane_label(result.lanes[d.lane]), linewidth=1.2)
    caps = sorted({d.capacity_bytes for d in result.devices if d.capacity_bytes > 0})
    peak = max((d.peak_memory_bytes for d in result.devices), default=0)
    for cap in caps:
        if cap <= 1.5 * peak:
            axm.axhline(cap / GIB, color="red", linestyle="--", linewidth=0.8)
    axm.set_ylabel("memory GiB")
    axm.set_xlabel("time (ms)")
    axm.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    axm.grid(alpha=0.3)


def plot_simulation(result: SimResult, path: str | os.PathLike[str], title: str | None = None) -> None:
    """Gantt chart (stage colours, micro-batch numbers) with memory over time under it, as PNG.

    Written atomically: on any failure no file (or a previous one, untouched) is left.
    """
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["text.parse_math"] = False  # names from files are text, not mathtext
    import matplotlib.pyplot as plt

    n_rows = len(result.lanes) + len(result.links)
    fig, (ax, axm) = plt.subplots(2, 1, figsize=(13, 2.2 + 0.42 * n_rows + 2.6), sharex=True,
                                  gridspec_kw={"height_ratios": [max(1.5, 0.42 * n_rows), 2.6]})
    try:
        cmap = plt.get_cmap("tab20" if result.stages * result.virtual_stages > 10 else "tab10")
        _draw_bars(ax, result, cmap)
        _gantt_axes(ax, result, title, cmap)
        _draw_memory(axm, result, cmap)
        fig.tight_layout()
        write_png(path, fig, dpi=110)
    finally:
        plt.close(fig)  # also when drawing fails (write_png closes it after writing)

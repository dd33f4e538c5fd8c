"""Output of ``planner simulate``: a text Gantt and summary for the terminal, a PNG picture.

The text Gantt has one row per device group (pipeline rank) and one per link; each column
is a slice of the iteration showing what runs at its middle: ``>`` a forward (blue), ``<`` a
backward (green), ``w`` a weight-gradient pass (yellow), each starting with its micro-batch
number (mod 10) when it spans two columns or more, ``#`` a gradient all-reduce, ``o`` the
optimizer step, ``=`` a transfer on a link, ``·`` idle: readable without colour (logs). The PNG (planner.render.gantt,
``plot_simulation``) draws the same Gantt with one colour per stage and micro-batch numbers
on the bars (after the GPipe and PipeDream figures), memory over time and where each
stage's time goes under it.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from planner.render import GIB, stderr_console
from planner.render.gantt import lane_label
from planner.render.text import count, plain_text, safe_text
from planner.simulate import Event, SimResult

FILL = {"F": ">", "B": "<", "W": "w", "AR": "#", "OPT": "o", "act": "=", "grad": "="}
"""The character of each op in the text Gantt (F, B and W start with their micro-batch digit)."""
MARK = {"F": "blue", "B": "green", "W": "yellow", "AR": "red", "OPT": "bright_red", "act": "cyan", "grad": "magenta"}
IDLE = "·"


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
            char = FILL.get(e.op, "=")
            for j in range(j0, j1):
                cells[j] = (char, e.op)
            if e.op in ("F", "B", "W") and j1 - j0 >= 2:
                cells[j0] = (str(e.mb % 10), e.op)
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
    out.append(" " * (label_w + 2))
    for op, name in (("F", "forward"), ("B", "backward"), ("W", "weight grad"), ("AR", "all-reduce"),
                     ("OPT", "optimizer step"), ("act", "transfer")):
        out.append(FILL[op], style=MARK[op])
        out.append(f" {name}  ", style="dim")
    out.append(f"{IDLE} idle; a digit starts each pass: its micro-batch (mod 10)\n", style="dim")
    if any(" +" in label for label, _ in rows):
        out.append(" " * (label_w + 2) + "row 'g +n': device g and n more doing the same work (its stage's "
                   "data/tensor-parallel group)\n", style="dim")
    return out


def gantt_plain(result: SimResult, width: int = 96) -> str:
    """The text Gantt without styles (for tests and logs)."""
    rows = gantt_rows(result, width)
    label_w = max((len(label) for label, _ in rows), default=4)
    return "\n".join(label.ljust(label_w) + " │" + "".join(c for c, _ in cells) + "│" for label, cells in rows)


def headline(result: SimResult, batch_size: int | None = None) -> str:
    """One line: schedule, shape, iteration time, bubble (and throughput)."""
    line = (f"{result.schedule}: {count(result.stages, 'stage')} x {count(result.microbatches, 'micro-batch')}"
            + (f" x {result.virtual_stages} chunks" if result.virtual_stages > 1 else "")
            + f", iteration {result.iteration_s * 1000:.3f} ms, bubble {result.bubble_fraction:.1%}")
    if batch_size and result.iteration_s > 0:
        line += f", {batch_size / result.iteration_s:.1f} samples/s"
    if result.steady_state:
        line += " (steady state)"
    return line


def summary_table(result: SimResult, batch_size: int | None = None, title: bool = True) -> Table:
    """One row per device: group, busy time and share, peak memory against capacity."""
    table = Table(title=headline(result, batch_size) if title else None, title_justify="left")
    for col, justify in (("device", "left"), ("stage", "right"), ("busy ms", "right"), ("busy", "right"),
                         ("in flight", "right"), ("peak GiB", "right"), ("capacity GiB", "right"), ("fits", "left")):
        table.add_column(col, justify=justify, overflow="fold")  # type: ignore[arg-type]
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

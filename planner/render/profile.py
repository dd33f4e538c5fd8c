"""Terminal output of ``planner profile``: a progress bar while measuring, a summary table after."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from planner.ir import LayerProfile, ModelProfile
from planner.render import stderr_console
from planner.render.text import count, safe_text


@contextmanager
def progress_bar(title: str, show: bool = True) -> Iterator[Callable[[int, int, str], None]]:
    """A rich progress bar on stderr when it is a terminal and ``show`` (false under ``--json``, as for the other
    commands' progress: docs/contracts.md); yields the ``progress(done, total, what)`` callback."""
    console = stderr_console()
    if not show or not console.is_terminal:  # --json, a log file or a pipe: no bar, no stray blank lines
        yield lambda done, total, what: None
        return
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TaskProgressColumn(),
                  TextColumn("{task.fields[what]}"), TimeElapsedColumn(), console=console,
                  transient=True) as bar:
        task = bar.add_task(title, total=1, what="")

        def update(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total, what=what)

        yield update


def _si(value: float, unit: str) -> str:
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.2f} {prefix}{unit}"
    return f"{value:.0f} {unit}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def _dims(shape: tuple[int, ...] | None) -> str | None:
    """A shape without its batch dimension: ``(8, 128, 768)`` -> ``128x768``."""
    return None if shape is None or len(shape) < 2 else "x".join(str(d) for d in shape[1:])


def io_shapes(profile: ModelProfile, i: int) -> str:
    """Layer ``i``'s input and output, without batch: its output shape, and the previous layer's (or the
    model's input shape for the first); the weight's in/out features where no shape is known."""
    layer = profile.layers[i]
    out = _dims(layer.output_shape)
    if i > 0:
        into = _dims(profile.layers[i - 1].output_shape)
    else:
        into = None if profile.input_shape is None else "x".join(str(d) for d in profile.input_shape)
    if out is not None and into is not None:
        return f"{into}→{out}"
    return "" if layer.in_features is None else f"{layer.in_features}→{layer.out_features}"


def summary_table(profile: ModelProfile, max_rows: int = 60) -> Table:
    """One row per layer (elided in the middle past ``max_rows``) and a total row."""
    mode = profile.mode
    model, dtype, device = (safe_text(x) for x in (profile.model, profile.dtype, profile.device))
    shape = "" if profile.input_shape is None else f" of {'x'.join(map(str, profile.input_shape))}"
    table = Table(title=f"{model}: {count(len(profile.layers), 'layer')}, batch {profile.batch_size}{shape}, "
                        f"{dtype}, {safe_text(mode)} on {device} ({_si(profile.device_flops, 'FLOP/s')})",
                  title_justify="left")
    for col, justify in (("#", "right"), ("layer", "left"), ("type", "left"), ("fwd ms", "right"),
                         ("bwd ms", "right"), ("FLOPs f+b", "right"), ("params", "right"), ("output", "right"),
                         ("saved", "right"), ("in→out (no batch)", "right")):
        table.add_column(col, justify=justify, overflow="fold")  # type: ignore[arg-type]
    rows: list[tuple[int, LayerProfile | None]] = list(enumerate(profile.layers))
    if len(rows) > max_rows:
        half = max_rows // 2
        rows = [*rows[:half], (-1, None), *rows[-half:]]
    for i, layer in rows:
        if layer is None:
            table.add_row("…", "…", "", "", "", "", "", "", "", "")
            continue
        table.add_row(str(i), safe_text(layer.name), safe_text(layer.type), _ms(layer.forward_s), _ms(layer.backward_s),
                      _si(layer.forward_flops + layer.backward_flops, ""), f"{layer.param_count:,}",
                      _si(layer.output_bytes, "B"), _si(layer.saved_bytes, "B"), io_shapes(profile, i))
    ls = profile.layers
    table.add_section()
    table.add_row("", "total", "", _ms(sum(x.forward_s for x in ls)), _ms(sum(x.backward_s for x in ls)),
                  _si(sum(x.forward_flops + x.backward_flops for x in ls), ""), f"{profile.param_count:,}",
                  "", _si(sum(x.saved_bytes for x in ls), "B"), "")
    return table


def print_summary(profile: ModelProfile, output: str | None) -> None:
    console = stderr_console()
    console.print(summary_table(profile))
    meta = profile.meta
    notes = []
    if profile.ties:
        notes.append("tied: " + ", ".join(f"{safe_text(t.name)} (layers {', '.join(map(str, t.layers))})"
                                          for t in profile.ties))
    whole = meta.get("whole_model_fwd_bwd_s")
    if whole:
        total = sum(x.forward_s + x.backward_s for x in profile.layers)
        notes.append(f"whole model fwd+bwd {whole * 1e3:.1f} ms; layers sum {total * 1e3:.1f} ms "
                     f"({total / whole:.2f}x); profiling took {meta.get('profiling_s', 0):.1f} s")
    if profile.mode == "analytic" and meta.get("efficiency") is not None:
        notes.append(f"times = FLOPs / ({_si(profile.device_flops, 'FLOP/s')} x efficiency {meta.get('efficiency')})")
    elif profile.mode == "analytic":
        roof = meta.get("roofline") or {}
        where = f"{safe_text(str(roof.get('gpu')))} {safe_text(str(roof.get('number_format')))}"
        notes.append(f"times = roofline on {where}"
                     f" (GEMMs up to {roof.get('gemm_share', 0):.0%} of {_si(profile.device_flops, 'FLOP/s')}, "
                     f"{_si(roof.get('bandwidth_Bps', 0), 'B/s')}); memory-bound "
                     f"{roof.get('memory_bound_share', 0):.0%} of the time")
    if output:
        notes.append(f"wrote {safe_text(output)}")
    for note in notes:
        console.print(note)

"""``planner profile MODEL -o FILE``: trace a model into layers and write its per-layer costs."""

from __future__ import annotations

import contextlib

import click

from planner.errors import UsageError


def parse_shape(text: str | None) -> tuple[int, ...] | None:
    """``"3,224,224"`` (or ``3x224x224``) -> (3, 224, 224)."""
    if text is None:
        return None
    parts = [p for p in text.replace("x", ",").replace(" ", "").split(",") if p]
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        shape = ()
    if not shape or any(d < 1 for d in shape):
        raise UsageError(f"--input-shape {text!r} is not a list of positive sizes",
                         "give the input shape without batch, e.g. --input-shape 3,224,224")
    return shape


@click.command("profile")
@click.argument("model")
@click.option("-o", "--output", type=str, default=None, help="Profile JSON to write (atomically).")
@click.option("--batch-size", "-b", type=int, default=32, show_default=True, help="Mini-batch size profiled.")
@click.option("--input-shape", type=str, default=None, help="Input shape without batch, e.g. 3,224,224 (zoo default).")
@click.option("--mode", type=click.Choice(["measured", "analytic"]), default="measured", show_default=True,
              help="measured: time every layer here; analytic: FLOPs / device FLOP/s, no compute.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--dtype", type=click.Choice(["float32", "float16", "bfloat16"]), default="float32", show_default=True)
@click.option("--threads", type=int, default=None, help="torch CPU threads while measuring (default: torch's).")
@click.option("--repeats", type=int, default=3, show_default=True, help="Timed passes (median taken).")
@click.option("--warmup", type=int, default=1, show_default=True, help="Untimed passes first.")
@click.option("--device-flops", type=str, default=None,
              help="Peak FLOP/s (e.g. 13.4e12) or a GPU name: rtx2080ti, v100, a100, h100, a100-tf32, h100-tf32. "
                   "Analytic default rtx2080ti; measured default: the FLOP/s achieved.")
@click.option("--efficiency", type=float, default=None, help="Analytic: share of peak reached (default 0.5).")
@click.option("--json", "as_json", is_flag=True, help="Print the profile as one JSON document on stdout.")
def profile(model: str, output: str | None, batch_size: int, input_shape: str | None, mode: str, device: str,
            dtype: str, threads: int | None, repeats: int, warmup: int, device_flops: str | None,
            efficiency: float | None, as_json: bool) -> None:
    """Trace MODEL into layers and write per-layer costs (times, FLOPs, bytes) as profile JSON.

    MODEL is a built-in name (mlp, vgg11..vgg19[_bn], resnet18..resnet152, gpt2, gpt2-medium,
    bert-base) or package.module:factory returning an nn.Module or (module, example_input).
    """
    from planner.cli import emit_json
    from planner.commands import outputs
    from planner.jsonio import dumps
    from planner.outputs import stdout_to_stderr

    if output is None and not as_json:
        raise UsageError("no output file given", "add -o FILE (or --json to print the profile)")
    if batch_size < 1:
        raise UsageError(f"--batch-size must be 1 or more, got {batch_size}", "e.g. --batch-size 32")
    if threads is not None and threads < 1:
        raise UsageError(f"--threads must be 1 or more, got {threads}", "e.g. --threads 1")
    if repeats < 1 or warmup < 0:
        raise UsageError(f"--repeats must be 1 or more and --warmup 0 or more, got {repeats} and {warmup}",
                         "e.g. --repeats 3 --warmup 1")
    if efficiency is not None and mode != "analytic":
        raise UsageError("--efficiency applies to --mode analytic only", "drop --efficiency or use --mode analytic")
    shape = parse_shape(input_shape)
    staged = outputs([output])

    from planner.profiler import ANALYTIC_EFFICIENCY, load_model, profile_model, resolve_device_flops
    from planner.render.profile import print_summary, progress_bar

    resolve_device_flops(device_flops, default=None)  # a bad value fails before any work
    load_device = "meta" if mode == "analytic" else device
    loaded = load_model(model, batch_size, shape, dtype=dtype, device=load_device)
    title = f"profiling {model}" if mode == "measured" else f"counting {model}"
    with progress_bar(title) as update, stdout_to_stderr():  # the model's prints must not corrupt --json
        prof = profile_model(loaded, mode=mode, threads=threads, repeats=repeats, warmup=warmup,
                             device_flops=device_flops, progress=update,
                             efficiency=ANALYTIC_EFFICIENCY if efficiency is None else efficiency)
    doc = prof.to_dict()
    staged.write_text(output, dumps(doc))
    with contextlib.suppress(Exception):
        print_summary(prof, output)
    if as_json:
        emit_json(doc)
    staged.commit()

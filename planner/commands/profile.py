"""``planner profile MODEL -o FILE``: trace a model into layers and write its per-layer costs."""

from __future__ import annotations

import contextlib

import click

from planner.errors import UsageError
from planner.schemas.build import MAX_BATCH, MAX_DIM

SHAPE_HINT = "give the input shape without batch, e.g. --input-shape 3,224,224"


def parse_shape(text: str | None) -> tuple[int, ...] | None:
    """``"3,224,224"`` (or ``3x224x224``) -> (3, 224, 224); every size from 1 to MAX_DIM, none left empty."""
    if text is None:
        return None
    parts = text.replace("x", ",").replace(" ", "").split(",")
    if not all(parts):
        raise UsageError(f"--input-shape {text!r} has an empty size (two separators in a row, or one at an end)",
                         SHAPE_HINT)
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        shape = ()
    if not shape or any(d < 1 for d in shape):
        raise UsageError(f"--input-shape {text!r} is not a list of positive sizes", SHAPE_HINT)
    if max(shape) > MAX_DIM:
        raise UsageError(f"--input-shape {text!r} has a size of {max(shape):,}, above the {MAX_DIM:,} a profile "
                         "holds per dimension", "use a smaller --input-shape")
    return shape


def parse_value(text: str) -> bool | int | float | str | None:
    """A ``--set`` value: ``true``/``false`` -> bool, ``null``/``none`` -> None (a field unset, as Gemma 2's soft
    caps), then int, then float, else the text itself."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if text.lower() in ("null", "none"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue  # not this kind: try the next
    return text


def parse_overrides(items: tuple[str, ...] | list[str]) -> dict[str, bool | int | float | str | None]:
    """``("n_layer=2", "tie_word_embeddings=false")`` -> ``{"n_layer": 2, "tie_word_embeddings": False}``."""
    out: dict[str, bool | int | float | str | None] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise UsageError(f"--set {item!r} is not KEY=VALUE", "e.g. --set num_hidden_layers=4")
        out[key.strip()] = parse_value(value.strip())
    return out


@click.command("profile")
@click.argument("model")
@click.option("-o", "--output", type=str, default=None, help="Profile JSON to write (atomically).")
@click.option("--batch-size", "-b", type=int, default=32, show_default=True,
              help="Samples per iteration profiled (all times and bytes are for this batch).")
@click.option("--input-shape", type=str, default=None,
              help="Input shape without batch, e.g. 3,224,224; a token model's sequence length, e.g. 4096. "
                   "Zoo defaults: 3,224,224 for images, 784 for mlp, 128 tokens for gpt2 and bert-base, the "
                   "published context for llama2/llama3, gemma, gemma2 and olmo2, 4096 for mistral, qwen, gemma3 and "
                   "the mixtures of experts.")
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
              help="Override a config field of a zoo transformer (repeatable), e.g. --set num_hidden_layers=4.")
@click.option("--mode", type=click.Choice(["measured", "analytic"]), default="measured", show_default=True,
              help="measured: time every layer here; analytic: count on the meta device, no compute, and time "
                   "each kernel by a roofline of the --device-flops GPU.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="Where measured mode runs the layers.")
@click.option("--dtype", type=click.Choice(["float32", "float16", "bfloat16"]), default="float32", show_default=True,
              help="Number format of weights and activations (bytes per value, and the peak analytic mode uses).")
@click.option("--threads", type=int, default=None,
              help="torch CPU threads while measuring, 1 to the cores (default: torch's).")
@click.option("--repeats", type=int, default=3, show_default=True,
              help="Timed passes per layer (the median is kept), 1 to 1000.")
@click.option("--warmup", type=int, default=1, show_default=True,
              help="Untimed passes per layer before timing, 0 to 1000.")
@click.option("--device-flops", type=str, default=None,
              help="Peak FLOP/s (e.g. 13.4e12) or a GPU name (rtx2080ti, v100, a100, h100, ...: its peak for "
                   "--dtype; a100-tf32, h100-tf32: TF32 for float32). Analytic default rtx2080ti; measured: the "
                   "FLOP/s achieved.")
@click.option("--efficiency", type=float, default=None,
              help="Analytic: time every layer flat as FLOPs / (peak x EFFICIENCY) instead of the default roofline "
                   "(per kernel max(FLOPs / (peak x GEMM share by shape), bytes / memory bandwidth) + launch cost, "
                   "with a fixed part per layer; see planner/profiler/roofline.py). A FLOP/s number for "
                   "--device-flops has no bandwidth, so it is timed flat at 0.5 unless given.")
@click.option("--json", "as_json", is_flag=True, help="Print the profile as one JSON document on stdout.")
def profile(model: str, output: str | None, batch_size: int, input_shape: str | None, settings: tuple[str, ...],
            mode: str, device: str, dtype: str, threads: int | None, repeats: int, warmup: int,
            device_flops: str | None, efficiency: float | None, as_json: bool) -> None:
    """Trace MODEL into layers and write per-layer costs (times, FLOPs, bytes) as profile JSON.

    MODEL is a built-in name (mlp, vgg11..vgg19[_bn], resnet18..resnet152, gpt2, gpt2-medium, gpt-j-6b,
    gpt-neo-2.7b, bert-base, llama-tiny, llama2-7b/13b/70b, llama3-8b/70b, mistral-7b, qwen2-7b, qwen3-8b, gemma-7b,
    gemma2-9b, gemma3-1b, olmo2-7b; mixtures of experts mixtral-8x7b, olmoe-1b-7b, qwen3-30b-a3b) or
    package.module:factory returning an nn.Module (a transformers BERT, RoBERTa, XLM-RoBERTa, CamemBERT, ELECTRA,
    DistilBERT, ModernBERT, ViT, DeiT, GPT-2, Llama, Mistral, Qwen2, Qwen3, Gemma, Gemma 2, Gemma 3, OLMo, OLMo 2,
    OLMo 3, EXAONE 4, Ministral, Phi-3, GLM, Arcee, Granite, Cohere, Cohere 2, Phi, Starcoder2, StableLM, Nemotron,
    GPT-NeoX, GPT-BigCode, GPT-Neo, GPT-J, CodeGen, OPT, BLOOM, Falcon, MPT, Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE,
    PhiMoE, DeepSeek V2/V3, gpt-oss, ERNIE 4.5 MoE or GLM-4 MoE model included, and decoders whose forwards are one
    of those Llama-family classes' code) or (module, example_input).
    """
    from planner.cli import emit_json
    from planner.commands import outputs
    from planner.jsonio import dumps
    from planner.outputs import stdout_to_stderr

    _check_numbers(output, as_json, batch_size, threads, repeats, warmup, efficiency, mode)
    shape = parse_shape(input_shape)
    overrides = parse_overrides(settings)
    staged = outputs([output])

    from planner.profiler import load_model, profile_model
    from planner.profiler.idle import Quiet
    from planner.render.profile import print_summary, progress_bar

    _check_device(device_flops, efficiency, dtype, mode)  # a bad value fails before any work
    load_device = "meta" if mode == "analytic" else device
    loaded = load_model(model, batch_size, shape, dtype=dtype, device=load_device, overrides=overrides)
    title = f"profiling {model}" if mode == "measured" else f"counting {model}"
    # no bar under --json; the model's prints must not corrupt --json
    with progress_bar(title, show=not as_json) as update, stdout_to_stderr():
        prof = profile_model(loaded, mode=mode, threads=threads, repeats=repeats, warmup=warmup,
                             device_flops=device_flops, progress=update, efficiency=efficiency)
    doc = prof.to_dict()
    quiet = Quiet.from_meta(prof.meta)
    if quiet is not None and quiet.warning:
        click.echo(f"warning: {quiet.warning}", err=True)
    staged.write_text(output, dumps(doc))
    with contextlib.suppress(Exception):
        print_summary(prof, output)
    if as_json:
        emit_json(doc)
    staged.commit()


def _check_numbers(output: str | None, as_json: bool, batch_size: int, threads: int | None, repeats: int,
                   warmup: int, efficiency: float | None, mode: str) -> None:
    """The options' values, before any work (UsageError with the value and a fix)."""
    if output is None and not as_json:
        raise UsageError("no output file given", "add -o FILE (or --json to print the profile)")
    if not 1 <= batch_size <= MAX_BATCH:
        raise UsageError(f"--batch-size must be from 1 to {MAX_BATCH:,} (the most a profile holds), got {batch_size}",
                         "e.g. --batch-size 32")
    if threads is not None:
        from planner.cores import check_threads

        check_threads(threads, "1 to time as planner calibrate's default devices compute")
    from planner.profiler.core import check_passes

    check_passes(repeats, warmup)
    if efficiency is not None and mode != "analytic":
        raise UsageError("--efficiency applies to --mode analytic only", "drop --efficiency or use --mode analytic")
    if efficiency is not None and not 0 < efficiency <= 1:
        raise UsageError(f"--efficiency must be a share of peak above 0 and at most 1, got {efficiency}",
                         "e.g. --efficiency 0.5")


def _check_device(device_flops: str | None, efficiency: float | None, dtype: str, mode: str) -> None:
    """``--device-flops`` a known GPU or a FLOP/s figure in the profile's bounds; in analytic mode, with
    ``--efficiency``, a rate that times a FLOP within them."""
    from planner.profiler.analytic import check_flat_rate, resolve_device_flops

    flops, _ = resolve_device_flops(device_flops, default=None, dtype=dtype)
    if mode == "analytic":
        check_flat_rate(flops, efficiency)

"""``planner calibrate -o CLUSTER --nproc P``: this machine as a cluster JSON."""

from __future__ import annotations

from typing import Any

import click

from planner import ir
from planner.cli import emit_json
from planner.commands import outputs, progress_option
from planner.engines import CALIBRATED
from planner.errors import UsageError
from planner.jsonio import check_loadable, dumps, read_json
from planner.schemas.build import MAX_NAME


@click.command("calibrate")
@click.option("-o", "--output", "out", required=True, type=click.Path(dir_okay=False), help="Cluster JSON to write.")
@click.option("--nproc", type=click.IntRange(min=2), default=2, show_default=True, help="Processes (devices).")
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True, help="Threads per process.")
@click.option("--name", default=None, help="Cluster name (default calibrated-cpu-PxT).")
@click.option("--match-profile", "profile_path", type=click.Path(dir_okay=False), default=None,
              help="Take this measured profile's device_flops as a process's FLOP/s alone (each device's flops: "
                   "that times its measured speed while all compute).")
@click.option("--engines", "engines_text", default="auto", show_default=True, metavar="LIST",
              help="Engines whose overheads to measure (comma-separated: deepspeed, torch), 'auto' (those "
                   "installed) or 'none' (about 35 s each, torch 45 s).")
@progress_option
@click.option("--json", "as_json", is_flag=True, help="Print the cluster JSON document.")
def calibrate(out: str, nproc: int, threads: int, name: str | None, profile_path: str | None, engines_text: str,
              progress: bool | None, as_json: bool) -> None:
    """Measure compute, point-to-point and all-reduce over gloo with P processes (about 15-20 s), and what
    each engine adds per action, micro-batch and step, and torch per FSDP unit's gather or reduction and per
    tensor-parallel collective (tiny pipelines, data-parallel stages and a tensor group on the --nproc processes)."""
    from planner.calibrate import calibrate as measure
    from planner.calibrate import cluster_doc
    from planner.cores import check_threads
    from planner.outputs import stdout_to_stderr
    from planner.render.progress import status
    from planner.render.text import count

    engines = engine_list(engines_text)
    _check_nproc(nproc)
    check_threads(threads, "one per core, and --nproc for more devices")
    staged = outputs([out], inputs=[profile_path])
    if name is not None and not 0 < len(name) <= MAX_NAME:
        raise UsageError(f"--name is {len(name)} characters long; a cluster's name has 1 to {MAX_NAME}",
                         "give a shorter name, e.g. --name cpu2")
    profile = _matched_profile(profile_path, threads)
    title = f"measuring {count(nproc, 'process')} x {count(threads, 'thread')}: compute, memory, gloo links" + (
        f", engines {', '.join(engines)}" if engines else "")
    # the worker processes inherit file descriptor 1: DeepSpeed's banners must not corrupt --json on stdout
    with status(title, progress, as_json), stdout_to_stderr():
        cluster, meta = measure(nproc, threads, name, profile, engines)
    doc = cluster_doc(cluster, meta)
    check_loadable(doc)
    staged.write_text(out, dumps(doc))
    _report(cluster, meta, out)
    if as_json:
        emit_json(doc)
    staged.commit()


def _check_nproc(nproc: int) -> None:
    """UsageError for more processes than ``planner run`` starts on this machine (four per core): their
    cluster's plans could not run here, and the measurement alone would take many minutes."""
    import os

    cores = os.cpu_count() or 1
    if nproc > 4 * cores:
        raise UsageError(f"--nproc {nproc} is more than the {4 * cores} processes planner run starts on this "
                         f"machine's {cores} cores (four per core)",
                         f"use --nproc {4 * cores} or fewer (about one per core measures times that hold)")


def _matched_profile(path: str | None, threads: int) -> ir.ModelProfile | None:
    """``--match-profile``'s profile, which must have been measured (on this machine's CPU, with ``threads``
    threads where it says how many: its FLOP/s become each process's)."""
    if path is None:
        return None
    profile = ir.ModelProfile.from_dict(read_json(path, "profile"), path)
    if profile.mode != "measured":
        raise UsageError(f"--match-profile {path} is an {profile.mode} profile (for {profile.device}): its FLOP/s "
                         "are not this machine's", "profile the model here: planner profile MODEL --mode measured "
                         "-o PROFILE, then --match-profile PROFILE")
    if not profile.device.lower().startswith("cpu"):
        raise UsageError(f"--match-profile {path} was measured on {profile.device}, not on this machine's CPU: its "
                         f"{profile.device_flops:.3g} FLOP/s are not what a calibrated process computes",
                         "profile the model here on the CPU: planner profile MODEL --mode measured --device cpu "
                         "-o PROFILE, then --match-profile PROFILE")
    measured = profile.meta.get("threads")
    if isinstance(measured, int) and not isinstance(measured, bool) and measured != threads:
        raise UsageError(f"--match-profile {path} was measured with {measured} threads, not the --threads {threads} "
                         "each calibrated process computes with: its FLOP/s are not theirs",
                         f"calibrate with --threads {measured}, or profile the model again with --threads {threads}")
    from planner.profiler.idle import Quiet
    from planner.render.text import plain_text

    quiet = Quiet.from_meta(profile.meta)
    if quiet is not None and quiet.warning:  # its FLOP/s become every device's
        click.echo(f"warning: --match-profile {plain_text(path)}: {quiet.warning}", err=True)
    return profile


def _report(cluster: ir.Cluster, meta: dict[str, Any], out: str) -> None:
    """What was measured, on stderr."""
    link = cluster.link("intra_node")
    click.echo(f"flops {cluster.gpus[0].flops:.3g}/s per device ({meta['flops_source']}), memory "
               f"{meta['memory_bandwidth_Bps'] / 1e9:.1f} GB/s, p2p "
               f"{link.bandwidth_Bps / 1e9:.2f} GB/s, latency {link.latency_s * 1e6:.0f} us, collectives "
               f"{link.allreduce_Bps / 1e9:.2f} GB/s (all-reduce), {link.allgather_Bps / 1e9:.2f} GB/s (all-gather, "
               f"reduce-scatter) bus bandwidth and {link.collective_latency_s * 1e3:.3f} ms a call; each process kept "
               f"{meta['concurrent_share']:.2f} of its speed alone with all computing ({meta['sharing_kernel']}) "
               f"and spent {(meta['handoff_s'] or 0.0) * 1e3:.3f} ms more CPU on each hand-off than on idle cores; "
               f"wrote {out}", err=True)
    for engine, o in cluster.engine_overheads:
        unit = "FSDP unit's gather or reduction" if engine == "torch" else "layer's ZeRO-1 reduction or gather"
        shard = f", {o.per_shard_s * 1e3:.3f} ms per {unit}" if o.per_shard_s else ""
        shard += f", {o.per_collective_s * 1e3:.3f} ms per tensor group's collective" if o.per_collective_s else ""
        click.echo(f"{engine}: {o.per_action_s * 1e3:.3f} ms per action, {o.per_microbatch_s * 1e3:.3f} ms per "
                   f"micro-batch sent, {o.per_step_s * 1e3:.3f} ms per step{shard}", err=True)
    for warning in busy_warnings(meta):
        click.echo(f"warning: {warning}", err=True)


def busy_warnings(meta: dict[str, Any]) -> list[str]:
    """One line per engine whose timed rounds other work spoiled (``engine_runs``' ``busy_rounds``)."""
    out = []
    for engine, rows in meta.get("engine_runs", {}).get("runs", {}).items():
        busy = sum(int(row.get("busy_rounds", 0)) for row in rows)
        if busy:
            out.append(f"{engine}: other work used the cores during {busy} of its timed rounds, which then stopped "
                       "waiting for an idle machine: its overheads may be high; run calibrate again on an idle "
                       "machine")
    return out




def engine_list(text: str) -> list[str]:
    """``--engines``: the engines named (each once, in order), none for ``none`` or an empty list,
    those installed for ``auto``."""
    word = text.strip().lower()
    if word == "auto":
        import importlib.util

        return [e for e in CALIBRATED if importlib.util.find_spec(e) is not None]
    names = [] if word == "none" else [t.strip().lower() for t in text.split(",") if t.strip()]
    if "none" in names or "auto" in names:
        raise click.BadParameter(f"{text!r} lists 'none' or 'auto' beside engines; give one of them alone, or "
                                 f"engines from {', '.join(CALIBRATED)}", param_hint="--engines")
    bad = [n for n in names if n not in CALIBRATED]
    if bad:
        raise click.BadParameter(f"unknown engine {bad[0]!r}; use {', '.join(CALIBRATED)} or none",
                                 param_hint="--engines")
    return list(dict.fromkeys(names))

"""``planner calibrate -o CLUSTER --nproc P``: this machine as a cluster JSON."""

from __future__ import annotations

import click

from planner import ir
from planner.cli import emit_json
from planner.commands import outputs
from planner.jsonio import dumps, read_json


@click.command("calibrate")
@click.option("-o", "--output", "out", required=True, type=click.Path(dir_okay=False), help="Cluster JSON to write.")
@click.option("--nproc", type=click.IntRange(min=2), default=2, show_default=True, help="Processes (devices).")
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True, help="Threads per process.")
@click.option("--name", default=None, help="Cluster name (default calibrated-cpu-PxT).")
@click.option("--match-profile", "profile_path", type=click.Path(dir_okay=False), default=None,
              help="Use this measured profile's device_flops as each device's flops (scale 1).")
@click.option("--json", "as_json", is_flag=True, help="Print the cluster JSON document.")
def calibrate(out: str, nproc: int, threads: int, name: str | None, profile_path: str | None, as_json: bool) -> None:
    """Measure compute, point-to-point and all-reduce over gloo with P processes."""
    from planner.calibrate import calibrate as measure
    from planner.calibrate import cluster_doc

    staged = outputs([out])
    profile = ir.ModelProfile.from_dict(read_json(profile_path, "profile"), profile_path) if profile_path else None
    click.echo(f"measuring {nproc} processes x {threads} threads...", err=True)
    cluster, meta = measure(nproc, threads, name, profile)
    doc = cluster_doc(cluster, meta)
    staged.write_text(out, dumps(doc))
    link = cluster.link("intra_node")
    click.echo(f"flops {cluster.gpus[0].flops:.3g}/s per device ({meta['flops_source']}), memory "
               f"{meta['memory_bandwidth_Bps'] / 1e9:.1f} GB/s, p2p "
               f"{link.bandwidth_Bps / 1e9:.2f} GB/s, latency {link.latency_s * 1e6:.0f} us, all-reduce "
               f"{meta['allreduce_s'] * 1e3:.2f} ms for {meta['allreduce_bytes'] / 2**20:.0f} MiB; wrote {out}",
               err=True)
    if as_json:
        emit_json(doc)
    staged.commit()

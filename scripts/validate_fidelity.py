#!/usr/bin/env python
"""Does a plan run for real where the planner said it would? (issue 15's figures)

Fidelity: models (a CNN, a residual CNN, a GPT-2-style and a Llama-style decoder, small, built
from transformers configs, no download: ``scripts/fidelity_models.py``) x engines (DeepSpeed,
torch pipelining) x plans (1, 2 and 4 processes of 1 thread, 1 to 8 micro-batches, 1F1B, a
pipeline stage per process): measured/predicted, the median over ``--repeats`` rounds, target
0.9..1.1. The machine's load average is printed before and after, and per row the cores other
work used during its rounds.

Predicted comes only from the planner: ``profile_model`` (measured, 1 thread, 25 repeats, on
an idle machine: profiled again while other work took cores; once per (model, engine, world
size), right before that group's plans are timed: this VM's own speed moved by 20-25% within
20 minutes with nothing else running (much of it glibc's malloc state, which planner.heap now fixes in every
process that times or runs: docs/fidelity.md, "2026-11-29, 21:10"), a profile taken once per model was minutes
older than most of its rows, and two such profiles of GPT-2 hours apart predicted the same step 24%
apart while the step measured the same), ``planner.calibrate.calibrate``
(2 and 4 processes x 1 thread; flops from the profile as ``--match-profile`` does, times the
core share: cores / processes when processes outnumber cores, times the sharing efficiency
measured on the profile's own model as ``calibrate --match-profile`` does, but at each
plan's micro-batch, and so is the node's hand-off cost (:mod:`planner.calibrate_sharing`), with the node's
``concurrent_devices`` so that the simulator shares the cores among the stages computing;
engine overheads measured by ``--engines`` on each cluster's own processes, the 2-process ones
for one process), ``search`` with ``--engine`` (so the plan pays its engine's overheads) and
``simulate``. ``bare`` is the same plan's prediction without engine overheads (the node's
hand-off cost stays: it is the machine's, whatever the engine).

Measured: every plan of one (model, engine, world size) is trained in one process group by the
runner's own code (:func:`planner.runner.worker.train_plan`: the engines' trainers, steps
between barriers, the slowest rank; :func:`planner.calibrate_engines.time_plans`), each plan
``--repeats`` times in turn; a round's time is the median of its steps after warm-up. The
model's single-process forward+backward, timed before and after the group's profile
(:func:`speed_probe`) and by rank 0 after every round while the other ranks wait
(``time_plans(probe=True)``), says how far the machine's own speed moved between the profile
and each round (``speed``: the rounds' probes over the profile's). ``at_prof`` is measured over
predicted with each round taken at the profile's speed (its time times the profile's probe over
its own): what the ratio would have been on a machine that kept its speed, a diagnosis printed
beside the target's ratio, not in its place. A group in which a row's speed moved by more than
:data:`DRIFT` is measured again, profile and all (up to
``--group-attempts``, 3, in all; the steadiest attempt is shown, ``tries`` says which): on this
VM the speed moved by up to 35% within a group's minute with nothing else running, and such a
row measures the machine, not the model (2026-11-26: 18 of the 23 rows outside the target, in a
run without this). ``spread``: a row's slowest round over its fastest (identical plans timed in
one group differed by up to 19%). Each round waits for an idle machine and is timed again (3
attempts) while other work took more than 0.3 cores during it, until two rounds of a group were spoiled so
(``planner.calibrate_engines.BUSY_ROUNDS``: a machine busy for good; the ``other`` column shows it): this machine is
shared, and one other busy process on its 2 cores made 2-process pipelines 1.4 to 2.1 times slower (their own
CPU time unchanged).

Quality: on a VGG-like model (compute in the convolutions, parameters in the classifier),
DeepSpeed, 2 stages, M=4: the planner's plan measured against DeepSpeed's default
``partition_method='parameters'`` split and against every 2-stage split measured (target:
faster than ``parameters``, within 10% of the best). Every split is measured once, then the
planner's split, the best of them and ``parameters`` again, head to head over twice the rounds: the
least of a dozen noisy times is biased low (the same split measured 19% apart in two rounds), and the
targets are judged on the head-to-head rounds.

Published: the second table, large-scale runs as their papers report them, written as plans
and predicted (scripts/bench_published.py: Megatron-LM SC'21 Table 1, BLOOM-176B, Korthikanti et al. 2022's
runs with full and with selective recomputation and sequence parallelism, MT-NLG 530B's three runs,
outside the target; layers timed by the
roofline at each row's tensor degree, one fitted constant: planner.gpus.SUSTAINED), target
predicted/published TFLOP/s per GPU within 0.85..1.15, also through planner profile's own analytic
profile; then torchtitan's published FSDP runs of Llama 2 and 3 on 64 A100s through planner profile's
analytic profile of the transformers model (scripts/published_fsdp.py), predicted/published tokens per
second per GPU, MosaicML's MPT runs on A100s and H100s the same way (scripts/published_mpt.py; the H100's
share, planner.gpus.SUSTAINED_H100, fitted on its 8-GPU H100 rows), Megatron-LM v1.0's GPT-2 runs on V100s
(scripts/published_v100.py, held out), and torchtitan's eager FSDP Llama 3.1 8B on
H100s against the bracket of full and no recomputation (scripts/published_h100_fsdp.py); last, the saved GPU
runs (docs/gpu) predicted again, iteration and peak memory
(scripts/gpu_replay.py); about 70 s. Usage::

    .venv/bin/python scripts/validate_fidelity.py [--models cnn,rescnn,gpt2,llama] [--engines deepspeed,torch]
        [--plans 1x1,1x4,2x2,2x8,4x4,4x8] [--repeats 3] [--steps 6] [--group-attempts 3] [--no-quality] [--quality-only]
        [--no-published] [--published-only]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from fidelity_models import MODELS, spec  # noqa: E402 (after the path set-up)
from fidelity_table import DRIFT, Row, Timed, print_fidelity  # noqa: E402

from planner.errors import PlannerError  # noqa: E402

# ----------------------------------------------------------------------------- steps


def profile(name: str, repeats: int = 25) -> Any:
    """``planner profile`` of the model at its batch, measured at --threads 1 (``repeats``): its timed passes wait
    for an idle machine and are timed again while other work took cores meanwhile, as every CPU profile's are
    (planner.profiler.idle; a layer's wall time counts the time it waited for a core). 25 repeats, not 9: four
    GPT-2 profiles in a row on the idle machine gave whole-model times 0.224-0.258 s and fixed parts (every
    micro-batch pays them) 0.6-11 ms at 9 repeats; 0.250-0.256 s and 3.6-8.3 ms at 25."""
    from planner.profiler import profile_model
    from planner.profiler.idle import Quiet
    from planner.profiler.loader import load_model

    torch.manual_seed(0)
    prof = profile_model(load_model(spec(name), MODELS[name][1]), mode="measured", threads=1, repeats=repeats)
    quiet = Quiet.from_meta(prof.meta)
    if quiet is not None:
        print(f"  profiled {name}: other work {quiet.background_cores or 0.0:.2f} cores", file=sys.stderr)
    return prof


def speed_probe(name: str) -> float:
    """Seconds of the model's whole forward+backward at its batch on 1 thread, now (the rounds' own
    probe, :func:`planner.calibrate_engines.speed_probe`, with 5 passes): taken before and after each
    group's profile, the machine's speed at the profile (module doc)."""
    from planner.calibrate_engines import speed_probe as probe

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        return probe(spec(name), MODELS[name][1], repeats=5)()
    finally:
        torch.set_num_threads(old)


def clusters(engines: list[str]) -> dict[int, Any]:
    """This machine as 2 and as 4 processes of 1 thread, each with its engine overheads measured on
    its own processes; one process uses the 2-process overheads."""
    from planner.calibrate import calibrate

    two, meta = calibrate(2, 1, engines=engines)
    four, meta4 = calibrate(4, 1, engines=engines)
    print(f"  calibrated: p2p {meta['bandwidth_Bps'] / 1e9:.2f} GB/s, latency {meta['latency_s'] * 1e6:.0f} us; "
          f"core share 2 processes {meta['core_share']:.2f}, 4 processes {meta4['core_share']:.2f} (all computing "
          f"at once measured {meta['concurrent_share']:.2f} and {meta4['concurrent_share']:.2f} of one alone; "
          f"sharing efficiency on 4: {meta4['sharing_efficiency'] or 1:.3f})", file=sys.stderr)
    for nproc, cluster in ((2, two), (4, four)):
        for engine, o in cluster.engine_overheads:
            print(f"  {engine} on {nproc}: per action {o.per_action_s * 1e3:.3f} ms, per micro-batch sent "
                  f"{o.per_microbatch_s * 1e3:.3f} ms, per step {o.per_step_s * 1e3:.3f} ms, per FSDP unit's "
                  f"collective {o.per_shard_s * 1e3:.3f} ms", file=sys.stderr)
    return {1: two, 2: two, 4: four}


def matched(cluster: Any, prof: Any, world: int, microbatches: int) -> Any:
    """``--match-profile``: every device's flops the profile's, times what a device of ``world``
    processes computing at once keeps of it (:meth:`planner.ir.Node.speed`), with the sharing
    efficiency measured on the profile's own model at the plan's micro-batch (module doc; one
    process: nothing of ours computes beside it, so nothing shared)."""
    from planner.calibrate_sharing import SharingModel, measure_sharing

    nodes = []
    for n in cluster.nodes:
        n = dataclasses.replace(n, sharing_efficiency=None, handoff_s=None)
        if world > 1:
            n = measure_sharing(world, 1, SharingModel(prof.model, prof.batch_size // microbatches)).on(n)
        flops = prof.device_flops * n.speed(world)
        nodes.append(dataclasses.replace(n, gpus=tuple(dataclasses.replace(g, flops=flops, peak_flops=())
                                                       for g in n.gpus)))
        print(f"  {prof.model} on {world} at M={microbatches}: sharing efficiency {n.sharing_efficiency or 1:.3f}, "
              f"hand-off {(n.handoff_s or 0) * 1e3:.3f} ms", file=sys.stderr)
    return dataclasses.replace(cluster, nodes=tuple(nodes))


def plan_for(prof: Any, cluster: Any, world: int, m: int, engine: str, config: tuple[int, ...] | None = None) -> Any:
    from planner.search import search

    shape = config or (1,) * world
    return search(prof, cluster, microbatches=m, schedule="1f1b", optimizer="sgd", engine=engine, config=shape)


def bare(plan: Any) -> float:
    """The plan's simulated iteration without engine overheads (the node's hand-off cost stays)."""
    from planner.simulate import simulate

    return float(simulate(dataclasses.replace(plan, engine="any")).iteration_s)


def timed(plans: list[Any], name: str, engine: str, steps: int, repeats: int,
          probe: bool = False) -> tuple[list[Timed], float | None]:
    """Each plan's rounds (plans of one world size, one process group; :class:`Timed`), with rank 0's
    speed probe after every round when ``probe``, and the probe taken last (None without)."""
    from planner.calibrate_engines import time_plans

    got = time_plans(plans, engine, 1, steps, repeats, model=spec(name), probe=probe)
    return ([Timed(t, statistics.median(b), p)
             for t, b, p in zip(got.times_s, got.background_cores, got.probe_s, strict=True)], got.last_probe_s)


def parse_plans(text: str) -> list[tuple[int, int]]:
    return [(int(p), int(m)) for p, m in (x.split("x") for x in text.split(",") if x)]


def group(name: str, engine: str, world: int, args: argparse.Namespace, cl: dict[int, Any]) -> list[Row]:
    """The rows of one (model, engine, world size), measured again (``--group-attempts`` in all)
    while the machine's own speed during a row's rounds differed by more than :data:`DRIFT` from
    its speed at the profile: such rows measure the machine, not the model (module doc); the
    steadiest attempt's. An attempt that fails (a worker lost) is measured again, once more than asked if need be.
    """
    attempts: list[list[Row]] = []

    def moved(rows: list[Row]) -> float:
        return max(abs(r.drift - 1) for r in rows)

    failures: list[PlannerError] = []
    for attempt in range(1, max(2, args.group_attempts) + 1):
        try:
            attempts.append(group_once(name, engine, world, args, cl, attempt))
        except PlannerError as exc:  # a worker lost (2026-11-28: SIGABRT measuring shared cores): measure again
            print(f"  {name} {engine} P={world}: attempt {attempt} failed: {exc.cause}", file=sys.stderr)
            failures.append(exc)
            continue
        if moved(attempts[-1]) <= DRIFT or attempt >= args.group_attempts:
            break
    if not attempts:
        raise failures[-1]
    return min(attempts, key=moved)


def group_once(name: str, engine: str, world: int, args: argparse.Namespace, cl: dict[int, Any],
               attempt: int) -> list[Row]:
    """One attempt: profiled right before its plans are timed (module doc), the machine's speed
    probed here before and after the profile and after the rounds, and in the workers after every
    round. A probe in the workers ran 5-20% slower than one here with the machine's speed unchanged
    (1-process rows on target), so the workers' probes are compared only with their own last, and
    that with the probe here right after it."""
    before = speed_probe(name)
    prof = profile(name)
    at_profile = (before + speed_probe(name)) / 2
    plans = [plan_for(prof, matched(cl[world], prof, world, m), world, m, engine)
             for p, m in parse_plans(args.plans) if p == world]
    got, last_s = timed(plans, name, engine, args.steps, args.repeats, probe=True)
    if last_s is None:
        raise RuntimeError(f"{name} on {engine}: the workers took no speed probe after their rounds")
    scale_s = at_profile * last_s / speed_probe(name)  # the profile's probe in the workers' units
    rows = []
    for plan, g in zip(plans, got, strict=True):
        row = Row(name, engine, world, plan.microbatches, plan.predicted.iteration_s, bare(plan), g.measured_s,
                  g.at_profile_s(scale_s), g.background, g.speed(scale_s), g.spread, attempt)
        rows.append(row)
        print(f"  {name} {engine} P={world} M={plan.microbatches}: predicted {row.predicted_s:.4f} measured "
              f"{row.measured_s:.4f} ratio {row.ratio:.3f}, at the profile's speed {row.at_profile_ratio:.3f} (other "
              f"work {row.background:.2f} cores, machine speed {row.drift:.3f} of the profile's, rounds spread "
              f"{row.spread:.2f}, attempt {attempt})", file=sys.stderr)
    return rows


def fidelity(args: argparse.Namespace, cl: dict[int, Any]) -> list[Row]:
    worlds = sorted({p for p, _ in parse_plans(args.plans)})
    return [row for name in args.models.split(",") for engine in args.engines.split(",") for world in worlds
            for row in group(name, engine, world, args, cl)]


def quality(args: argparse.Namespace, cl: dict[int, Any]) -> None:
    """The planner's VGG-like plan vs DeepSpeed's 'parameters' split vs every 2-stage split, measured."""
    from deepspeed.runtime import utils as ds_utils

    prof = profile("vgg")
    ours = plan_for(prof, matched(cl[2], prof, 2, 4), 2, 4, "deepspeed")
    n = len(prof.layers)
    counts = [layer.param_count for layer in prof.layers]
    parts = [int(p) for p in ds_utils.partition_balanced(weights=counts, num_parts=2)]
    splits = list(range(1, n))

    def split_plan(cut: int) -> Any:
        stages = (dataclasses.replace(ours.stages[0], layers=(0, cut), forms=("dp",) * cut),
                  dataclasses.replace(ours.stages[1], layers=(cut, n), forms=("dp",) * (n - cut)))
        return dataclasses.replace(ours, stages=stages)

    plans = [ours, *(split_plan(c) for c in splits)]
    times = [t.measured_s for t in timed(plans, "vgg", "deepspeed", args.steps, args.repeats)[0]]
    every = dict(zip(splits, times[1:], strict=True))
    cut, best_cut = ours.stages[1].layers[0], min(every, key=lambda c: every[c])
    print(f"\nquality (VGG-like, DeepSpeed, 2 stages, M=4, median of {args.repeats} rounds; load "
          f"{os.getloadavg()[0]:.1f}): every split (first layer of stage 1: s/it) "
          + ", ".join(f"{c}: {t:.4f}" for c, t in every.items()) + f"; the planner's plan {times[0]:.4f}")
    # The sweep's least time is the least of many noisy ones (the same plan measured up to 19% apart in
    # two rounds): the planner's split, the sweep's best and 'parameters' are timed again head to head,
    # each round running all three in turn, and compared on those rounds alone.
    final = sorted({cut, best_cut, parts[1]})
    rivals = [ours if c == cut else split_plan(c) for c in final]
    again = timed(rivals, "vgg", "deepspeed", args.steps, 2 * args.repeats)[0]
    head = {c: t.measured_s for c, t in zip(final, again, strict=True)}
    mine, theirs = head[cut], head[parts[1]]
    best_cut = min(head, key=lambda c: head[c])
    print(f"  head to head, median of {2 * args.repeats} rounds: planner split at {cut}: {mine:.4f} s/it (predicted "
          f"{ours.predicted.iteration_s:.4f}); DeepSpeed 'parameters' split at {parts[1]}: {theirs:.4f} s/it; "
          f"best split at {best_cut}: {head[best_cut]:.4f} s/it")
    faster, near = mine < theirs, mine <= 1.1 * head[best_cut]
    print(f"  planner {theirs / mine:.2f}x 'parameters' (target > 1: {'PASS' if faster else 'FAIL'}), "
          f"{mine / head[best_cut]:.3f} of the best (target <= 1.10: {'PASS' if near else 'FAIL'})")


def print_published() -> None:
    """The second table (module doc): every published run's fit and predicted/published throughput."""
    from bench_published import FIT_ROWS, ROWS, profiler_fidelity, published_fidelity
    from published_fsdp import TARGET as PUBLISHED_TARGET

    from planner.gpus import SUSTAINED

    print("\npublished runs written as plans (predicted/published TFLOP/s per GPU, target "
          f"{PUBLISHED_TARGET[0]}..{PUBLISHED_TARGET[1]}):")
    inside = 0
    for row in ROWS:
        _, _, judged, ratio = published_fidelity(row)
        via = profiler_fidelity(row)[3]
        ok = PUBLISHED_TARGET[0] <= ratio <= PUBLISHED_TARGET[1]
        inside += ok
        sp = " + sequence parallel" if row.sequence_parallel else ""
        chunks = f" interleaved x {row.virtual_stages}" if row.virtual_stages > 1 else ""
        print(f"  {row.name:17} {row.gpus:>5} A100s t={row.t} p={row.p}{chunks} micro-batch {row.micro_batch} "
              f"ZeRO {row.zero}, "
              f"{row.recompute} recomputation{sp}: "
              f"fits {judged.fits!s:5} predicted/published {ratio:.2f} {'fit' if row in FIT_ROWS else 'held out'}"
              f"{'' if ok else '  (outside)'}; via planner profile {via:.2f}")
    print(f"  {inside} of {len(ROWS)} inside; sustained share {SUSTAINED} fitted on the 'fit' rows; 'via planner "
          "profile': the same plan over planner profile's analytic profile of a GPT-2 of the row's widths")
    print_fsdp()
    print_gpu()


def print_fsdp() -> None:
    """torchtitan's published FSDP runs of Llama on 64 A100s, held out (scripts/published_fsdp.py), and on H100s,
    bracketed (scripts/published_h100_fsdp.py)."""
    from published_fsdp import report
    from published_h100_fsdp import lines

    report()
    import published_mpt

    print("  MosaicML's MPT runs on A100s and H100s (scripts/published_mpt.py; the H100's share fitted on 'fit' rows)")
    for line in published_mpt.lines():
        print(line, flush=True)
    import published_v100

    print("  Megatron-LM v1.0 on DGX-2H V100s (scripts/published_v100.py; held out, the A100's share)")
    for line in published_v100.lines():
        print(line, flush=True)
    print("  torchtitan's eager FSDP Llama 3.1 8B on H100s (scripts/published_h100_fsdp.py; per-op checkpointing, "
          "the GPU's peak unknown): the published throughput against the bracket of full and no recomputation")
    for line in lines():
        print(line, flush=True)


def print_gpu() -> None:
    """The saved GPU runs (docs/gpu: an H200) predicted again by the cost model as it is (scripts/gpu_replay.py)."""
    import gpu_replay

    print(f"\nsaved GPU runs predicted again ({gpu_replay.DEFAULT.relative_to(ROOT)}, scripts/gpu_replay.py):")
    print(gpu_replay.report_under(gpu_replay.DEFAULT) or "  none saved")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--group-attempts", type=int, default=3,
                    help="measure a (model, engine, world size) again while the machine's speed moved (module doc)")
    ap.add_argument("--models", default="cnn,rescnn,gpt2,llama")
    ap.add_argument("--engines", default="deepspeed,torch")
    ap.add_argument("--plans", default="1x1,1x4,2x2,2x8,4x4,4x8", help="PROCESSESxMICROBATCHES, comma-separated")
    ap.add_argument("--no-quality", action="store_true")
    ap.add_argument("--quality-only", action="store_true")
    ap.add_argument("--no-published", action="store_true")
    ap.add_argument("--published-only", action="store_true")
    args = ap.parse_args()
    if args.published_only:
        print_published()
        return
    os.chdir(ROOT)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "scripts"), *filter(None, [os.environ.get("PYTHONPATH")])])
    t0 = time.perf_counter()
    load = os.getloadavg()
    print(f"load average at start {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} cores", file=sys.stderr)
    cl = clusters(args.engines.split(","))
    if not args.quality_only:
        print_fidelity(fidelity(args, cl), load, args)
    if not args.no_quality:
        quality(args, cl)
    if not args.no_published:
        print_published()
    print(f"\n(total {time.perf_counter() - t0:.0f} s, load average now {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()

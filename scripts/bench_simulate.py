#!/usr/bin/env python
"""Time the simulator on 64 stages x 256 micro-batches (target: under 2 s on this machine).

Every schedule is timed on the same synthetic pipeline: 64 device groups in 8 servers,
activations crossing a link at every stage boundary (the inter-server ones sharing one
link id per server pair), a gradient all-reduce per stage. The time includes building and
validating the schedule, the event-driven run, and recording every event (for the trace
and the picture); the best of ``--repeats`` runs is reported, with its ratio to the target,
and the process CPU seconds of that run beside it (the machine is shared: wall time well
above CPU time means waiting for a core, not work). ``pipedream`` plays iterations back to
back to find its steady state: its schedule covers 4 x 256 micro-batches, and the run stops
once the 2 measured iterations have ended (3 x 256; see planner.simulate).

    .venv/bin/python scripts/bench_simulate.py [--stages 64] [--microbatches 256] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner import ir
from planner.schedule import SCHEDULES
from planner.simulate import SimOptions, simulate_costs

TARGET_S = 2.0
INTRA = ir.Link(1.25e9, 1e-5)
INTER = ir.Link(1.25e8, 5e-5)


def pipeline(k: int, v: int = 1, per_server: int = 8) -> list[ir.StageCost]:
    """K*v chunks of slightly uneven cost on K devices, per_server devices per server."""
    costs = []
    for c in range(k * v):
        dev = c % k
        nxt = (c + 1) % k
        inter = dev // per_server != nxt // per_server
        link = INTER if inter else INTRA
        link_id = f"s{dev // per_server}-s{nxt // per_server}" if inter else f"s{dev // per_server}.g{dev}-g{nxt}"
        scale = (1.0 + 0.1 * (c % 3)) / v
        costs.append(ir.StageCost(
            devices=(f"s{dev // per_server}.g{dev % per_server}",), forward_s=0.010 * scale, backward_s=0.020 * scale,
            backward_weight_s=0.008 * scale, send_bytes=2e6, send_link=link, send_link_id=link_id,
            allreduce_s=0.005, allreduce_bytes=5e7, static_bytes=10**9, weight_bytes=3 * 10**8,
            activation_bytes=10**7, workspace_bytes=10**6, capacity_bytes=11 * 10**9))
    return costs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    k, m = args.stages, args.microbatches
    print(f"simulator speed: {k} stages x {m} micro-batches, best of {args.repeats} (target {TARGET_S:.1f} s)")
    print(f"{'schedule':<15} {'seconds':>8} {'cpu_s':>7} {'/target':>8} {'events':>8} {'iteration_s':>12} "
          f"{'bubble':>7}")
    worst = 0.0
    for name in SCHEDULES:
        v = 2 if name == "interleaved" else 1
        costs = pipeline(k, v)
        best, best_cpu = float("inf"), float("inf")
        result = None
        for _ in range(args.repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            result = simulate_costs(costs, name, m, v, SimOptions())
            wall = time.perf_counter() - t0
            if wall < best:
                best, best_cpu = wall, time.process_time() - c0
        assert result is not None
        label = name + (f" v={v}" if v > 1 else "")
        print(f"{label:<15} {best:8.3f} {best_cpu:7.3f} {best / TARGET_S:8.2f} {len(result.events):8d} "
              f"{result.iteration_s:12.4f} {result.bubble_fraction:7.1%}")
        worst = max(worst, best)
    print(f"slowest schedule: {worst:.3f} s = {worst / TARGET_S:.2f} of the {TARGET_S:.0f} s target "
          f"({'met' if worst < TARGET_S else 'MISSED'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

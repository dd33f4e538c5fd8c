"""What a finished run measured: work per lane, the steady-state window, the result (pure).

Owns the definitions of :mod:`planner.simulate`'s ``iteration_s``, ``busy_s`` and
``bubble_fraction`` over an :class:`planner.simulate.engine.Engine` that has run.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.simulate.engine import Engine
from planner.simulate.events import BY_START_TRACK
from planner.simulate.result import DeviceResult, SimResult


def lane_work(run: Engine, lane: int, *, played: bool = True) -> tuple[float, float]:
    """The lane's compute and busy time (compute, blocking all-reduce, optimizer steps) per iteration:
    its compute as played (on shared cores, at the rates it ran; ``Engine.compute_rate``), or with
    ``played=False`` its nominal (cost model) seconds."""
    chunks = range(lane, run.n_chunks, run.k)
    compute = run.m * sum(run.fwd[c] + run.bwd[c] + run.wgt[c] for c in chunks)
    if played:
        compute /= run.compute_rate(lane)
    ar = 0.0 if run.opts.overlap_allreduce else sum(run.costs[c].allreduce_s for c in chunks)
    return compute, compute + ar + sum(run.costs[c].optimizer_step_s for c in chunks)


def lane_allreduce(run: Engine, lane: int) -> float:
    """The all-reduce seconds per iteration in the lane's busy time: its chunks' whole all-reduce when it
    blocks after the last backward; under ``overlap_allreduce`` only what the compute does not hide: the
    time the lane waits for its own reduction before its optimizer step, and, in a flushing run, the
    reduction's tail after the lane's last action (per measured iteration where several are played)."""
    chunks = range(lane, run.n_chunks, run.k)
    if not run.opts.overlap_allreduce:
        return sum(run.costs[c].allreduce_s for c in chunks)
    waits = run.ar_wait[lane]
    blocks, settle = run.sched.blocks, run.settle
    if run.sched.flushes or settle < 1 or blocks <= 2 * settle:
        return sum(waits) + max(0.0, run.comm_free[lane] - run.lane_end[lane])
    measured = blocks - 2 * settle
    return sum(waits[settle:settle + measured]) / measured


def steady_bound(run: Engine) -> float:
    """No steady state is faster than its busiest resource: a lane's work, one flow's
    transfers (in order), or a link's transfers (its bandwidth shared), per iteration."""
    busiest_lane = max(lane_work(run, lane, played=False)[1] / run.cores.fastest_rate(lane) for lane in range(run.k))
    return max(busiest_lane, run.net.busiest_s(run.m))


def steady_period(steps: Sequence[float]) -> int | None:
    """The smallest period p of the iteration times ``steps`` seen at least twice over (``steps[j] ==
    steps[j + p]`` for every j, to 1e-9 of the longest, and p at most half of them), or None.

    A pipeline without flush settles into a periodic regime, whose period need not be one iteration
    (a timed event graph's cyclicity: 5 stages at M = 1 can take 2, 4, 4, 2, 4, 4, ... s; tests/test_simulate.py),
    so only a
    whole number of periods measures its time per iteration (the mean over them)."""
    tol = 1e-9 * max(max(steps, default=0.0), 1e-300)
    for p in range(1, len(steps) // 2 + 1):
        if all(abs(steps[j] - steps[j + p]) <= tol for j in range(len(steps) - p)):
            return p
    return None


def measure(run: Engine, makespan: float) -> tuple[tuple[float, float], float, bool]:
    """The measured window, the time per iteration, and whether the measured iterations repeat with a period
    (:func:`steady_period`; a flushing schedule: the whole run, once). The window is the last whole number of
    periods of the measured iterations (all of them when they show none)."""
    settle, blocks, block_end = run.settle, run.sched.blocks, run.block_end
    if run.sched.flushes or settle < 1 or blocks <= 2 * settle:
        return (0.0, makespan), makespan, True
    measured = blocks - 2 * settle
    last = settle - 1 + measured
    steps = [block_end[settle + j] - block_end[settle + j - 1] for j in range(measured)]
    period = steady_period(steps)
    stable = period is not None
    n = measured - measured % period if period is not None else measured
    window = (block_end[last - n], block_end[last])
    iteration = (window[1] - window[0]) / n
    bound = steady_bound(run)
    if iteration < bound:
        iteration = bound
    return window, iteration, stable


def device_results(run: Engine) -> tuple[list[DeviceResult], float]:
    """Every device's result (work per iteration of M micro-batches, memory), and the total busy time."""
    devices: list[DeviceResult] = []
    total_busy = 0.0
    memory = run.memory
    for lane in range(run.k):
        compute, lane_busy = lane_work(run, lane)
        allreduce = lane_allreduce(run, lane)
        if run.opts.overlap_allreduce:  # lane_work leaves the overlapped reduction out; its exposed part is busy
            lane_busy += allreduce
        total_busy += lane_busy
        cap = min((run.costs[c].capacity_bytes for c in range(lane, run.n_chunks, run.k)), default=0)
        for dev in run.lanes_devices[lane]:
            devices.append(DeviceResult(dev, lane, lane_busy, compute, memory.peak[lane],
                                        memory.peak_in_flight[lane], cap, tuple(memory.timeline[lane]), allreduce))
    return devices, total_busy


def result(run: Engine) -> tuple[SimResult, bool]:
    """The SimResult of the run, and whether its measured iterations took equal times."""
    # block_end: a run without flush stops at its last measured action, before the all-reduce and optimizer step
    # that end its last measured iteration (already known) are played
    makespan = max([run.now, *run.lane_end, *run.comm_free, *run.block_end])
    window, iteration, stable = measure(run, makespan)
    devices, total_busy = device_results(run)
    bubble = 1.0 - total_busy / (run.k * iteration) if iteration > 0 else 0.0
    bubble = min(max(bubble, 0.0), 1.0)
    if run.record:
        run.events.sort(key=BY_START_TRACK)
    return SimResult(
        schedule=run.sched.name, stages=run.k, microbatches=run.m, virtual_stages=run.v, iteration_s=iteration,
        bubble_fraction=bubble, makespan_s=makespan, window=window, devices=tuple(devices),
        lanes=tuple(run.lanes_devices), links=tuple(run.net.names), events=tuple(run.events),
        actions=tuple(tuple(r) for r in run.texts),
    ), stable

"""The simulator: closed forms, an independent reference, link sharing, all-reduce, memory, plans."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from planner import ir
from planner.errors import PlanError, ScheduleError
from planner.schedule import SCHEDULES, in_flight_microbatches, make_schedule
from planner.simulate import SimOptions, SimResult, simulate_costs
from tests.conftest import make_cluster_dict, make_profile_dict
from tests.test_validate import make_plan

REL = 1e-9


def cost(dev: str | tuple[str, ...], tf: float = 1.0, tb: float = 2.0, tw: float = 0.0, *,
         link: ir.Link | None = None, nbytes: float = 0.0, link_id: str | None = None, ar: float = 0.0,
         ar_bytes: float = 0.0, static: int = 0, weight: int = 0, act: int = 1, workspace: int = 0,
         capacity: int = 10**12) -> ir.StageCost:
    devices = (dev,) if isinstance(dev, str) else dev
    return ir.StageCost(devices=devices, forward_s=tf, backward_s=tb, backward_weight_s=tw, send_bytes=nbytes,
                        send_link=link, send_link_id=link_id, allreduce_s=ar, allreduce_bytes=ar_bytes,
                        static_bytes=static, weight_bytes=weight, activation_bytes=act, workspace_bytes=workspace,
                        capacity_bytes=capacity)


def uniform(k: int, tf: float = 1.0, tb: float = 2.0, tw: float = 0.0, v: int = 1) -> list[ir.StageCost]:
    return [cost(f"g{c % k}", tf / v, tb / v, tw / v) for c in range(k * v)]


def close(a: float, b: float, rel: float = REL) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


# ----------------------------------------------------------------------------- closed forms

times = st.floats(0.01, 10.0, allow_nan=False)


@given(st.integers(1, 10), st.integers(1, 40), times, times, st.sampled_from(["gpipe", "1f1b"]))
def test_gpipe_and_1f1b_closed_form(k: int, m: int, tf: float, tb: float, name: str) -> None:
    r = simulate_costs(uniform(k, tf, tb), name, m)
    assert close(r.iteration_s, (m + k - 1) * (tf + tb))
    assert close(r.bubble_fraction, (k - 1) / (m + k - 1))
    for d in r.devices:
        assert close(d.busy_s, m * (tf + tb))


@given(st.integers(1, 10), st.integers(1, 40))
def test_peak_in_flight_gpipe_m_1f1b_k_minus_s(k: int, m: int) -> None:
    g = simulate_costs(uniform(k), "gpipe", m)
    assert [d.peak_in_flight for d in g.devices] == [m] * k
    o = simulate_costs(uniform(k), "1f1b", m)
    assert [d.peak_in_flight for d in o.devices] == [min(k - s, m) for s in range(k)]


@given(st.sampled_from(SCHEDULES), st.integers(1, 8), st.integers(1, 16), st.integers(1, 3))
def test_in_flight_microbatches_matches_simulation(name: str, k: int, m: int, v: int) -> None:
    v = v if name == "interleaved" else 1
    r = simulate_costs(uniform(k, tw=0.5 if name == "zb-h1" else 0.0, v=v), name, m, v)
    for d in r.devices:
        assert d.peak_in_flight == in_flight_microbatches(name, k, m, d.lane, v)


@given(st.integers(1, 8), st.integers(1, 5), st.integers(1, 4), times, times)
def test_interleaved_bubble_is_k_minus_1_over_vm_of_ideal(k: int, groups: int, v: int, tf: float, tb: float) -> None:
    m = k * groups  # Megatron's interleaving needs M a multiple of K for its bubble formula
    r = simulate_costs(uniform(k, tf, tb, v=v), "interleaved", m, v)
    ideal = m * (tf + tb)
    assert close((r.iteration_s - ideal) / ideal, (k - 1) / (v * m), 1e-8)


@given(st.integers(1, 8), st.integers(0, 20), times, st.floats(0.1, 1.0), st.floats(0.1, 1.0))
def test_zb_h1_bubble(k: int, extra: int, t: float, fb: float, fw: float) -> None:
    """ZB-H1 (Qi et al. 2023, section 3.1): with M >= K and T_W <= min(T_F, T_B) (T_B the
    input-gradient pass; the paper takes T_F = T_B = T_W) the bubble is (K-1)(T_F + T_B - T_W):
    iteration = M (T_F + T_B + T_W) + (K-1)(T_F + T_B - T_W)."""
    m = k + extra
    tf, tbi = t, t * (0.5 + fb)
    tw = min(tf, tbi) * fw
    r = simulate_costs(uniform(k, tf, tbi + tw, tw), "zb-h1", m)
    assert close(r.iteration_s, m * (tf + tbi + tw) + (k - 1) * (tf + tbi - tw))


def test_zb_h1_paper_case_one_third_of_1f1b_bubble() -> None:
    k, m = 4, 8
    zb = simulate_costs(uniform(k, 1.0, 2.0, 1.0), "zb-h1", m)
    ofob = simulate_costs(uniform(k, 1.0, 2.0, 1.0), "1f1b", m)
    assert close(zb.iteration_s - m * 3, (ofob.iteration_s - m * 3) / 3)


@given(st.integers(1, 8), st.integers(1, 12), st.lists(times, min_size=8, max_size=8))
def test_pipedream_steady_state_is_bottleneck_stage(k: int, m: int, ts: list[float]) -> None:
    """Asynchronous 1F1B with free communication settles at the slowest stage's pace:
    iteration (time per M micro-batches) = M * max_s (tf_s + tb_s)."""
    costs = [cost(f"g{s}", ts[s], 2 * ts[(s + 3) % 8]) for s in range(k)]
    r = simulate_costs(costs, "pipedream", m)
    assert close(r.iteration_s, m * max(c.forward_s + c.backward_s for c in costs), 1e-8)
    assert r.window[1] > r.window[0] > 0


def test_pipedream_uniform_has_no_bubble_and_stashes_weights() -> None:
    k, m = 4, 8
    costs = [cost(f"g{s}", static=1000, weight=100, act=10) for s in range(k)]
    r = simulate_costs(costs, "pipedream", m)
    assert close(r.iteration_s, m * 3.0) and r.bubble_fraction == pytest.approx(0.0, abs=1e-12)
    # stage s keeps K - s micro-batches in flight and K - s weight versions (one of them live)
    assert [d.peak_memory_bytes for d in r.devices] == [1000 + (k - s) * 10 + (k - s - 1) * 100 for s in range(k)]


def test_pipedream_steady_state_with_a_period_of_three_iterations() -> None:
    """5 uniform stages at M = 1, 1 s links into the last two: the steady state takes 2, 4, 4, 2, 4, 4, ... s per
    iteration, 10/3 s on average. Two measured iterations (4, 4) read 4 s, and slowing stage 0 "sped it up"."""
    link = ir.Link(1e6, 0.0)
    costs = [cost("g0", 1.0, 1.0), cost("g1", 1.0, 1.0), cost("g2", 1.0, 1.0, link=link, nbytes=1e6),
             cost("g3", 1.0, 1.0, link=link, nbytes=1e6), cost("g4", 1.0, 1.0)]
    r = simulate_costs(costs, "pipedream", 1)
    assert close(r.iteration_s, 10.0 / 3.0)
    periods = (r.window[1] - r.window[0]) / 10.0  # measured over whole periods of 3 iterations (10 s)
    assert periods >= 1 and close(periods, round(periods))


def long_run_iteration(costs: Sequence[ir.StageCost], m: int, opts: SimOptions) -> float:
    """An asynchronous pipeline's time per iteration over 60 iterations after 60 to settle (60 is a whole number
    of every period up to 6)."""
    from planner.simulate.engine import Engine

    run = Engine(costs, make_schedule("pipedream", len(costs), m, pipedream_blocks=150), 1, opts, 0)
    run.run()
    return (run.block_end[120] - run.block_end[60]) / 60


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.5, 1.0, 1.5, 2.0]), st.sampled_from([1.0, 2.0, 3.0]),
                          st.sampled_from([0.0, 0.5, 1.0, 2.5]), st.sampled_from([0.0, 0.5]), st.booleans()),
                min_size=1, max_size=6),
       st.sampled_from([1, 2, 3, 4, 6, 8]), st.sampled_from([None, "shared"]))
def test_pipedream_iteration_is_the_long_run_mean(spec: list[tuple[float, float, float, float, bool]], m: int,
                                                  link_id: str | None) -> None:
    """Without link sharing (a timed event graph: its steady state repeats with a period) the measured time per
    iteration is the long run's. The busiest link pool bounds nothing there: its transfers overlap."""
    link = ir.Link(1e6, 1e-3)
    costs = [cost(f"g{s}", tf, tb, link=link if has else None, nbytes=xs * 1e6, link_id=link_id, ar=ar)
             for s, (tf, tb, xs, ar, has) in enumerate(spec)]
    opts = SimOptions(share_links=False, record_events=False)
    assert close(simulate_costs(costs, "pipedream", m, options=opts).iteration_s,
                 long_run_iteration(costs, m, opts), 1e-9)


def test_without_link_sharing_a_links_transfers_bound_no_steady_state() -> None:
    """Four boundaries on one link, each transfer alone on it (share_links=False): 28.8 s per iteration, not the
    32 s of the four flows' bytes one after another."""
    link = ir.Link(1e6, 0.0)
    costs = [cost(f"g{s}", 1.0, 1.0, link=link, nbytes=1e6, link_id="L") for s in range(4)] + [cost("z", 1.0, 1.0)]
    opts = SimOptions(share_links=False)
    assert close(simulate_costs(costs, "pipedream", 8, options=opts).iteration_s, 28.8)


# ----------------------------------------------------------------------------- an independent reference


def reference(costs: Sequence[ir.StageCost], name: str, m: int, v: int) -> float:
    """List scheduling of the same schedule with every transfer alpha + n/beta (no sharing)."""
    sched = make_schedule(name, len(costs) // v, m, v)
    k, n_chunks = sched.devices, sched.chunks
    split = sched.split_backward
    dur = {"F": [c.forward_s for c in costs],
           "B": [c.backward_s - (c.backward_weight_s if split else 0.0) for c in costs],
           "W": [c.backward_weight_s for c in costs]}

    def xfer(c: int) -> float:  # boundary c -> c+1
        cc = costs[c]
        if cc.send_link is None or c % k == (c + 1) % k:
            return 0.0
        return cc.send_link.transfer_s(cc.send_bytes)

    last = {}
    for d, acts in enumerate(sched.actions):
        for i, a in enumerate(acts):
            if a.kind == ("W" if split else "B"):
                last[a.stage] = (d, i)
    end: dict[tuple[int, str, int], float] = {}
    free = [0.0] * k
    pos = [0] * k
    todo = sum(len(a) for a in sched.actions)
    while todo:
        for d, acts in enumerate(sched.actions):
            while pos[d] < len(acts):
                c, kind, mb = acts[pos[d]]
                if kind == "F":
                    deps = [] if c == 0 else [((c - 1, "F", mb), xfer(c - 1))]
                elif kind == "B":
                    deps = [((c, "F", mb), 0.0)] + ([] if c == n_chunks - 1 else [((c + 1, "B", mb), xfer(c))])
                else:
                    deps = [((c, "B", mb), 0.0)]
                if any(dep not in end for dep, _ in deps):
                    break
                start = max([free[d]] + [end[dep] + x for dep, x in deps])
                end[(c, kind, mb)] = free[d] = start + dur[kind][c]
                if last.get(c) == (d, pos[d]):
                    free[d] += costs[c].allreduce_s
                pos[d] += 1
                todo -= 1
    return max(free)


stage_costs_strategy = st.lists(
    st.tuples(times, times, st.floats(0.0, 1.0), st.floats(0.0, 3.0), st.floats(0.0, 2.0), st.booleans()),
    min_size=1, max_size=6)


@given(stage_costs_strategy, st.integers(1, 10), st.sampled_from(["gpipe", "1f1b", "interleaved", "zb-h1"]),
       st.integers(1, 3))
def test_engine_matches_reference_without_link_sharing(spec: list[tuple[float, float, float, float, float, bool]],
                                                       m: int, name: str, v: int) -> None:
    v = v if name == "interleaved" else 1
    k = len(spec)
    costs = []
    for c in range(k * v):
        tf, tb, wshare, xs, ar, has_link = spec[c % k]
        link = ir.Link(1e6, 1e-3) if has_link else None
        costs.append(cost(f"g{c % k}", tf / v, tb / v, tb / v * wshare, link=link, nbytes=xs * 1e6,
                          ar=ar if c < k else ar / 2))
    r = simulate_costs(costs, name, m, v, SimOptions(share_links=False))
    assert close(r.iteration_s, reference(costs, name, m, v), 1e-9)


@given(stage_costs_strategy, st.integers(1, 10), st.sampled_from(SCHEDULES), st.integers(1, 3), st.booleans())
def test_properties_on_random_pipelines(spec: list[tuple[float, float, float, float, float, bool]], m: int,
                                        name: str, v: int, overlap: bool) -> None:
    """Time >= every device's busy time and >= one micro-batch's critical path; bubble in [0, 1)."""
    v = v if name == "interleaved" else 1
    k = len(spec)
    link = ir.Link(1e6, 1e-3)
    costs = [cost(f"g{c % k}", spec[c % k][0] / v, spec[c % k][1] / v, spec[c % k][1] / v * spec[c % k][2],
                  link=link if spec[c % k][5] else None, nbytes=spec[c % k][3] * 1e6, link_id="shared",
                  ar=spec[c % k][4], ar_bytes=1e8) for c in range(k * v)]
    r = simulate_costs(costs, name, m, v, SimOptions(overlap_allreduce=overlap))
    assert 0.0 <= r.bubble_fraction < 1.0
    tol = 1e-9 * r.iteration_s
    assert r.iteration_s + tol >= max(d.busy_s for d in r.devices)
    if name != "pipedream":
        split = name == "zb-h1"
        path = sum(c.forward_s + c.backward_s - (c.backward_weight_s if split else 0.0) for c in costs)
        path += 2 * sum(c.send_s for i, c in enumerate(costs[:-1]) if (i + 1) % k != i % k)
        assert r.iteration_s + tol >= path


@settings(max_examples=60)
@given(stage_costs_strategy, st.integers(1, 10), st.sampled_from(SCHEDULES), st.integers(1, 3), st.booleans(),
       st.booleans(), st.sampled_from([None, "shared"]))
def test_shortcuts_give_the_reference_results(spec: list[tuple[float, float, float, float, float, bool]], m: int,
                                              name: str, v: int, overlap: bool, duplex: bool,
                                              link_id: str | None) -> None:
    """The single-flow FIFO link and pipedream's early stop change no number but the run's
    length: every event played (shortcuts off) is the old definition."""
    v = v if name == "interleaved" else 1
    k = len(spec)
    link = ir.Link(1e6, 1e-3)
    costs = [cost(f"g{c % k}", spec[c % k][0] / v, spec[c % k][1] / v, spec[c % k][1] / v * spec[c % k][2],
                  link=link if spec[c % k][5] else None, nbytes=spec[c % k][3] * 1e6, link_id=link_id,
                  ar=spec[c % k][4], ar_bytes=1e8, act=3, weight=5, workspace=2) for c in range(k * v)]
    fast = simulate_costs(costs, name, m, v, SimOptions(overlap_allreduce=overlap, duplex=duplex))
    slow = simulate_costs(costs, name, m, v, SimOptions(overlap_allreduce=overlap, duplex=duplex, shortcuts=False))
    assert close(fast.iteration_s, slow.iteration_s)
    assert close(fast.bubble_fraction, slow.bubble_fraction)
    assert fast.window == pytest.approx(slow.window, rel=REL, abs=1e-12)
    for a, b in zip(fast.devices, slow.devices, strict=True):
        assert (a.peak_memory_bytes, a.peak_in_flight, a.busy_s) == (b.peak_memory_bytes, b.peak_in_flight, b.busy_s)
    if name != "pipedream":
        assert close(fast.makespan_s, slow.makespan_s)
        assert len(fast.events) == len(slow.events)
    else:
        assert fast.makespan_s <= slow.makespan_s + 1e-12


def test_pipedream_stops_after_the_measured_iterations() -> None:
    costs = uniform(4)
    fast = simulate_costs(costs, "pipedream", 8)
    slow = simulate_costs(costs, "pipedream", 8, options=SimOptions(shortcuts=False))
    assert fast.iteration_s == slow.iteration_s == 8 * 3.0
    assert fast.window == slow.window
    assert len(fast.events) < len(slow.events) and fast.makespan_s < slow.makespan_s


def test_pipedream_makespan_covers_the_measured_window() -> None:
    """The run stops at the last measured backward, before the all-reduce and optimizer step that end the
    measured iteration: makespan_s (the Gantt's time axis) was 42.75 s, short of the window's 43.5 s."""
    costs = [dataclasses.replace(cost(s, 1.0, 2.0, ar=0.5), optimizer_step_s=0.25) for s in ("a", "b")]
    r = simulate_costs(costs, "pipedream", 2)
    assert r.makespan_s >= r.window[1] > r.window[0]
    assert close(r.makespan_s, r.window[1])


# ----------------------------------------------------------------------------- links and all-reduce


def test_transfers_of_one_flow_go_in_order() -> None:
    # Stage 0 forwards instantly; its M activations leave together over one link of 1 s each.
    link = ir.Link(1e6, 0.0)
    costs = [cost("a", 0.0, 0.0, link=link, nbytes=1e6), cost("b", 1.0, 0.0)]
    fifo = simulate_costs(costs, "gpipe", 4)
    alone = simulate_costs(costs, "gpipe", 4, options=SimOptions(share_links=False))
    # one after another: stage 1 forwards at 1, 2, 3, 4 s; its instant backwards send four
    # gradients back, arriving at 6, 7, 8, 9 s. Unshared transfers all take 1 s from when they start.
    assert [e.start for e in fifo.events if e.track == "lane:1" and e.op == "F"] == pytest.approx([1, 2, 3, 4])
    assert close(fifo.iteration_s, 9.0) and close(alone.iteration_s, 6.0)
    assert fifo.links == ("0->1 fwd", "0->1 bwd")


def test_flows_on_one_link_share_bandwidth() -> None:
    # Boundaries 0->1 and 1->2 both use link "L": from 1 s, mb1's 0->1 and mb0's 1->2 share it.
    link = ir.Link(1e6, 0.0)
    costs = [cost("a", 0.0, 0.0, link=link, nbytes=1e6, link_id="L"),
             cost("b", 0.0, 0.0, link=link, nbytes=1e6, link_id="L"), cost("c", 0.0, 0.0)]
    r = simulate_costs(costs, "gpipe", 2)
    acts = {e.name: (e.start, e.end) for e in r.events if e.op == "act"}
    assert acts["act 0->1 #0"] == pytest.approx((0.0, 1.0))
    assert acts["act 0->1 #1"] == pytest.approx((1.0, 3.0))  # queued behind #0 (shown from 1 s), then shared
    assert acts["act 1->2 #0"] == pytest.approx((1.0, 3.0))
    assert acts["act 1->2 #1"] == pytest.approx((3.0, 4.0))
    assert r.links == ("L fwd", "L bwd")


def test_duplex_links_keep_directions_apart() -> None:
    link = ir.Link(1e6, 0.0)
    costs = [cost("a", 1.0, 1.0, link=link, nbytes=5e5, link_id="L"), cost("b", 1.0, 1.0)]
    half = simulate_costs(costs, "1f1b", 6, options=SimOptions(duplex=False))
    full = simulate_costs(costs, "1f1b", 6)
    assert half.links == ("L",) and full.links == ("L fwd", "L bwd")
    assert half.iteration_s >= full.iteration_s


def test_latency_and_bandwidth_of_a_transfer() -> None:
    link = ir.Link(2e6, 0.25)
    costs = [cost("a", 1.0, 1.0, link=link, nbytes=1e6), cost("b", 1.0, 1.0)]
    r = simulate_costs(costs, "gpipe", 1)
    assert close(r.iteration_s, 4.0 + 2 * (0.25 + 0.5))
    acts = [e for e in r.events if e.op == "act"]
    assert len(acts) == 1 and close(acts[0].end - acts[0].start, 0.75)


def test_blocking_allreduce_after_last_backward() -> None:
    r = simulate_costs([cost("a", 1.0, 2.0, ar=0.5)], "1f1b", 3)
    assert close(r.iteration_s, 3 * 3.0 + 0.5)
    assert close(r.devices[0].busy_s, 9.5) and r.bubble_fraction == pytest.approx(0.0, abs=1e-12)
    ar = [e for e in r.events if e.op == "AR"]
    assert len(ar) == 1 and close(ar[0].start, 9.0)


def test_overlapped_allreduce_in_ddp_buckets() -> None:
    # 4 buckets of 0.1 s; bucket i ready at 1 + 2 (i+1)/4 during the last backward (which starts at 1 s).
    r = simulate_costs([cost("a", 1.0, 2.0, ar=0.4, ar_bytes=100 * 2**20)], "gpipe", 1,
                       options=SimOptions(overlap_allreduce=True))
    assert close(r.iteration_s, 3.0 + 0.1)
    slow = simulate_costs([cost("a", 1.0, 2.0, ar=8.0, ar_bytes=100 * 2**20)], "gpipe", 1,
                          options=SimOptions(overlap_allreduce=True))
    assert close(slow.iteration_s, 1.0 + 0.5 + 8.0)  # first bucket ready at 1.5 s, then 4 x 2 s back to back
    # busy: compute and the reduction's tail that the backward does not hide (not idle, not a bubble)
    assert close(r.devices[0].busy_s, 3.1) and close(r.devices[0].allreduce_s, 0.1)
    assert close(slow.devices[0].busy_s, 9.5) and slow.bubble_fraction == pytest.approx(0.0, abs=1e-12)


def test_overlapped_allreduce_before_the_optimizer_step_is_busy_not_bubble() -> None:
    """A lane that waits for its own overlapped all-reduce before its optimizer step is busy then."""
    step = dataclasses.replace(cost("a", 1.0, 2.0, ar=8.0, ar_bytes=100 * 2**20), optimizer_step_s=0.25)
    r = simulate_costs([step], "gpipe", 1, options=SimOptions(overlap_allreduce=True))
    assert close(r.iteration_s, 1.5 + 8.0 + 0.25)
    assert close(r.devices[0].allreduce_s, 9.5 - 3.0) and close(r.devices[0].busy_s, r.iteration_s)
    assert r.bubble_fraction == pytest.approx(0.0, abs=1e-12)
    blocking = simulate_costs([step], "gpipe", 1)
    assert close(blocking.devices[0].allreduce_s, 8.0) and close(blocking.devices[0].busy_s, 11.25)


# ----------------------------------------------------------------------------- memory


def test_memory_timeline_and_peak() -> None:
    costs = [cost("a", static=1000, act=10, workspace=5), cost("b", static=2000, act=20, workspace=7)]
    r = simulate_costs(costs, "gpipe", 3)
    a, b = r.device("a"), r.device("b")
    assert a.peak_memory_bytes == 1000 + 3 * 10 + 5
    assert b.peak_memory_bytes == 2000 + 3 * 20 + 7
    assert a.memory[0] == (0.0, 1000) and a.memory[-1][1] == 1000  # all activations freed at the end
    assert r.peak_memory_bytes == b.peak_memory_bytes
    one = simulate_costs(costs, "1f1b", 3)
    assert one.device("a").peak_memory_bytes == 1000 + 2 * 10 + 5


@given(st.integers(1, 4), st.integers(1, 6), st.integers(0, 50), st.integers(0, 20), st.integers(0, 400),
       st.sampled_from(["gpipe", "1f1b"]), st.sampled_from([0.0, 0.5]))
def test_the_gradient_copy_is_held_during_the_all_reduce_after_the_activations_go(
        k: int, m: int, act: int, work: int, copy: int, schedule: str, ar: float) -> None:
    """A stage's peak is static + the larger of its activations in flight with a backward's workspace
    and the engine's flat gradient copy during its all-reduce: the cost model's stage_peak_memory. With no
    all-reduce (``ar`` 0: DeepSpeed flattens a one-rank stage's gradients all the same) the copy is held for an
    instant after the last backward, and counts as much."""
    from planner.costmodel import stage_peak_memory

    costs = [dataclasses.replace(cost(f"g{s}", ar=ar, static=1000, act=act, workspace=work), grad_copy_bytes=copy)
             for s in range(k)]
    r = simulate_costs(costs, schedule, m)
    for s in range(k):
        d = r.device(f"g{s}")
        assert d.peak_memory_bytes == stage_peak_memory(costs[s], schedule, k, m, s)
        assert d.memory[-1][1] == 1000  # the copy and the activations gone at the end


def test_zb_h1_holds_activations_until_w() -> None:
    costs = [cost(f"g{s}", 1.0, 2.0, 1.0, act=10) for s in range(3)]
    r = simulate_costs(costs, "zb-h1", 6)
    assert [d.peak_memory_bytes for d in r.devices] == [30, 30, 30]


def test_group_devices_share_one_lane_and_interleaved_chunks_add_up() -> None:
    costs = [cost(("a", "b"), static=100), cost(("c",), static=10), cost(("a", "b"), static=1), cost("c", static=2)]
    r = simulate_costs(costs, "interleaved", 4, 2)
    assert [d.device for d in r.devices] == ["a", "b", "c"]
    assert r.device("a").memory[0] == (0.0, 101) and r.lanes == (("a", "b"), ("c",))
    with pytest.raises(PlanError, match="chunk c runs on the devices"):
        simulate_costs([cost("a"), cost("b"), cost("c"), cost("b")], "interleaved", 4, 2)


def test_fits_against_capacity() -> None:
    r = simulate_costs([cost("a", static=100, act=10, capacity=115)], "gpipe", 2)
    assert r.devices[0].peak_memory_bytes == 120 and not r.devices[0].fits


# ----------------------------------------------------------------------------- outputs


def test_to_dict_contract() -> None:
    r = simulate_costs(uniform(2), "1f1b", 4)
    doc = r.to_dict()
    assert doc["kind"] == "simulation" and doc["version"] == 1
    assert close(doc["iteration_s"], 15.0) and close(doc["bubble_fraction"], 1 / 5)
    assert [set(d) >= {"device", "busy_s", "peak_memory_bytes"} for d in doc["devices"]] == [True, True]
    json.dumps(doc, allow_nan=False)


def test_chrome_trace_is_perfetto_shaped() -> None:
    link = ir.Link(1e6, 1e-4)
    costs = [cost(("a", "b"), link=link, nbytes=1e5, link_id="n0-n1"), cost("c")]
    trace = simulate_costs(costs, "1f1b", 3).to_chrome_trace()
    events = trace["traceEvents"]
    json.dumps(trace, allow_nan=False)
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {"a", "b", "c", "n0-n1 fwd", "n0-n1 bwd"}
    xs = [e for e in events if e["ph"] == "X"]
    assert all({"pid", "tid", "ts", "dur", "name"} <= set(e) and e["dur"] >= 0 for e in xs)
    lane_tracks = {(e["pid"], e["tid"]) for e in xs if e["pid"] == 1}
    assert len(lane_tracks) == 3


@given(stage_costs_strategy, st.integers(1, 8), st.sampled_from(SCHEDULES), st.booleans())
def test_trace_tracks_never_overlap(spec: list[tuple[float, float, float, float, float, bool]], m: int, name: str,
                                    overlap: bool) -> None:
    """Complete events on one Perfetto thread must not overlap (they would not nest)."""
    link = ir.Link(1e6, 1e-3)
    costs = [cost(f"g{s}", tf, tb, tb * w if name == "zb-h1" else 0.0, link=link if has else None,
                  nbytes=xs * 1e6, link_id="one", ar=ar, ar_bytes=1e8)
             for s, (tf, tb, w, xs, ar, has) in enumerate(spec)]
    trace = simulate_costs(costs, name, m, options=SimOptions(overlap_allreduce=overlap)).to_chrome_trace()
    per_track: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            per_track.setdefault((e["pid"], e["tid"]), []).append(e)
    named = {(e["pid"], e["tid"]) for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert set(per_track) <= named
    for evs in per_track.values():
        evs.sort(key=lambda e: e["ts"])
        assert all(a["ts"] + a["dur"] <= b["ts"] + 1e-3 for a, b in itertools.pairwise(evs))


def test_record_events_off_gives_the_same_numbers() -> None:
    costs = uniform(3)
    a = simulate_costs(costs, "1f1b", 5)
    b = simulate_costs(costs, "1f1b", 5, options=SimOptions(record_events=False))
    assert a.iteration_s == b.iteration_s and b.events == ()


def test_bad_inputs() -> None:
    with pytest.raises(PlanError):
        simulate_costs([], "1f1b", 2)
    with pytest.raises(ScheduleError, match="unknown schedule"):
        simulate_costs(uniform(2), "bogus", 2)
    with pytest.raises(PlanError, match="virtual stages"):
        simulate_costs(uniform(3), "interleaved", 2, 2)


def test_result_is_frozen() -> None:
    r = simulate_costs(uniform(2), "gpipe", 2)
    assert isinstance(r, SimResult)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.iteration_s = 0.0  # type: ignore[misc]


# ----------------------------------------------------------------------------- plans


def test_simulate_plan_uses_the_cost_model() -> None:
    costmodel = pytest.importorskip("planner.costmodel")
    if not hasattr(costmodel, "stage_costs"):
        pytest.skip("planner.costmodel.stage_costs not there yet")
    from planner.simulate import simulate

    plan = make_plan()
    r = simulate(plan)
    costs = costmodel.stage_costs(plan)
    assert r.iteration_s == simulate_costs(costs, plan.schedule, plan.microbatches).iteration_s
    assert [d.device for d in r.devices] == ["n0.g0", "n1.g0"]
    assert r.iteration_s > 0 and all(d.peak_memory_bytes > 0 for d in r.devices)


@given(st.lists(st.tuples(st.floats(0.001, 0.05), st.floats(1.0, 3.0), st.integers(10**4, 10**7)),
                min_size=2, max_size=6),
       st.sampled_from(["gpipe", "1f1b", "pipedream", "zb-h1"]), st.sampled_from([1, 2, 4, 8]))
@settings(max_examples=15, deadline=None, phases=[Phase.generate], derandomize=True)
def test_search_prediction_equals_simulation(layers: list[tuple[float, float, int]], schedule: str, m: int) -> None:
    """Issue 4: the search's predicted iteration time for its plan equals the simulator's (within 1%)."""
    from planner.search import search
    from planner.simulate import simulate

    doc = make_profile_dict(len(layers))
    for layer, (tf, ratio, out) in zip(doc["layers"], layers, strict=True):
        layer.update(forward_s=tf, backward_s=tf * ratio, output_bytes=out)
    profile = ir.ModelProfile.from_dict(doc)
    cluster_doc = make_cluster_dict()  # the paper's links: 10 Gbit/s in a server, 1 Gbit/s between
    cluster_doc["links"]["intra_node"]["bandwidth_Bps"] = 1.25e9
    cluster_doc["links"]["inter_node"]["bandwidth_Bps"] = 1.25e8
    cluster = ir.Cluster.from_dict(cluster_doc)
    plan = search(profile, cluster, microbatches=m, schedule=schedule, optimizer="sgd")
    simulated = simulate(plan, SimOptions(record_events=False)).iteration_s
    assert simulated == pytest.approx(plan.predicted.iteration_s, rel=0.01)


def test_optimizer_step_runs_after_the_allreduce_and_is_busy() -> None:
    c = dataclasses.replace(cost("a", 1.0, 2.0, ar=0.5), optimizer_step_s=0.25)
    r = simulate_costs([c], "1f1b", 3)
    assert close(r.iteration_s, 9.0 + 0.5 + 0.25)
    assert close(r.devices[0].busy_s, 9.75) and r.bubble_fraction == pytest.approx(0.0, abs=1e-12)
    opt = [e for e in r.events if e.op == "OPT"]
    assert len(opt) == 1 and close(opt[0].start, 9.5) and close(opt[0].end, 9.75)
    # without an all-reduce it follows the last backward; overlapped, it waits for the last bucket
    r = simulate_costs([dataclasses.replace(cost("a", 1.0, 2.0), optimizer_step_s=0.25)], "1f1b", 3)
    assert close(r.iteration_s, 9.25)
    over = simulate_costs([dataclasses.replace(cost("a", 1.0, 2.0, ar=8.0, ar_bytes=100 * 2**20),
                                               optimizer_step_s=0.25)], "gpipe", 1,
                          options=SimOptions(overlap_allreduce=True))
    assert close(over.iteration_s, 1.0 + 0.5 + 8.0 + 0.25)


def test_optimizer_step_in_a_pipelined_two_stage_plan() -> None:
    costs = [dataclasses.replace(c, optimizer_step_s=0.5 * (i + 1)) for i, c in enumerate(uniform(2))]
    base = simulate_costs(uniform(2), "1f1b", 4)
    r = simulate_costs(costs, "1f1b", 4)
    # stage 0 ends last (its last backward follows stage 1's); its step adds to the end
    assert close(r.iteration_s, base.iteration_s + 0.5)
    assert close(r.devices[1].busy_s, base.devices[1].busy_s + 1.0)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("k", "m"), [(1, 3), (2, 4), (4, 8)])
def test_engine_overhead_per_action_and_step_matches_the_closed_form(schedule: str, k: int, m: int) -> None:
    from planner.costmodel import charge

    tf, tb, a, step = 1.0, 2.0, 0.125, 0.5
    costs = [cost(f"d{s}", tf, tb) for s in range(k)]
    charged = charge(costs, ir.EngineOverhead(a, 0.0, step))
    assert simulate_costs(costs, schedule, m).iteration_s == pytest.approx((m + k - 1) * (tf + tb), rel=REL)
    assert simulate_costs(charged, schedule, m).iteration_s == pytest.approx(
        (m + k - 1) * (tf + tb + 2 * a) + step, rel=REL)


def test_a_plan_pays_its_engines_overhead_and_no_other() -> None:
    from planner.costmodel import charge, stage_costs_for
    from planner.simulate import simulate

    plan = dataclasses.replace(make_plan("1f1b", 4), engine="torch")
    before = simulate(plan)
    over = ir.EngineOverhead(1e-3, 5e-4, 2e-3)
    known = dataclasses.replace(plan.cluster, engine_overheads=(("deepspeed", over),))
    assert simulate(dataclasses.replace(plan, cluster=known)).iteration_s == before.iteration_s  # not its engine
    ds = dataclasses.replace(plan, cluster=known, engine="deepspeed")
    bare = stage_costs_for(plan.profile, plan.cluster, plan.stages, 4, "sgd")
    assert simulate_costs(bare, "1f1b", 4).iteration_s == before.iteration_s
    got = simulate(ds).iteration_s
    assert got == pytest.approx(simulate_costs(charge(bare, over), "1f1b", 4).iteration_s, rel=REL)
    assert got > before.iteration_s + 2 * (4 + 1) * 1e-3


@pytest.mark.parametrize(("field", "value"), [("overlap_allreduce", "yes"), ("bucket_bytes", 1e-9),
                                              ("bucket_bytes", float("nan")), ("pipedream_blocks", 10**6),
                                              ("pipedream_blocks", "2"), ("core_nodes", None)])
def test_sim_options_out_of_type_or_range_are_usage_errors(field: str, value: object) -> None:
    """A bucket of 1e-9 bytes played 10^17 buckets and a million pipedream iterations never ended."""
    from planner.errors import UsageError

    with pytest.raises(UsageError, match=f"SimOptions.{field} must be"):
        SimOptions(**{field: value})  # type: ignore[arg-type]

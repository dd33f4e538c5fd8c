"""simulate.cores: devices sharing a node's processors run faster while fewer of them compute."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner import ir
from planner.errors import FormatError
from planner.simulate import SimOptions, simulate, simulate_costs
from planner.simulate.cores import CoreShare
from tests.test_simulate import uniform
from tests.test_validate import make_plan


def node(devices: int, concurrent: float | None, prefix: str = "g", efficiency: float | None = None) -> ir.Node:
    return ir.Node("n", tuple(ir.GPU(f"{prefix}{i}", 1e12, 10**9) for i in range(devices)), concurrent, efficiency)


def sim(k: int, m: int, concurrent: float | None, devices: int | None = None, tf: float = 1.0,
        tb: float = 2.0, efficiency: float | None = None) -> float:
    nodes = (node(devices or k, concurrent, efficiency=efficiency),) if concurrent is not None else ()
    opts = SimOptions(core_nodes=nodes)
    return simulate_costs(uniform(k, tf, tb), "1f1b", m, options=opts).iteration_s


def test_one_stage_at_a_time_runs_at_a_whole_devices_speed() -> None:
    # K=4, M=1: one lane computes at a time; on 2 cores each gets a whole one, twice its nominal (shared) speed
    assert sim(4, 1, 2.0) == pytest.approx(sim(4, 1, None) / 2)


def test_as_many_cores_as_devices_changes_nothing() -> None:
    for k, m in ((2, 4), (3, 5), (1, 3)):
        assert sim(k, m, float(k)) == pytest.approx(sim(k, m, None))


def test_four_processes_on_two_cores_between_the_work_bound_and_the_flat_share() -> None:
    flat, shared = sim(4, 4, None), sim(4, 4, 2.0)
    work = 4 * 4 * 3.0 * 0.5 / 2  # every lane's nominal work, at a whole core (twice nominal), on 2 cores
    assert work <= shared < flat


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(1, 8), st.floats(0.5, 6.0))
def test_never_slower_than_the_flat_share_nor_faster_than_the_cores_allow(k: int, m: int, cores: float) -> None:
    flat, shared = sim(k, m, None), sim(k, m, cores)
    nominal = min(1.0, cores / k)
    assert shared <= flat * (1 + 1e-9)
    # every lane computes alone at most 1 / nominal times faster; all together on the cores no faster than they allow
    assert shared >= flat * nominal * (1 - 1e-9) or math.isclose(shared, flat * nominal)
    assert shared >= k * m * 3.0 * nominal / min(k, cores) * (1 - 1e-9)


def test_busy_time_counts_compute_at_the_rate_it_ran() -> None:
    # K=4, M=1 on 2 cores: one lane at a time, each at twice its nominal speed, so the lanes take turns
    opts = SimOptions(core_nodes=(node(4, 2.0),))
    res = simulate_costs(uniform(4), "1f1b", 1, options=opts)
    nominal = simulate_costs(uniform(4), "1f1b", 1)
    assert all(d.compute_s == pytest.approx(n.compute_s / 2) for d, n in zip(res.devices, nominal.devices, strict=True))
    assert sum(d.busy_s for d in res.devices) == pytest.approx(res.iteration_s)
    assert res.bubble_fraction == pytest.approx(0.75)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(1, 8), st.floats(0.5, 6.0), st.floats(0.5, 1.0))
def test_no_device_is_busy_longer_than_the_iteration(k: int, m: int, cores: float, efficiency: float) -> None:
    opts = SimOptions(core_nodes=(node(k, cores, efficiency=efficiency),))
    res = simulate_costs(uniform(k, 1.0, 2.0), "1f1b", m, options=opts)
    assert all(d.busy_s <= res.iteration_s * (1 + 1e-9) for d in res.devices)
    assert 0.0 <= res.bubble_fraction < 1.0


def test_a_share_keeps_each_lanes_mean_rate_over_its_finished_actions() -> None:
    share = CoreShare([("g0",), ("g1",)], [node(2, 1.0)])
    assert share.mean_rate(0) == 1.0  # nothing finished yet
    (end0, _, v0), = share.begin(0, 1.0, 0.0)
    share.finish(0, v0, end0)  # alone on the core: twice its nominal (shared) speed
    assert share.mean_rate(0) == pytest.approx(2.0) and share.mean_rate(1) == 1.0


def test_events_keep_their_real_start_and_end() -> None:
    opts = SimOptions(core_nodes=(node(4, 2.0),))
    res = simulate_costs(uniform(4), "1f1b", 1, options=opts)
    f0 = next(e for e in res.events if e.track == "lane:0" and e.op == "F")
    assert (f0.start, f0.end) == pytest.approx((0.0, 0.5))
    assert max(e.end for e in res.events) == pytest.approx(res.iteration_s)


def test_a_stale_end_event_is_ignored() -> None:
    share = CoreShare([("g0",), ("g1",)], [node(2, 1.0)])
    (end0, _, v0), = share.begin(0, 1.0, 0.0)
    assert end0 == pytest.approx(0.5)  # alone: twice the nominal speed of two sharing one core
    ends = share.begin(1, 1.0, 0.25)
    assert share.finish(0, v0, end0) == (None, [])  # lane 0 was slowed down meanwhile
    new0 = next(e for e in ends if e[1] == 0)
    start, others = share.finish(0, new0[2], new0[0])
    assert start == 0.0 and new0[0] == pytest.approx(0.25 + 0.5) and [o[1] for o in others] == [1]


def test_only_the_lanes_on_a_sharing_node_share() -> None:
    share = CoreShare([("a0",), ("b0",)], [node(1, 1.0, "a"), node(1, None, "b")])
    assert set(share.pools_of) == {0} and share.fastest_rate(1) == 1.0
    assert not CoreShare([("a0",)], [node(1, None, "a")])


def test_a_plans_cluster_that_shares_cores_is_simulated_so() -> None:
    plan = make_plan(microbatches=4, stages=[((0, 2), ("n0.g0",)), ((2, 4), ("n0.g1",))])
    nodes = tuple(dataclasses.replace(n, concurrent_devices=1.0) for n in plan.cluster.nodes)
    shared = dataclasses.replace(plan, cluster=dataclasses.replace(plan.cluster, nodes=nodes))
    assert simulate(shared).iteration_s < simulate(plan).iteration_s


def test_node_json_carries_concurrent_devices_and_old_files_load() -> None:
    doc = node(2, 2.0).to_dict()
    assert doc["concurrent_devices"] == 2.0 and ir.Node.from_dict(doc, "n").concurrent_devices == 2.0
    del doc["concurrent_devices"]
    assert ir.Node.from_dict(doc, "n").concurrent_devices is None
    assert "concurrent_devices" not in node(1, None).to_dict()
    with pytest.raises(FormatError, match="concurrent_devices"):
        ir.Node.from_dict({**doc, "concurrent_devices": 0}, "n")
    assert ir.Node.from_dict({**doc, "concurrent_devices": 0.5}, "n").concurrent_devices == 0.5  # 2 threads a core


def test_a_node_keeps_its_sharing_efficiency_while_two_or_more_devices_compute() -> None:
    n = node(4, 2.0, efficiency=0.9)
    assert n.speed(1) == 1.0 and n.speed(2) == pytest.approx(0.9)
    assert n.speed(3) == pytest.approx(2 / 3 * 0.9) and n.core_share == pytest.approx(0.5 * 0.9)
    assert node(4, 2.0).core_share == 0.5 and node(2, 2.0, efficiency=0.9).core_share == pytest.approx(0.9)
    assert ir.Node("gpus", (), None, 0.5).speed(8) == 1.0  # a node that shares nothing


def test_one_lane_alone_on_a_shared_node_runs_at_a_whole_cores_speed_whatever_the_efficiency() -> None:
    # K=4, M=1: one lane computes at a time, nominal speed 0.5 x 0.8 of a core, so alone 1 / 0.4 times faster
    assert sim(4, 1, 2.0, efficiency=0.8) == pytest.approx(sim(4, 1, None) * 0.5 * 0.8)


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 6), st.integers(1, 8), st.floats(0.5, 1.0))
def test_a_pipeline_on_a_node_that_loses_to_sharing_is_between_the_flat_share_and_every_lane_alone(
        k: int, m: int, efficiency: float) -> None:
    """Nominal stage times carry the efficiency (the devices' flops are their speed when all
    compute at once), and a lane computing alone runs 1 / efficiency times faster: the pipeline
    is never slower than the flat share, nor faster than if every lane ran alone."""
    flat = sim(k, m, None)
    for cores in (float(k), k / 2):
        shared = sim(k, m, cores, efficiency=efficiency)
        nominal = min(1.0, cores / k) * efficiency
        assert flat * nominal * (1 - 1e-9) <= shared <= flat * (1 + 1e-9)


def test_node_json_carries_its_sharing_efficiency_and_refuses_one_out_of_range() -> None:
    doc = node(2, 1.0, efficiency=0.93).to_dict()
    assert ir.Node.from_dict(doc, "n").sharing_efficiency == 0.93
    assert "sharing_efficiency" not in node(2, 1.0).to_dict()
    for bad in (0, 1.2, -0.5, 5e-324):
        with pytest.raises(FormatError, match="sharing_efficiency"):
            ir.Node.from_dict({**doc, "sharing_efficiency": bad}, "n")


@pytest.mark.parametrize(("field", "value"), [("concurrent_devices", 5e-324), ("concurrent_devices", 1e-300),
                                              ("sharing_efficiency", 5e-324)])
def test_a_core_share_that_underflows_to_zero_is_refused_not_divided_by(field: str, value: float) -> None:
    """5e-324 of either gave each of 4 devices a core share of 0: a ZeroDivisionError in the simulator."""
    from planner import schemas
    from planner.errors import UsageError

    doc = node(4, 2.0, efficiency=0.9).to_dict() | {field: value}
    with pytest.raises(FormatError, match=f"{field} must be"):
        ir.Node.from_dict(doc, "n")
    cluster = {"kind": "cluster", "version": 1, "name": "c", "nodes": [doc],
               "links": {"intra_node": {"bandwidth_Bps": 1e9, "latency_s": 1e-5}}}
    with pytest.raises(FormatError, match=f"nodes\\[0\\].{field} is .*below the minimum 0.001"):
        schemas.validate(cluster, "cluster", 1, "c.json")
    hand_built = dataclasses.replace(node(4, 2.0, efficiency=0.9), **{field: value})
    with pytest.raises(UsageError, match=f"SimOptions.core_nodes\\[0\\].{field} must be"):
        simulate_costs(uniform(4), "1f1b", 4, options=SimOptions(core_nodes=(hand_built,)))


def test_node_json_carries_its_handoff_cost_and_refuses_a_negative_one() -> None:
    doc = dataclasses.replace(node(4, 2.0), handoff_s=6e-4).to_dict()
    assert ir.Node.from_dict(doc, "n").handoff_s == 6e-4
    assert "handoff_s" not in node(4, 2.0).to_dict()  # old files: absent, charged nothing
    assert ir.Node.from_dict(node(4, 2.0).to_dict(), "n").handoff_s is None
    for bad in (-1e-3, "1ms"):
        with pytest.raises(FormatError, match="handoff_s"):
            ir.Node.from_dict({**doc, "handoff_s": bad}, "n")


def test_the_handoff_in_cost_model_seconds_is_its_cpu_seconds_over_each_devices_core_share() -> None:
    # 4 devices on 2 cores: all computing, each has half a core, so 1 ms of CPU takes 2 ms of a device's time
    assert dataclasses.replace(node(4, 2.0, efficiency=0.8), handoff_s=1e-3).handoff_work_s == pytest.approx(2e-3)
    assert dataclasses.replace(node(2, 2.0), handoff_s=1e-3).handoff_work_s == pytest.approx(1e-3)
    assert dataclasses.replace(node(2, None), handoff_s=1e-3).handoff_work_s == pytest.approx(1e-3)
    assert node(4, 2.0).handoff_work_s == 0.0


def cost(devices: tuple[str, ...], tf: float = 1.0, tb: float = 2.0) -> ir.StageCost:
    return ir.StageCost(devices, tf, tb, 0.0, 0.0, None, None, 0.0, 0.0, 0, 0, 1, 0, 10**12)


def named_node(name: str, devices: tuple[str, ...], concurrent: float | None, efficiency: float | None = None,
               flops: float = 1e12) -> ir.Node:
    return ir.Node(name, tuple(ir.GPU(d, flops, 10**9) for d in devices), concurrent, efficiency)


def test_a_lane_on_two_nodes_is_tracked_on_both_whatever_their_order() -> None:
    # lane 0 on a0 and b0: every node's other process shares its node with it (it was 13.0 s or 12.5 s by the order)
    n0, n1 = named_node("n0", ("a0", "a1"), 1.0), named_node("n1", ("b0", "b1"), 1.0)
    costs = [cost(("a0", "b0")), cost(("a1",)), cost(("b1",))]
    runs = [simulate_costs(costs, "1f1b", 4, options=SimOptions(core_nodes=o)) for o in ((n0, n1), (n1, n0))]
    assert runs[0].iteration_s == pytest.approx(runs[1].iteration_s) == pytest.approx(13.5)
    assert [d.compute_s for d in runs[0].devices] == pytest.approx([d.compute_s for d in runs[1].devices])


def test_a_lane_on_a_node_that_shares_nothing_runs_no_faster_than_its_device_there() -> None:
    shared, own = named_node("n0", ("a0", "a1"), 1.0), named_node("n1", ("b0",), None)
    alone = (cost(("a0", "b0")),)  # lane alone on n0's core: twice its nominal speed there, nominal on n1
    assert simulate_costs(alone, "1f1b", 2, options=SimOptions(core_nodes=(shared, own))).iteration_s == 6.0
    faster = dataclasses.replace(own, gpus=(ir.GPU("b0", 4e12, 10**9),))  # n1's device has the headroom
    assert simulate_costs(alone, "1f1b", 2, options=SimOptions(core_nodes=(shared, faster))).iteration_s == 3.0


def test_one_nodes_results_are_those_before_lanes_could_span_nodes() -> None:
    """Pinned to the last bit: the simulator's results on one node before a lane could lie on several."""
    costs = [cost(("g0", "g1"), 0.7, 1.3), cost(("g2",), 1.1, 2.0), cost(("g3",), 0.4, 0.9),
             cost(("g4", "g5"), 0.9, 1.7)]
    pinned = {("1f1b", 4, 2.0, 0.8): (7.882857142857141, (4.228571428571427, 6.368571428571427, 5.671428571428571)),
              ("gpipe", 3, 1.5, None): (5.935714285714287, (2.5857142857142867, 4.107142857142858, 3.271428571428571)),
              ("pipedream", 2, 3.0, 0.9): (3.885714285714286, (2.800167574361125, 3.8693491763435044,
                                                               3.2920634920634932)),
              ("1f1b", 6, 0.5, None): (11.657142857142857, (7.199999999999998, 10.471428571428572, 9.314285714285711))}
    for (schedule, m, concurrent, efficiency), (iteration, compute) in pinned.items():
        opts = SimOptions(core_nodes=(node(7, concurrent, efficiency=efficiency),))
        res = simulate_costs(costs, schedule, m, options=opts)
        assert (res.iteration_s, tuple(d.compute_s for d in res.devices)[::2]) == (iteration, compute)


spans = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2)), min_size=1, max_size=5)  # per lane: devices on n0, n1


def spanning(widths: list[tuple[int, int]], concurrent: tuple[float, float], efficiency: tuple[float, float],
             ) -> tuple[list[ir.StageCost], tuple[ir.Node, ir.Node]]:
    """Lanes with their devices on two sharing nodes (each lane at least one), and the nodes (a spare device each)."""
    lanes = [tuple(f"a{i}_{j}" for j in range(w0)) + tuple(f"b{i}_{j}" for j in range(w1 or (not w0)))
             for i, (w0, w1) in enumerate(widths)]
    on = [(*(d for lane in lanes for d in lane if d[0] == p), f"{p}spare") for p in "ab"]
    nodes = (named_node("n0", on[0], concurrent[0], efficiency[0]),
             named_node("n1", on[1], concurrent[1], efficiency[1]))
    return [cost(lane, 1.0 + 0.25 * i, 2.0) for i, lane in enumerate(lanes)], nodes


@settings(max_examples=40, deadline=None)
@given(spans, st.integers(1, 6), st.tuples(st.floats(0.5, 4.0), st.floats(0.5, 4.0)),
       st.tuples(st.floats(0.5, 1.0), st.floats(0.5, 1.0)), st.sampled_from(["1f1b", "gpipe", "pipedream"]))
def test_the_order_of_the_nodes_changes_nothing(widths: list[tuple[int, int]], m: int,
                                                concurrent: tuple[float, float], efficiency: tuple[float, float],
                                                schedule: str) -> None:
    costs, (n0, n1) = spanning(widths, concurrent, efficiency)
    one, two = (simulate_costs(costs, schedule, m, options=SimOptions(core_nodes=o)) for o in ((n0, n1), (n1, n0)))
    assert two.iteration_s == pytest.approx(one.iteration_s, rel=1e-9)
    assert [d.compute_s for d in two.devices] == pytest.approx([d.compute_s for d in one.devices], rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(spans, st.tuples(st.floats(0.5, 4.0), st.floats(0.5, 4.0)), st.tuples(st.floats(0.5, 1.0), st.floats(0.5, 1.0)),
       st.randoms(use_true_random=False))
def test_a_lane_on_two_nodes_is_never_faster_than_on_either_alone(
        widths: list[tuple[int, int]], concurrent: tuple[float, float], efficiency: tuple[float, float],
        rnd: Any) -> None:
    """Whichever lanes compute, a lane's devices on both nodes end its work no sooner than its devices on either
    node would with the same lanes computing there; on one node they end it as that node alone has them end."""
    costs, nodes = spanning(widths, concurrent, efficiency)
    lanes = [c.devices for c in costs]
    computing = [lane for lane in range(len(lanes)) if rnd.random() < 0.7] or [0]
    both = CoreShare(lanes, nodes)
    ends: dict[int, float] = {}
    for lane in computing:
        ends.update((other, end) for end, other, _ in both.begin(lane, 1.0, 0.0))
    for n in nodes:
        here = [tuple(d for d in lane if d in {g.name for g in n.gpus}) for lane in lanes]
        alone = CoreShare(here, [n])
        ends_here: dict[int, float] = {}
        for lane in computing:
            if here[lane]:
                ends_here.update((other, end) for end, other, _ in alone.begin(lane, 1.0, 0.0))
        for lane, end in ends_here.items():
            assert ends[lane] >= end * (1 - 1e-12)
            if not any(lanes[lane][0][0] != d[0] for d in lanes[lane]):  # all its devices on this node
                assert ends[lane] == end


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 5), st.integers(1, 6), st.floats(0.5, 6.0), st.floats(0.5, 1.0),
       st.sampled_from(["1f1b", "gpipe", "pipedream"]))
def test_on_one_node_other_nodes_beside_it_change_nothing(k: int, m: int, cores: float, efficiency: float,
                                                          schedule: str) -> None:
    """Every lane on one node: its pool's rate alone, to the last bit, whatever other nodes are listed."""
    one = (node(k, cores, efficiency=efficiency),)
    idle, gpus = named_node("idle", ("x0", "x1"), 1.0, 0.7), named_node("gpus", ("y0",), None, flops=1e15)
    runs = [simulate_costs(uniform(k, 1.0, 2.0), schedule, m, options=SimOptions(core_nodes=nodes))
            for nodes in (one, (idle, *one, gpus), (gpus, *one))]
    assert [r.iteration_s for r in runs] == [runs[0].iteration_s] * 3
    assert [[d.compute_s for d in r.devices] for r in runs] == [[d.compute_s for d in runs[0].devices]] * 3

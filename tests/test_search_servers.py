"""search.servers: an engine whose launcher starts as many processes on every server searches the even sub-clusters."""

from __future__ import annotations

import pytest

from planner import ir
from planner.cluster import uneven_servers
from planner.errors import InfeasibleError, PlannerError
from planner.runnable import problems
from planner.search import search
from planner.search.servers import even_subclusters, uneven
from tests.conftest import make_cluster_dict, make_profile_dict


def _servers(*sizes: int, memory_bytes: int = 10**10) -> ir.Cluster:
    doc = make_cluster_dict(len(sizes), max(sizes), memory_bytes=memory_bytes)
    for node, n in zip(doc["nodes"], sizes, strict=True):
        node["gpus"] = node["gpus"][:n]
    return ir.Cluster.from_dict(doc)


def test_every_server_size_gives_one_even_sub_cluster() -> None:
    cluster = _servers(4, 2, 3)
    subs = even_subclusters(cluster)
    assert uneven(cluster) and not any(uneven(s) for s in subs)
    shapes = [[(n.name, len(n.gpus)) for n in s.nodes] for s in subs]
    assert shapes == [[("n0", 2), ("n1", 2), ("n2", 2)], [("n0", 3), ("n2", 3)], [("n0", 4)]]  # most GPUs first
    assert [g.name for g in subs[1].gpus] == ["n0.g0", "n0.g1", "n0.g2", "n2.g0", "n2.g1", "n2.g2"]
    even = _servers(2, 2)
    assert even_subclusters(even) == [even]


@pytest.mark.parametrize("engine", ["torch", "deepspeed"])
def test_a_launcher_of_equal_processes_per_server_gets_a_plan_it_can_start(engine: str) -> None:
    profile = ir.ModelProfile.from_dict(make_profile_dict(6, batch_size=24))
    cluster = _servers(4, 2)
    plan = search(profile, cluster, engine=engine, candidates=4)
    assert problems(plan, engine) == [] and uneven_servers(plan) is None
    assert {g.name for g in plan.cluster.gpus} <= {g.name for g in cluster.gpus}
    free = search(profile, cluster, engine="any", candidates=4)  # no launcher's rule: any servers
    assert free.predicted.iteration_s <= plan.predicted.iteration_s * (1 + 1e-9)


def test_when_no_even_sub_cluster_has_a_plan_the_error_says_which_were_searched() -> None:
    doc = make_profile_dict(4, batch_size=8)
    for layer in doc["layers"]:
        layer.update(param_count=10**9, param_bytes=4 * 10**9)
    with pytest.raises(PlannerError, match=r"--engine torch starts as many processes on every server, so the uneven "
                                           r"servers were searched as 4 GPUs \(2 x 2\) and 4 GPUs \(1 x 4\)") as exc:
        search(ir.ModelProfile.from_dict(doc), _servers(4, 2, memory_bytes=10**9), engine="torch")
    assert isinstance(exc.value, InfeasibleError) and exc.value.needed_bytes is not None  # the least need is kept
    assert exc.value.cause.startswith("on 4 GPUs (")


def test_even_layouts_are_every_servers_by_gpus_cut_but_the_whole_most_gpus_first() -> None:
    from planner.search.servers import even_layouts

    groups = even_layouts(ir.Cluster.from_dict(make_cluster_dict(2, 4)))
    counts = [[(len(c.nodes), len(c.nodes[0].gpus)) for c in group] for group in groups]
    assert counts == [[(2, 3)], [(1, 4), (2, 2)], [(1, 3)], [(1, 2), (2, 1)], [(1, 1)]]
    assert [n.name for n in groups[0][0].nodes] == ["n0", "n1"] and groups[0][0].nodes[1].gpus[-1].name == "n1.g2"


def test_where_every_best_plan_places_unevenly_deepspeed_gets_an_even_layout_of_fewer_gpus() -> None:
    """Six layers that fit one to a GPU, on two servers of 4: the search's only plan ran six one-GPU stages on 4 + 2
    GPUs, which DeepSpeed's launcher cannot start, and the search said so (exit 3). It now searches the even layouts
    of fewer GPUs and returns six stages on 3 + 3; a fixed --config is not re-laid out."""
    profile = ir.ModelProfile.from_dict(make_profile_dict(6, batch_size=8))
    cluster = ir.Cluster.from_dict(make_cluster_dict(2, 4, 7_000_000))
    plan = search(profile, cluster, engine="deepspeed", optimizer="adam", recompute="none")
    assert [len(n.gpus) for n in plan.cluster.nodes] == [3, 3] and plan.config == "1-1-1-1-1-1"
    assert not problems(plan, "deepspeed")
    with pytest.raises(InfeasibleError, match="different numbers of processes"):
        search(profile, cluster, engine="deepspeed", optimizer="adam", recompute="none", config="1-1-1-1-1-1")

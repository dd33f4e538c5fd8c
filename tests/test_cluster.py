"""Clusters: presets, validation, the hierarchy graph, groups and links."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner import ir
from planner.cluster import (
    cluster_from_dict,
    group_of,
    hierarchy_graph,
    link_between,
    list_presets,
    load_cluster,
    path_link,
    preset_names,
    server_share,
    spanning_tensor_group,
)
from planner.errors import ClusterError, FormatError
from planner.ir.cluster import MAX_THREADS
from tests.conftest import make_cluster_dict


def test_presets_load_and_include_the_contract_names() -> None:
    names = preset_names()
    for name in ("pipepar-4x2-2080ti", "pipedream-4x4-10g", "a100-8x8-nvlink-ib", "h100-8x8-nvlink-ib",
                 "mixed-a100-v100-2080ti"):
        assert name in names
    assert len(list_presets()) == len(names)


def test_pipepar_preset_matches_the_paper() -> None:
    c = load_cluster("pipepar-4x2-2080ti")
    assert [len(n.gpus) for n in c.nodes] == [2, 2, 2, 2]
    assert all(g.flops == 13.4e12 for g in c.gpus)
    assert c.link("inter_node").bandwidth_Bps == 1.25e8
    assert c.link("intra_node").bandwidth_Bps == 1.25e9


def test_mixed_preset_has_different_gpus() -> None:
    c = load_cluster("mixed-a100-v100-2080ti")
    assert len({g.flops for g in c.gpus}) > 1
    assert len({len(n.gpus) for n in c.nodes}) > 1


def test_unknown_preset_lists_presets() -> None:
    with pytest.raises(ClusterError) as exc:
        load_cluster("nope")
    assert "pipepar-4x2-2080ti" in exc.value.hint


def test_a_folder_given_as_the_cluster_is_called_a_folder(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--cluster mydir` (a folder in the current one) was 'unknown cluster preset'; a preset's name stays a preset."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mydir").mkdir()
    with pytest.raises(FormatError, match=r"^mydir: is a folder"):
        load_cluster("mydir")
    (tmp_path / "pipepar-4x2-2080ti").mkdir()
    assert load_cluster("pipepar-4x2-2080ti").name == "pipepar-4x2-2080ti"


def test_load_from_file(tmp_path) -> None:
    p = tmp_path / "c.json"
    p.write_text(json.dumps(make_cluster_dict(3, 2)))
    c = load_cluster(str(p))
    assert len(c.gpus) == 6


@pytest.mark.parametrize("mutate, word", [
    (lambda d: d["nodes"].clear(), "nodes"),
    (lambda d: d["nodes"][0]["gpus"].clear(), "gpus"),
    (lambda d: d["links"]["inter_node"].update(bandwidth_Bps=0), "bandwidth_Bps"),
    (lambda d: d["links"]["intra_node"].update(bandwidth_Bps=math.nan), "bandwidth_Bps"),
    (lambda d: d["links"]["intra_node"].update(latency_s=-1), "latency_s"),
    (lambda d: d["nodes"][0]["gpus"][0].update(flops=-3), "flops"),
    (lambda d: d.pop("links"), "links"),
    (lambda d: d.update(kind="plan"), "kind"),
    (lambda d: d.update(version=7), "version"),
])
def test_bad_clusters_name_the_field(mutate, word) -> None:
    d = make_cluster_dict()
    mutate(d)
    with pytest.raises((ClusterError, FormatError)) as exc:
        cluster_from_dict(d)
    assert word in str(exc.value)


def test_hierarchy_graph_levels_and_slowest_link() -> None:
    c = cluster_from_dict(make_cluster_dict(2, 2))
    g = hierarchy_graph(c)
    assert g.nodes["n0.g0"]["level"] == "gpu"
    assert g.nodes["node:n0"]["level"] == "node"
    assert path_link(g, "n0.g0", "n0.g1").bandwidth_Bps == 1e10
    assert path_link(g, "n0.g0", "n1.g1").bandwidth_Bps == 1e9
    assert path_link(g, "n0.g0", "n0.g0") is None



def test_a_path_takes_the_slowest_collectives_bandwidths_on_it() -> None:
    d = make_cluster_dict(2, 2)
    d["links"]["intra_node"].update(allreduce_bandwidth_Bps=5e8, allgather_bandwidth_Bps=2e9)
    g = hierarchy_graph(cluster_from_dict(d))
    inside, across = path_link(g, "n0.g0", "n0.g1"), path_link(g, "n0.g0", "n1.g1")
    assert inside is not None and (inside.allreduce_Bps, inside.allgather_Bps) == (5e8, 2e9)
    assert across is not None and (across.bandwidth_Bps, across.allreduce_Bps, across.allgather_Bps) == (1e9, 5e8, 1e9)


def test_a_links_fixed_cost_per_collective_is_carried_by_the_file_and_the_paths() -> None:
    d = make_cluster_dict(2, 2)
    d["links"]["intra_node"]["collective_latency_s"] = 1e-3
    c = cluster_from_dict(d)
    assert c.link("intra_node").collective_latency_s == 1e-3 and c.link("inter_node").collective_latency_s == 0.0
    back = ir.Cluster.from_dict(c.to_dict())
    assert back.link("intra_node").collective_latency_s == 1e-3
    assert "collective_latency_s" not in back.to_dict()["links"]["inter_node"]  # a file without it is unchanged
    g = hierarchy_graph(c)
    across = path_link(g, "n0.g0", "n1.g1")
    assert across is not None and across.collective_latency_s == 1e-3  # the larger on the path
    d["links"]["intra_node"]["collective_latency_s"] = -1e-3
    with pytest.raises(FormatError, match="collective_latency_s"):
        ir.Cluster.from_dict(d)


def test_groups_and_links() -> None:
    d = make_cluster_dict(2, 2)
    d["nodes"][1]["gpus"][0]["flops"] = 5e11
    c = cluster_from_dict(d)
    g = group_of(c, ["n0.g0", "n0.g1"])
    assert (g.n, g.nodes, g.link.bandwidth_Bps) == (2, 1, 1e10)
    g = group_of(c, ["n0.g0", "n0.g1", "n1.g0"])
    assert (g.nodes, g.per_node, g.link.bandwidth_Bps, g.peaks[0]) == (2, 1, 1e9, 5e11)
    link, lid = link_between(c, ["n0.g0"], ["n0.g1"])
    assert link.bandwidth_Bps == 1e10 and lid == "intra_node:n0"
    link, lid = link_between(c, ["n0.g1"], ["n1.g0", "n1.g1"])
    assert link.bandwidth_Bps == 1e9 and lid == "inter_node:n0->n1"
    with pytest.raises(ClusterError):
        group_of(c, ["zz"])
    assert isinstance(c, ir.Cluster)


@given(st.lists(st.integers(1, 4), min_size=1, max_size=5), st.data())
def test_a_run_of_consecutive_devices_is_described_as_any_other_group(sizes: list[int], data: st.DataObject) -> None:
    """group_of reads a run of consecutive devices off per-device slices (the search asks for every run of
    every width); it gives what the device-by-device description of the same devices, out of order, gives."""
    import planner.cluster as cl

    d = make_cluster_dict(len(sizes), max(sizes))
    for node, size in zip(d["nodes"], sizes, strict=True):
        node["gpus"] = node["gpus"][:size]
        for gpu in node["gpus"]:
            gpu["flops"] = data.draw(st.sampled_from([1e12, 5e11]))
            gpu["memory_bytes"] = data.draw(st.sampled_from([10**9, 10**10]))
    cluster = cluster_from_dict(d)
    names = cl.index(cluster).names
    start = data.draw(st.integers(0, len(names) - 1))
    run = tuple(names[start:data.draw(st.integers(start + 1, len(names)))])
    shuffled = (*run[1:], run[0]) if len(run) > 1 else run
    assert cl.group_of(cluster, run) == cl._run_group(cluster, start, len(run), "fp32")
    assert cl.group_of(cluster, shuffled) == cl.group_of(cluster, run)


def test_clusters_are_equal_by_value_and_cheaply_once_compared() -> None:
    """Cached look-ups compare equal clusters that are different objects: equality is by every field
    (a digest made once per cluster), so a change anywhere makes two clusters differ."""
    import dataclasses

    d = make_cluster_dict(2, 2)
    a, b = cluster_from_dict(d), cluster_from_dict(d)
    assert a == b and a is not b and hash(a) == hash(b)
    d["nodes"][1]["gpus"][1]["memory_bytes"] += 1
    assert cluster_from_dict(d) != a
    assert dataclasses.replace(a, engine_overheads=(("torch", ir.EngineOverhead(per_step_s=1e-3)),)) != a
    assert a != "cluster"


def test_server_share_is_the_tensor_degree_bound_that_keeps_groups_inside_a_server() -> None:
    """6 + 6 GPUs take tp 1, 2, 3 or 6 (not 4: its second group would be n0.g4, n0.g5, n1.g0, n1.g1); 3 + 3 take
    1 or 3; a whole server its size."""
    cluster = cluster_from_dict(make_cluster_dict(2, 6))
    names = [g.name for g in cluster.gpus]
    assert server_share(cluster, names) == 6
    assert server_share(cluster, names[3:9]) == 3
    assert server_share(cluster, names[:6]) == 6
    assert server_share(cluster, names[4:12]) == 2


def test_a_spanning_tensor_group_is_found_whatever_the_device_order() -> None:
    """Consecutive devices listed server by server keep tp 2 groups inside a server; listed alternately, the first
    group holds n0.g0 and n1.g0. The count of each server (server_share) cannot see the order; this can."""
    cluster = cluster_from_dict(make_cluster_dict(2, 2))
    paired = ir.Stage((0, 4), ("n0.g0", "n0.g1", "n1.g0", "n1.g1"), ("dp",) * 4, 0, tp=2)
    assert spanning_tensor_group(cluster, paired) is None
    mixed = ir.Stage((0, 4), ("n0.g0", "n1.g0", "n0.g1", "n1.g1"), ("dp",) * 4, 0, tp=2)
    assert spanning_tensor_group(cluster, mixed) == (("n0.g0", "n1.g0"), ["n0", "n1"])
    wide = ir.Stage((0, 4), paired.devices, ("dp",) * 4, 0, tp=4)
    assert spanning_tensor_group(cluster, wide) == (paired.devices, ["n0", "n1"])
    assert spanning_tensor_group(cluster, ir.Stage((0, 4), mixed.devices, ("dp",) * 4, 0)) is None


def test_a_nodes_threads_round_trip_and_old_files_load_without_them() -> None:
    """``planner calibrate`` writes the threads each process was measured with; run and export start them."""
    d = make_cluster_dict(2, 2)
    assert [n.threads for n in cluster_from_dict(d).nodes] == [None, None]
    assert "threads" not in cluster_from_dict(d).to_dict()["nodes"][0]
    assert cluster_from_dict(d).threads_for(["n0.g0"]) is None
    d["nodes"][0]["threads"] = 2
    c = cluster_from_dict(d)
    assert cluster_from_dict(c.to_dict()) == c and c.to_dict()["nodes"][0]["threads"] == 2
    assert c.threads_for(["n0.g0", "n0.g1"]) == 2 and c.threads_for(["n1.g0"]) is None
    assert c.threads_for(["n0.g1", "n1.g0"]) is None  # one node says 2, the other nothing
    d["nodes"][1]["threads"] = 2
    assert cluster_from_dict(d).threads_for(["n0.g1", "n1.g0"]) == 2
    from planner.schemas import validate

    validate(c.to_dict(), "cluster", 1, "x")


@pytest.mark.parametrize("threads", [0, -1, 1.5, True, "2", MAX_THREADS + 1])
def test_bad_threads_name_the_field(threads: Any) -> None:
    d = make_cluster_dict()
    d["nodes"][0]["threads"] = threads
    with pytest.raises(FormatError, match="threads"):
        ir.Cluster.from_dict(d)

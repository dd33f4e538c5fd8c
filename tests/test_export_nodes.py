"""export.nodes: which server runs which ranks, the launch checks and torchrun's arguments."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from planner.errors import ExportError, RunError, UsageError
from planner.export.nodes import (
    check_host_names,
    check_nnodes,
    check_node_rank,
    node_layout,
    parse_endpoint,
    rank_devices,
    rank_stage,
    torchrun_args,
)
from tests.test_runner import tiny_plan


def test_two_servers_of_two_ranks_in_stage_order() -> None:
    plan = tiny_plan("tiny_mlp", [0, 2, -1], width=2, servers=(2, 2))
    layout = node_layout(plan)
    assert layout.servers == ("n0", "n1") and layout.nproc_per_node == 2 and layout.nnodes == 2
    assert layout.devices == ("n0.g0", "n0.g1", "n1.g0", "n1.g1") == rank_devices(plan)
    assert list(layout.ranks(1)) == [2, 3]
    assert [rank_stage(plan, r) for r in range(4)] == [0, 0, 1, 1]


def test_servers_in_the_order_the_ranks_visit_them() -> None:
    plan = tiny_plan("tiny_mlp", [0, 2, -1], servers=(2, 1))
    swapped = (dataclasses.replace(plan.stages[0], devices=("n1.g0",)),
               dataclasses.replace(plan.stages[1], devices=("n0.g0",)))
    layout = node_layout(dataclasses.replace(plan, stages=swapped))
    assert layout.servers == ("n1", "n0") and layout.devices == ("n1.g0", "n0.g0")


def test_unequal_gpus_per_server_names_the_servers_and_counts() -> None:
    plan = tiny_plan("tiny_mlp", [0, 1, 2, -1], servers=(2, 2))  # 3 stages: n0 two GPUs, n1 one
    with pytest.raises(RunError) as err:
        node_layout(plan, RunError)
    assert "n0: 2, n1: 1" in err.value.cause and "--nproc-per-node" in err.value.cause


def test_ranks_that_return_to_a_server_are_refused() -> None:
    plan = tiny_plan("tiny_mlp", [0, 1, 2, -1], servers=(2, 2))
    devs = ("n0.g0", "n1.g0", "n0.g1")
    stages = tuple(dataclasses.replace(s, devices=(d,)) for s, d in zip(plan.stages, devs, strict=True))
    with pytest.raises(ExportError, match=r"rank 2 \(n0.g1\) returns to server n0"):
        node_layout(dataclasses.replace(plan, stages=stages))


def test_nnodes_must_be_the_plans_servers_or_one() -> None:
    layout = node_layout(tiny_plan("tiny_mlp", [0, 2, -1], width=2, servers=(2, 2)))
    check_nnodes(layout, 2)
    check_nnodes(layout, 1)  # every rank on this machine
    with pytest.raises(UsageError) as err:
        check_nnodes(layout, 3)
    assert "2 server(s)" in err.value.cause and "n0: 2, n1: 2" in err.value.cause and "--nnodes 2" in err.value.hint
    one = node_layout(tiny_plan("tiny_mlp", [0, 2, -1], servers=(1, 2)))
    with pytest.raises(UsageError) as err:  # its hint said "use --nnodes 1 (one launch per server), or --nnodes 1"
        check_nnodes(one, 2)
    assert err.value.hint == "leave out --nnodes: every rank runs on this machine"


def test_node_rank_must_be_below_nnodes() -> None:
    check_node_rank(2, 1)
    for nnodes, rank in ((2, 2), (2, -1), (1, 1)):
        with pytest.raises(UsageError, match=f"--node-rank {rank} is outside"):
            check_node_rank(nnodes, rank)


def test_torchrun_args_standalone_or_static_rendezvous() -> None:
    assert torchrun_args(4) == ["--standalone", "--nproc-per-node=4"]
    args = torchrun_args(2, 3, 1, "10.0.0.1:29500", 30)
    assert args == ["--nnodes=3", "--node-rank=1", "--nproc-per-node=2", "--rdzv-backend=static",
                    "--rdzv-endpoint=10.0.0.1:29500", "--rdzv-conf=timeout=30"]


def test_parse_endpoint() -> None:
    assert parse_endpoint("10.0.0.1:29500") == ("10.0.0.1", 29500)
    assert parse_endpoint("[::1]:29500") == ("::1", 29500)
    assert parse_endpoint("gpu-01.cluster.local:1") == ("gpu-01.cluster.local", 1)
    for bad in ("10.0.0.1", ":29500", "host:0", "host:port", "host:70000",
                "host:\u00b2", "host:\u0662\u0669", "a b:29500", " host:29500", "h'x:29500", "h\x1b:29500", "[]:29500"):
        with pytest.raises(UsageError, match="not HOST:PORT"):
            parse_endpoint(bad)


def test_nodes_is_pure() -> None:
    """The launch layout is plan arithmetic: importing it pulls in no torch."""
    code = "import sys, planner.export.nodes; print(any(m.split('.')[0] == 'torch' for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_host_names_are_letters_digits_dashes_dots_and_underscores() -> None:
    check_host_names(["s0", "gpu-01.cluster.local", "10.0.0.2", "box_1", "A" * 253])
    for bad in ["s0 slots=2\nevil-host slots=64", "a b", "a\tb", "-oProxyCommand=x", ".hidden", "$(id)", "n0;id",
                "\u00e4", "n0\n", "x" * 254, ""]:
        with pytest.raises(ExportError) as err:
            check_host_names(["s0", bad])
        assert err.value.cause.startswith(f"server name {bad!r} cannot go into DeepSpeed's hostfile")
        assert "nodes[].name" in err.value.hint

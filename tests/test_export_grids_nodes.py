"""Grid plans on two "servers": two launchers on this machine meet over 127.0.0.1, two workers each.

Tensor x data x pipeline plans whose device names span two servers (a cluster of 2 servers x 2
GPUs, so that each tensor group lies inside one server and pipeline or data-parallel traffic
crosses between them) are trained by (a) two torchrun launchers started with the arguments
``planner run`` and the exported scripts use (planner.export.nodes.torchrun_args: torchrun's
static rendezvous), several plans in one launch, (b) the exported ``launch_node0.sh`` and
``launch_node1.sh`` and (c) two ``planner run --nnodes 2`` launchers. In (a) and (b) every
rank's coordinates, layers, tensor-sharded and sample-split layers, ZeRO stage and wrappers are
held to the plan (tests.test_export_grids.check_grid_run) and the server it ran on to the plan's
device names; in (c) the run JSON's ranks; the losses to single-process training (fp32: 1e-5
relative) in all three.

This module is also the torchrun worker of (a): ``python -m tests.test_export_grids_nodes PLANS OUT``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from planner import ir
from planner.export.nodes import node_layout, torchrun_args
from planner.export.program import export_plan
from tests.test_export_grids import (
    FP32_TOL,
    LR,
    ROOT,
    STEPS,
    check_grid_run,
    grid_plan,
    plans_json,
    read_runs,
    train_plans,
)
from tests.test_runner import free_port, run_servers

SERVERS = (2, 2)
"""Two servers of two GPUs: node rank R runs ranks 2R and 2R + 1."""

NODE_GRIDS: dict[str, tuple[str, dict[str, Any]]] = {
    "gpt2-pp2-dp2-zero1-full": ("tiny_gpt2", {"parts": [0, 2, 6], "dp": 2, "zero": 1, "recompute": "full"}),
    "llama-pp2-dp2-zero3-selective": ("tiny_llama", {"parts": [0, 2, 4], "dp": 2, "zero": 3,
                                                     "recompute": "selective"}),
    "gpt2-pp2-tp2-sp": ("tiny_gpt2", {"parts": [0, 3, 6], "tp": 2, "sequence_parallel": True}),
    "llama-tp2-dp2-zero1-full": ("tiny_llama", {"parts": [0, 4], "tp": 2, "dp": 2, "zero": 1, "recompute": "full"}),
}


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
            "TORCHRUN": f"{sys.executable} -m torch.distributed.run"}


def check_servers(name: str, plan: ir.Plan, ranks: list[dict[str, Any]]) -> None:
    """Each rank ran on the server its device names (torchrun's node rank), so every tensor group
    inside one server, and the plan spans both servers."""
    layout = node_layout(plan)
    server_of = {g.name: node.name for node in plan.cluster.nodes for g in node.gpus}
    assert layout.nnodes == 2, name
    for r, doc in enumerate(ranks):
        assert doc["node_rank"] == layout.servers.index(server_of[layout.devices[r]]), (name, r)
    groups: dict[tuple[int, int], set[int]] = {}
    for doc in ranks:
        groups.setdefault((doc["coords"]["pp"], doc["coords"]["dp"]), set()).add(doc["node_rank"])
    assert all(len(nodes) == 1 for nodes in groups.values()), (name, groups)


@pytest.mark.slow
def test_grids_on_two_servers_train_like_one_process(tmp_path: Path) -> None:
    """GPT-2 and Llama on pp 2 x dp 2 (ZeRO-1 with full recomputation, ZeRO-3 with selective), pp 2 x tp 2
    with sequence parallelism and tp 2 x dp 2 (ZeRO-1, full recomputation): two torchrun launchers of two
    workers each, joined at a static rendezvous on 127.0.0.1, all four plans in one launch."""
    plans = {name: grid_plan(factory, **kw, servers=SERVERS) for name, (factory, kw) in NODE_GRIDS.items()}
    (tmp_path / "plans.json").write_text(plans_json(plans))
    endpoint = f"127.0.0.1:{free_port()}"
    worker = ["-m", "tests.test_export_grids_nodes", str(tmp_path / "plans.json"), str(tmp_path)]
    results = run_servers([[sys.executable, "-m", "torch.distributed.run", *torchrun_args(2, 2, r, endpoint), *worker]
                           for r in (0, 1)], tmp_path, _env(), 420)
    assert [rc for rc, _, _ in results] == [0, 0], [err[-3000:] for _, _, err in results]
    got = read_runs(plans, tmp_path, 4)
    for name, plan in plans.items():
        check_grid_run(name, plan, got[name])
        check_servers(name, plan, got[name])


@pytest.mark.slow
def test_exported_launch_scripts_train_a_tensor_by_data_grid_on_two_servers(tmp_path: Path) -> None:
    """The exported program of a tied GPT-2 on tp 2 x dp 2 (ZeRO-3, selective recomputation): a tensor group on
    each server, the data-parallel replicas across them; launch_node0.sh and launch_node1.sh meet at 127.0.0.1
    and each rank reports what it built (train.py --report)."""
    plan = grid_plan("tiny_gpt2", [0, 6], tp=2, dp=2, zero=3, recompute="selective", servers=SERVERS)
    export_plan(plan, "torch", tmp_path / "program")
    report = tmp_path / "report"
    report.mkdir()
    endpoint = f"127.0.0.1:{free_port()}"
    args = ["--model", plan.model, "--steps", str(STEPS), "--lr", str(LR), "--report", str(report)]
    results = run_servers([["sh", str(tmp_path / "program" / f"launch_node{r}.sh"), endpoint, *args] for r in (0, 1)],
                          tmp_path, _env(), 300, cwd=tmp_path)
    assert [rc for rc, _, _ in results] == [0, 0], [err[-3000:] for _, _, err in results]
    ranks = [json.loads((report / f"rank{r}.json").read_text()) for r in range(plan.world_size)]
    check_grid_run("gpt2-tp2-dp2-zero3-selective", plan, ranks)
    check_servers("gpt2-tp2-dp2-zero3-selective", plan, ranks)
    assert "step 2 loss" in results[0][1]


@pytest.mark.slow
def test_planner_run_on_two_servers_checks_a_tensor_by_pipeline_grid(tmp_path: Path) -> None:
    """`planner run --nnodes 2` per server on a tiny Llama, pp 2 x tp 2 with sequence parallelism: a stage and
    its tensor group per server; both launchers get the same run JSON, losses equal to one process (--check)."""
    plan = grid_plan("tiny_llama", [0, 2, 4], tp=2, sequence_parallel=True, servers=SERVERS)
    (tmp_path / "plan.json").write_text(json.dumps(plan.to_dict()))
    endpoint = f"127.0.0.1:{free_port()}"
    run = [sys.executable, "-m", "planner", "run", str(tmp_path / "plan.json"), "--model", plan.model, "--engine",
           "torch", "--steps", str(STEPS), "--warmup", "1", "--threads", "1", "--nnodes", "2", "--rdzv-endpoint",
           endpoint, "--json"]
    results = run_servers([[*run, "--node-rank", "0", "--check"], [*run, "--node-rank", "1"]], tmp_path, _env(), 300)
    assert [rc for rc, _, _ in results] == [0, 0], [err[-3000:] for _, _, err in results]
    docs = [json.loads(out) for _, out, _ in results]
    assert docs[0]["max_rel_loss_diff"] < FP32_TOL and docs[0]["losses"] == docs[1]["losses"]
    assert [(r["rank"], r["node_rank"], r["device"], r["stage"]) for r in docs[1]["ranks"]] == [
        (0, 0, "n0.g0", 0), (1, 0, "n0.g1", 0), (2, 1, "n1.g0", 1), (3, 1, "n1.g1", 1)]


if __name__ == "__main__":  # the torchrun worker of test_grids_on_two_servers_train_like_one_process
    train_plans(Path(sys.argv[1]).read_text(), sys.argv[2])

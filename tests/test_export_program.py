"""export.program: the folder's files, a launch script per server, DeepSpeed's hostfile, the shared check."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.errors import ExportError, PlanError
from planner.export.program import export_plan, program_files, server_commands
from tests.test_runner import tiny_plan


def test_two_servers_get_a_launch_script_each_and_a_hostfile() -> None:
    plan = tiny_plan("tiny_mlp", [0, 2, -1], width=2, servers=(2, 2))
    files = program_files(plan, "deepspeed")
    assert files["hostfile"] == "n0 slots=2\nn1 slots=2\n"
    for rank in (0, 1):
        text = files[f"launch_node{rank}.sh"]
        assert f"--nnodes=2 --node-rank={rank} --nproc-per-node=2 --rdzv-backend=static" in text
        assert 'ENDPOINT="${RDZV_ENDPOINT:-127.0.0.1:29500}"' in text and "train.py \"$@\"" in text
    assert "ranks 2-3 on n1.g0 n1.g1" in files["launch_node1.sh"]
    assert "sh launch_node1.sh HOST:PORT   # on server n1" in files["README.md"]
    assert "deepspeed --hostfile hostfile" in files["README.md"]
    assert server_commands(plan, "out dir")[1] == "server n1: cd 'out dir' && sh launch_node1.sh HOST:PORT"


def test_one_server_gets_one_standalone_script() -> None:
    files = program_files(tiny_plan("tiny_mlp", [0, 2, -1], width=2), "torch")
    assert "launch_node1.sh" not in files and "hostfile" not in files
    assert "--standalone --nproc-per-node=4 train.py" in files["launch_node0.sh"]


def test_a_plan_that_cannot_span_its_servers_says_why_in_the_readme() -> None:
    files = program_files(tiny_plan("tiny_mlp", [0, 1, 2, -1], servers=(2, 2), microbatches=3, batch=6), "torch")
    assert "launch_node1.sh" not in files and "--standalone --nproc-per-node=3" in files["launch_node0.sh"]
    assert "cannot be started server by server: the plan uses different numbers of GPUs per server (n0: 2, n1: 1)" \
        in files["README.md"]


def test_the_shared_runnability_check_refuses_first(tmp_path: Path) -> None:
    """DeepSpeed's own check takes gpipe (it runs 1F1B); planner.runnable does not: nothing is written."""
    with pytest.raises(PlanError, match="deepspeed runs the schedules 1f1b, not 'gpipe'"):
        export_plan(tiny_plan("tiny_mlp", [0, 2, -1], schedule="gpipe"), "deepspeed", tmp_path / "x")
    assert not (tmp_path / "x").exists()
    with pytest.raises(ExportError, match="unknown engine"):
        program_files(tiny_plan("tiny_mlp", [0, 2, -1]), "megatron")


def test_scripts_are_executable(tmp_path: Path) -> None:
    written = export_plan(tiny_plan("tiny_mlp", [0, 2, -1], servers=(2, 1)), "torch", tmp_path)
    assert {p.name for p in written} == {"plan.json", "train.py", "launch_node0.sh", "launch_node1.sh", "README.md"}
    assert all((tmp_path / n).stat().st_mode & 0o111 for n in ("train.py", "launch_node0.sh", "launch_node1.sh"))

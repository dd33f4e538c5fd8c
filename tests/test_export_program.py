"""export.program: the folder's files, a launch script per server, DeepSpeed's hostfile, the shared check."""

from __future__ import annotations

import dataclasses
import shlex
import subprocess
from pathlib import Path

import pytest

from planner import ir
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
    assert "# Every rank on this server (4 processes)" in files["launch_node0.sh"]
    one = program_files(tiny_plan("tiny_mlp", [0, -1]), "torch")["launch_node0.sh"]
    assert "# Every rank on this server (1 process):" in one  # not "1 processes"


def test_a_plan_with_different_process_counts_per_server_is_refused() -> None:
    """torchrun and DeepSpeed's hostfile start as many processes on every server: 2 on n0 and 1 on n1 cannot run."""
    plan = tiny_plan("tiny_mlp", [0, 1, 2, -1], servers=(2, 2), microbatches=3, batch=6)
    for engine in ("torch", "deepspeed"):
        with pytest.raises(PlanError, match=r"different numbers of processes per server \(n0: 2, n1: 1\)"):
            program_files(plan, engine)


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


def _renamed(plan: ir.Plan, servers: dict[str, str], device: str = "") -> ir.Plan:
    """``plan`` with its cluster's servers renamed (and, with ``device``, n1.g1 renamed to it)."""
    doc = plan.to_dict()
    for node in doc["cluster"]["nodes"]:
        node["name"] = servers.get(node["name"], node["name"])
        for gpu in node["gpus"]:
            gpu["name"] = device if device and gpu["name"] == "n1.g1" else gpu["name"]
    for stage in doc["stages"]:
        stage["devices"] = [device if device and d == "n1.g1" else d for d in stage["devices"]]
    return ir.Plan.from_dict(doc)


@pytest.mark.parametrize("name", ["s0 slots=2\nevil-host slots=64\n#", "a b", "$(touch PWNED)", "-oProxy", "n0;id",
                                  "n\u00e4", "x" * 254])
def test_a_server_that_is_not_a_host_name_is_refused_before_the_hostfile(tmp_path: Path, name: str) -> None:
    plan = _renamed(tiny_plan("tiny_mlp", [0, 2, -1], width=2, servers=(2, 2)), {"n1": name})
    with pytest.raises(ExportError) as err:
        export_plan(plan, "deepspeed", tmp_path / "x")
    assert f"server name {name!r} cannot go into DeepSpeed's hostfile" in err.value.cause
    assert "letters, digits" in err.value.cause and "rename the server" in err.value.hint
    assert not (tmp_path / "x").exists()


def test_the_hostfile_has_one_line_per_server_and_takes_host_names() -> None:
    names = {"n0": "gpu-01.cluster.local", "n1": "10.0.0.2"}
    files = program_files(_renamed(tiny_plan("tiny_mlp", [0, 2, -1], width=2, servers=(2, 2)), names), "deepspeed")
    assert files["hostfile"].splitlines() == ["gpu-01.cluster.local slots=2", "10.0.0.2 slots=2"]
    one = program_files(_renamed(tiny_plan("tiny_mlp", [0, 2, -1]), {"n0": "box_1"}), "deepspeed")
    assert one["hostfile"] == "box_1 slots=2\n"


def test_launch_scripts_and_readme_keep_hostile_names_in_one_comment_line(tmp_path: Path) -> None:
    """torch needs no host names: odd server and device names only label the scripts, one printable line each."""
    plan = tiny_plan("tiny_mlp", [0, 2, -1], width=2, servers=(2, 2))
    server, device = "n1\nid > PWNED\n#", "g\r$(id)\x1b[2J"
    files, ordinary = program_files(_renamed(plan, {"n1": server}, device), "torch"), program_files(plan, "torch")
    for name in ("launch_node0.sh", "launch_node1.sh"):
        lines, plain = files[name].splitlines(), ordinary[name].splitlines()
        assert len(lines) == len(plain)
        assert [ln for ln in lines if not ln.startswith("#")] == [ln for ln in plain if not ln.startswith("#")]
        subprocess.run(["sh", "-n"], input=files[name], text=True, check=True)
    assert f"# Server {server!r} (node rank 1 of 2): ranks 2-3 on n1.g0 {device!r}." in files["launch_node1.sh"]
    assert files["README.md"].count("\n") == ordinary["README.md"].count("\n")
    assert f"# on server {server!r}" in files["README.md"]
    commands = server_commands(_renamed(plan, {"n1": server}), "o")
    assert commands[1] == f"server {server!r}: cd o && sh launch_node1.sh HOST:PORT"


def test_torchrun_arguments_are_shell_quoted() -> None:
    files = program_files(tiny_plan("tiny_mlp", [0, 2, -1], width=2, servers=(2, 2)), "torch")
    command = files["launch_node1.sh"].split("\nexec ")[1].replace("\\\n", " ")
    assert shlex.split(command)[1:6] == ["--nnodes=2", "--node-rank=1", "--nproc-per-node=2",
                                           "--rdzv-backend=static", '--rdzv-endpoint=$ENDPOINT']


@pytest.mark.parametrize("servers", [(1, 8), (2, 2)])
def test_a_factory_models_launch_script_keeps_the_folder_it_is_started_in_importable(tmp_path: Path,
                                                                                     servers: tuple[int, int]) -> None:
    """A plan of ``package.module:factory`` imports that module on every rank. The launch script changes to its
    own folder (and torchrun puts the script's folder on sys.path), so that started from where the model was
    profiled it failed with "No module named 'examples'"; now that folder goes on PYTHONPATH, after the caller's."""
    out, code = tmp_path / "out" / "program", tmp_path / "code"
    code.mkdir()
    export_plan(tiny_plan("tiny_mlp", [0, 2, -1], width=2, servers=servers), "torch", out)
    fake = tmp_path / "torchrun"
    fake.write_text('#!/bin/sh\necho "$PYTHONPATH"\npwd\n')
    fake.chmod(0o755)
    done = subprocess.run(["sh", str(out / "launch_node0.sh"), "127.0.0.1:29400"], capture_output=True, text=True,
                          cwd=code, env={"PATH": "/usr/bin:/bin", "TORCHRUN": str(fake), "PYTHONPATH": "/elsewhere"},
                          timeout=60, check=True)
    assert done.stdout.splitlines() == [f"/elsewhere:{code}", str(out)]
    readme = (out / "README.md").read_text()
    assert "imports your model's module `tests.test_runner`" in readme and "PYTHONPATH" in readme
    if servers == (1, 8):
        assert "sh launch_node0.sh   # the same, started from any folder" in readme


def test_a_zoo_models_launch_script_leaves_pythonpath_alone() -> None:
    plan = tiny_plan("tiny_mlp", [0, 2, -1], width=2)
    zoo = dataclasses.replace(plan, profile=dataclasses.replace(plan.profile, model="mlp"))
    files = program_files(zoo, "deepspeed")
    assert "PYTHONPATH" not in files["launch_node0.sh"] and "PYTHONPATH" not in files["README.md"]
    assert "`--lr LR`, `--seed N`" in files["README.md"]


@pytest.mark.parametrize("servers", [(1, 8), (2, 2)])
def test_the_launch_scripts_start_the_threads_the_devices_were_measured_with(tmp_path: Path,
                                                                            servers: tuple[int, int]) -> None:
    """A plan on a calibrated cluster (its nodes' ``threads``) runs each process with them, as ``planner run``
    does, unless the caller sets OMP_NUM_THREADS; a cluster that says nothing leaves torch's default alone."""
    from tests.test_runner import _measured_with

    plan = tiny_plan("tiny_mlp", [0, 2, -1], width=2, servers=servers)
    assert "OMP_NUM_THREADS" not in program_files(plan, "torch")["launch_node0.sh"]
    out = tmp_path / "program"
    export_plan(_measured_with(plan, 3), "torch", out)
    fake = tmp_path / "torchrun"
    fake.write_text('#!/bin/sh\necho "$OMP_NUM_THREADS"\n')
    fake.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "TORCHRUN": str(fake)}
    for caller, threads in (({}, "3"), ({"OMP_NUM_THREADS": "5"}, "5")):
        done = subprocess.run(["sh", str(out / "launch_node0.sh"), "127.0.0.1:29400"], capture_output=True,
                              text=True, env={**env, **caller}, timeout=60, check=True)
        assert done.stdout.split() == [threads]

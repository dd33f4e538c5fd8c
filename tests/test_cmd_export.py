"""planner export: writes a runnable program, refuses what the engine cannot run."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from planner import ir
from planner.cli import main
from planner.commands.export import KIND, VERSION, document
from tests.test_runner import free_port, run_servers, tiny_plan

ROOT = Path(__file__).resolve().parents[1]


def _write(tmp_path: Path, **kw: object) -> str:
    plan = tiny_plan("tiny_mlp", [0, 2, -1], **kw)  # type: ignore[arg-type]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.to_dict()))
    return str(path)


def test_export_deepspeed_writes_script_config_and_plan(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    res = CliRunner().invoke(main, ["export", _write(tmp_path, width=2), "--to", "deepspeed", "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert (doc["kind"], doc["version"], doc["engine"], doc["world_size"]) == ("export", 1, "deepspeed", 4)
    assert doc["commands"] == [f"cd {shlex.quote(str(out))} && sh launch_node0.sh"]
    assert {p.name for p in out.iterdir()} == {"train.py", "ds_config.json", "plan.json", "README.md", "hostfile",
                                            "launch_node0.sh"}
    cfg = json.loads((out / "ds_config.json").read_text())
    assert cfg["gradient_accumulation_steps"] == 2
    assert json.loads((out / "plan.json").read_text())["kind"] == "plan"


def test_export_torch(tmp_path: Path) -> None:
    out = tmp_path / "t"
    res = CliRunner().invoke(main, ["export", _write(tmp_path, schedule="gpipe"), "--to", "torch", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "ScheduleGPipe" in (out / "train.py").read_text()


def test_export_torch_json_document_carries_kind_and_version(tmp_path: Path) -> None:
    """Once only engine, world_size, files, commands and warnings (docs/contracts.md: every document has both)."""
    out = tmp_path / "t"
    res = CliRunner().invoke(main, ["export", _write(tmp_path), "--to", "torch", "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert list(doc) == ["kind", "version", "engine", "world_size", "files", "commands", "warnings"]
    assert (doc["kind"], doc["version"], doc["engine"]) == (KIND, VERSION, "torch") == ("export", 1, "torch")
    assert {Path(f).name for f in doc["files"]} == {p.name for p in out.iterdir()}


def test_document_lists_the_paths_as_strings() -> None:
    doc = document("torch", 2, [Path("o") / "train.py"], ["cd o && sh launch_node0.sh"], ["w"])
    assert doc == {"kind": "export", "version": 1, "engine": "torch", "world_size": 2, "files": ["o/train.py"],
                   "commands": ["cd o && sh launch_node0.sh"], "warnings": ["w"]}


def test_deepspeed_refuses_split_forms_with_a_hint(tmp_path: Path) -> None:
    path = _write(tmp_path, width=2, forms=[["split_out", "dp"], ["dp", "dp"]])
    res = CliRunner().invoke(main, ["export", path, "--to", "deepspeed", "-o", str(tmp_path / "x")])
    assert res.exit_code == 1
    assert "stage 0" in res.stderr and "--engine deepspeed" in res.stderr
    assert not (tmp_path / "x").exists()


def test_an_earlier_exports_files_this_one_does_not_write_are_refused(tmp_path: Path) -> None:
    """A DeepSpeed export on two servers, then a torch export on one into the same folder: the old
    launch_node1.sh, ds_config.json and hostfile would stay beside the new train.py (exit 1, nothing written)."""
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["export", _write(tmp_path, servers=(2, 1)), "--to", "deepspeed", "-o", str(out)])
    assert res.exit_code == 0, res.output
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    res = CliRunner().invoke(main, ["export", _write(tmp_path), "--to", "torch", "-o", str(out), "--json"])
    assert res.exit_code == 1 and res.stdout == "" and "Traceback" not in res.stderr
    assert "ds_config.json, hostfile, launch_node1.sh from an earlier export" in res.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    (out / "keep.txt").write_text("mine")  # other files, and the same export again, are fine
    res = CliRunner().invoke(main, ["export", _write(tmp_path, servers=(2, 1)), "--to", "deepspeed", "-o", str(out)])
    assert res.exit_code == 0, res.output


def test_not_a_plan(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"kind": "profile", "version": 1}')
    res = CliRunner().invoke(main, ["export", str(bad), "--to", "torch", "-o", str(tmp_path / "y")])
    assert res.exit_code == 1 and "kind" in res.stderr



@pytest.mark.parametrize("name", ["s0 slots=2\nevil-host slots=64\n#", "my server"])
def test_deepspeed_refuses_a_server_name_that_is_not_a_host_name(tmp_path: Path, name: str) -> None:
    """A newline in a server name once added hosts to the hostfile; nothing is written."""
    doc = tiny_plan("tiny_mlp", [0, 2, -1], width=2, servers=(2, 2)).to_dict()
    doc["cluster"]["nodes"][1]["name"] = name
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    res = CliRunner().invoke(main, ["export", str(path), "--to", "deepspeed", "-o", str(tmp_path / "x")])
    assert res.exit_code == 1, res.output
    assert "cannot go into DeepSpeed's hostfile: a host name is letters, digits" in res.stderr
    assert "slots=2" in res.stderr if "\n" in name else "'my server'" in res.stderr
    assert "hint: rename the server" in res.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("engine", ["deepspeed", "torch"])
def test_a_hostile_model_name_writes_a_script_that_compiles(tmp_path: Path, engine: str) -> None:
    """The fuzzer's model names: a triple quote closing the docstring, a newline and code after it."""
    for i, name in enumerate(['mlp"""; import os; os.system("id") #\\', 'mlp\n"""\nraise SystemExit(42)\n"""']):
        doc = tiny_plan("tiny_mlp", [0, 2, -1]).to_dict()
        doc["model"] = doc["profile"]["model"] = name
        path = tmp_path / f"plan{i}.json"
        path.write_text(json.dumps(doc))
        out = tmp_path / f"{engine}{i}"
        res = CliRunner().invoke(main, ["export", str(path), "--to", engine, "-o", str(out)])
        assert res.exit_code == 0, res.output
        compile((out / "train.py").read_text(), "train.py", "exec")

@pytest.mark.slow
@pytest.mark.parametrize(("engine", "precision"), [("deepspeed", "fp32"), ("torch", "fp32"), ("deepspeed", "bf16")])
def test_exported_script_trains_under_torchrun(tmp_path: Path, engine: str, precision: str) -> None:
    """bf16 under DeepSpeed: the MLP's float inputs meet its bf16 weights in bf16 (they once did not). Each torch
    rank reports (--report) that it freed the weights of the other stage's layers (planner.export.building)."""
    out = tmp_path / engine
    path = Path(_write(tmp_path))
    path.write_text(json.dumps({**json.loads(path.read_text()), "precision": precision}))
    res = CliRunner().invoke(main, ["export", str(path), "--to", engine, "-o", str(out)])
    assert res.exit_code == 0, res.output
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DS_ACCELERATOR": "cpu",
           "TORCHRUN": f"{sys.executable} -m torch.distributed.run"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "train.py"]
    launch = ["sh", "launch_node0.sh", "--report", str(tmp_path)]  # torch: through its one-server launch script
    run = subprocess.run([*(torchrun if engine == "deepspeed" else launch), "--model", "tests.test_runner:tiny_mlp",
                          "--steps", "2"], cwd=out, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"{run.stderr[:3000]}\n...\n{run.stderr[-2000:]}"
    assert "step 1 loss" in run.stdout
    if engine == "torch":
        plan = ir.Plan.from_dict(json.loads(path.read_text()))
        for rank, other in ((0, plan.stages[1]), (1, plan.stages[0])):
            report = json.loads((tmp_path / f"rank{rank}.json").read_text())
            assert report["released_layers"] == [i for i in range(*other.layers) if plan.profile.layers[i].param_count]


@pytest.mark.slow
def test_exported_launch_scripts_train_on_two_servers(tmp_path: Path) -> None:
    """launch_node0.sh and launch_node1.sh (two DeepSpeed workers each) meet at 127.0.0.1:PORT."""
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(tiny_plan("tiny_mlp", [0, 2, -1], width=2, servers=(2, 2)).to_dict()))
    out = tmp_path / "ds"
    res = CliRunner().invoke(main, ["export", str(path), "--to", "deepspeed", "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["commands"][1].endswith("sh launch_node1.sh HOST:PORT")
    assert (out / "hostfile").read_text() == "n0 slots=2\nn1 slots=2\n"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1",
           "TORCHRUN": f"{sys.executable} -m torch.distributed.run"}
    endpoint = f"127.0.0.1:{free_port()}"
    results = run_servers([["sh", str(out / f"launch_node{r}.sh"), endpoint, "--model", "tests.test_runner:tiny_mlp",
                            "--steps", "2"] for r in (0, 1)], tmp_path, env, 300, cwd=tmp_path)
    assert [rc for rc, _, _ in results] == [0, 0], [err[-2000:] for _, _, err in results]
    assert "step 1 loss" in results[0][1]

"""export.launched: a generated train.py refuses a launch that cannot run its plan, in one error line, before it
builds anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.errors import ExportError, RunError
from planner.export.launched import check_launch, run
from planner.export.program import export_plan
from tests.test_runner import tiny_plan

ROOT = Path(__file__).resolve().parents[1]


def _env(world: int, local: int | None = None, local_name: str = "LOCAL_WORLD_SIZE") -> dict[str, str]:
    env = {"RANK": "0", "WORLD_SIZE": str(world)}
    return env if local is None else {**env, local_name: str(local)}


def test_a_launch_with_the_plans_processes_passes() -> None:
    plan = tiny_plan("tiny_mlp", [0, 2, -1], width=2)  # 4 processes
    check_launch(plan, _env(4, 4))
    check_launch(plan, _env(4, 4), gpus=4)
    check_launch(plan, _env(4, 4, "LOCAL_SIZE"), gpus=8)  # DeepSpeed's launcher names it LOCAL_SIZE


def test_a_process_started_without_a_launcher_is_told_how_to_start_it() -> None:
    """torch's rendezvous said "environment variable RANK expected", DeepSpeed's "No module named 'mpi4py'"."""
    plan = tiny_plan("tiny_mlp", [0, 2, -1], width=2, servers=(2, 2))
    with pytest.raises(ExportError, match=r"started without a launcher .* the plan runs 4 processes") as err:
        check_launch(plan, {})
    assert "torchrun --standalone --nproc-per-node 4 train.py" in err.value.hint
    assert "sh launch_node<R>.sh HOST:PORT on each of the plan's 2 servers (2 processes each)" in err.value.hint


@pytest.mark.parametrize("started", [1, 2, 8])
def test_another_number_of_processes_is_refused_with_both(started: int) -> None:
    """DeepSpeed's topology failed with "Invalid Grid" (fewer) or "rank 2 not found in topology" (more)."""
    plan = tiny_plan("tiny_mlp", [0, 2, -1], width=2)
    with pytest.raises(ExportError, match=rf"the plan runs 4 processes \(config 2-2\), {started} were started"):
        check_launch(plan, _env(started))


def test_more_processes_on_a_server_than_it_has_gpus_are_refused() -> None:
    """Each process takes the GPU of its local rank: a 4-process server with 2 GPUs failed on "invalid device
    ordinal" inside torch."""
    plan = tiny_plan("tiny_mlp", [0, 2, -1], width=2)
    with pytest.raises(ExportError, match=r"starts 4 processes, one per GPU, and has 2 GPU\(s\)"):
        check_launch(plan, _env(4, 4), gpus=2)
    check_launch(plan, _env(4, 4), gpus=0)  # the CPU: any number of processes


def test_run_prints_a_refusal_as_error_and_hint_lines(capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")

    def main() -> None:
        raise RunError("the model has 34 layers\nbut the plan 4", "run it with --model gpt2")

    with pytest.raises(SystemExit) as exit_:
        run(main)
    assert exit_.value.code == 1
    assert capsys.readouterr().err.splitlines() == [
        "[rank 3] error: 'the model has 34 layers\\nbut the plan 4'", "[rank 3] hint: run it with --model gpt2"]
    run(lambda: None)  # nothing to report: returns


@pytest.mark.parametrize("engine", ["torch", "deepspeed"])
def test_an_exported_program_started_without_a_launcher_says_so(tmp_path: Path, engine: str) -> None:
    export_plan(tiny_plan("tiny_mlp", [0, 2, -1]), engine, tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    done = subprocess.run([sys.executable, str(tmp_path / "train.py"), "--steps", "1"], capture_output=True, text=True,
                          env={**env, "PYTHONPATH": str(ROOT)}, cwd=tmp_path, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "error: train.py was started without a launcher" in done.stderr and "Traceback" not in done.stderr

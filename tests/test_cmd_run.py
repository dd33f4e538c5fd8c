"""planner run: the CLI over runner.run_plan (JSON contract, exit codes)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from planner.cli import main
from tests.test_runner import free_port, run_servers, tiny_plan

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _cwd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def _write(tmp_path: Path, threads: int | None = None, **kw: object) -> str:
    """A 2-stage plan of tests.test_runner's tiny_mlp; ``threads``: its devices' (a calibrated cluster's)."""
    plan = tiny_plan("tiny_mlp", [0, 2, -1], **kw)  # type: ignore[arg-type]
    doc = plan.to_dict()
    for node in doc["cluster"]["nodes"] if threads is not None else []:
        node["threads"] = threads
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.slow
def test_run_json_contract(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for where in ("planner.cores", "planner.runner.launch"):
        monkeypatch.setattr(f"{where}.usable_cores", lambda: 64)  # the cores' share would be 32 threads
    res = CliRunner().invoke(main, ["run", _write(tmp_path, threads=2), "--model", "tests.test_runner:tiny_mlp",
                                    "--engine", "torch", "--steps", "3", "--warmup", "1", "--check", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    for key in ("engine", "world_size", "measured_iteration_s", "predicted_iteration_s", "losses",
                "reference_losses", "max_rel_loss_diff", "max_rel_weight_diff", "worst_weight", "weights_compared",
                "weights_missing", "weights_unjudged"):
        assert key in doc
    assert doc["world_size"] == 2 and len(doc["losses"]) == 3 and doc["max_rel_loss_diff"] < 1e-5
    assert doc["threads"] == 2  # each process as its device was measured (the cluster's node), not the cores' share
    # tiny_mlp: 4 Linears' weights and biases, each reported by the rank that runs it, as one process's
    assert doc["weights_compared"] == 8 and doc["weights_missing"] == [] and doc["max_rel_weight_diff"] < 1e-2
    assert (doc["kind"], doc["version"]) == ("run", 1)
    assert [(r["rank"], r["device"], r["stage"]) for r in doc["ranks"]] == [(0, "n0.g0", 0), (1, "n0.g1", 1)]
    assert doc["peak_memory_bytes"] == max(r["peak_memory_bytes"] for r in doc["ranks"]) > 0
    # tiny_plan is for any engine (and predicts no memory): the run predicts it as torch runs it, and says so
    assert all(r["predicted_memory_bytes"] > 0 for r in doc["ranks"])
    assert [w for w in doc["warnings"] if "searched for any engine (no --engine), not torch" in w]
    from planner.runner.terms import MEASURED, PREDICTED

    assert [(s["stage"], s["ranks"]) for s in doc["stages"]] == [(0, [0]), (1, [1])]
    for stage in doc["stages"]:
        assert set(stage["measured"]) == set(MEASURED) and set(stage["predicted"]) == set(PREDICTED)
        assert stage["measured"]["compute"] > 0 and min(stage["measured"].values()) >= 0
        assert stage["predicted"]["compute"] > 0 and stage["predicted"]["engine"] == 0  # no overheads measured
        busy_and_idle = sum(t for name, t in stage["predicted"].items() if name != "transfers")
        assert busy_and_idle == pytest.approx(doc["predicted_iteration_s"])


@pytest.mark.slow
def test_two_servers_on_this_machine_train_like_one_process(tmp_path: Path) -> None:
    """Two `planner run` launchers (node ranks 0 and 1, one worker each) meet at 127.0.0.1:PORT."""
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(tiny_plan("tiny_mlp", [0, 2, -1], servers=(2, 1)).to_dict()))
    port = free_port()

    def server(rank: int) -> list[str]:
        return [sys.executable, "-m", "planner", "run", str(path), "--model", "tests.test_runner:tiny_mlp",
                "--engine", "torch", "--steps", "3", "--warmup", "1", "--threads", "1", "--nnodes", "2",
                "--node-rank", str(rank), "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-timeout", "60",
                "--json", *(["--check"] if rank == 0 else [])]

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    results = run_servers([server(0), server(1)], tmp_path, env, 300)
    assert [rc for rc, _, _ in results] == [0, 0], [err[-2000:] for _, _, err in results]
    docs = [json.loads(out) for _, out, _ in results]
    assert [d["node_rank"] for d in docs] == [0, 1] and docs[0]["losses"] == docs[1]["losses"]
    assert docs[0]["max_rel_loss_diff"] < 1e-5
    assert [(r["rank"], r["node_rank"], r["device"], r["stage"]) for r in docs[1]["ranks"]] == [
        (0, 0, "n0.g0", 0), (1, 1, "n1.g0", 1)]  # node rank: the launcher that really ran the rank
    assert "node rank 1: planner run" in results[0][2]  # the command for every server


@pytest.mark.slow
def test_a_zoo_transformer_profiled_with_set_overrides_runs_by_its_name(tmp_path: Path) -> None:
    """profile gpt2 --set ..., search, run --model gpt2: the run builds the profiled (tiny) gpt2 from the
    overrides the profile recorded (it once built the full-size one: "the model has 14 layers but ... 4")."""
    from tests.conftest import make_cluster_dict

    prof, plan, cluster = tmp_path / "g.json", tmp_path / "plan.json", tmp_path / "cpu2.json"
    cluster.write_text(json.dumps(make_cluster_dict(1, 2)))
    sets = [a for kv in ("n_layer=2", "n_embd=32", "n_head=2", "vocab_size=64") for a in ("--set", kv)]
    steps = [["profile", "gpt2", *sets, "--input-shape", "8", "--batch-size", "4", "--repeats", "1", "--warmup", "0",
              "--threads", "1", "-o", str(prof)],
             ["search", str(prof), "--cluster", str(cluster), "--engine", "deepspeed", "--config", "1-1",
              "-o", str(plan)]]
    for args in steps:
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["run", str(plan), "--model", "gpt2", "--engine", "deepspeed", "--steps", "2",
                                    "--warmup", "1", "--threads", "1", "--check", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["world_size"] == 2 and doc["max_rel_loss_diff"] < 1e-5


def test_fp16_on_a_machine_without_gpus_exits_1_before_launching(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    path = Path(_write(tmp_path))
    path.write_text(json.dumps({**json.loads(path.read_text()), "precision": "fp16"}))
    res = CliRunner().invoke(main, ["run", str(path), "--model", "tests.test_runner:tiny_mlp", "--engine", "deepspeed",
                                    "--steps", "2"])
    assert res.exit_code == 1, res.output
    assert "error: the plan trains in fp16, which DeepSpeed runs only on GPUs; this machine has none" in res.stderr
    assert "hint: search the plan again with --precision bf16 or fp32" in res.stderr
    assert "Traceback" not in res.stderr and "not supported on your device" not in res.stderr


def test_node_rank_out_of_range_and_wrong_nnodes_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(tiny_plan("tiny_mlp", [0, 2, -1], servers=(2, 1)).to_dict()))
    base = ["run", str(path), "--model", "tests.test_runner:tiny_mlp", "--engine", "torch"]
    res = CliRunner().invoke(main, [*base, "--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "127.0.0.1:1"])
    assert res.exit_code == 2 and "--node-rank 2 is outside 0..1" in res.stderr
    res = CliRunner().invoke(main, [*base, "--nnodes", "4", "--rdzv-endpoint", "127.0.0.1:1"])
    assert res.exit_code == 2 and "n0: 1, n1: 1" in res.stderr and "Traceback" not in res.stderr
    assert "node rank 0:" not in res.stderr  # no command printed for servers that cannot run it
    assert res.stderr.count("hint:") == 1


def test_model_mismatch_exits_1_with_cause(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["run", _write(tmp_path), "--model", "tests.test_runner:tiny_mlp_wide",
                                    "--engine", "torch", "--steps", "2"])
    assert res.exit_code == 1
    assert "parameters" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize("seed", ["-1", "4294967296", "99999999999999999999"])
def test_a_seed_out_of_range_is_a_usage_error(tmp_path: Path, seed: str) -> None:
    """torch's generators and the data's per-step seeds overflow on huge seeds (an internal error after loading)."""
    res = CliRunner().invoke(main, ["run", _write(tmp_path), "--model", "tests.test_runner:tiny_mlp", "--engine",
                                    "torch", "--seed", seed])
    assert res.exit_code == 2 and "--seed" in res.stderr and "Traceback" not in res.stderr


def test_more_threads_than_cores_is_a_usage_error_before_anything_starts(tmp_path: Path) -> None:
    """torch starting a million threads crashed the launcher with a segmentation fault (exit 139, no message)."""
    res = CliRunner().invoke(main, ["run", _write(tmp_path), "--model", "tests.test_runner:tiny_mlp", "--engine",
                                    "torch", "--threads", "1000000"])
    assert res.exit_code == 2 and "cores this process may run on, got 1000000" in res.stderr
    assert "Traceback" not in res.stderr


def test_unknown_model_exits_1(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["run", _write(tmp_path), "--model", "nosuchmodel", "--engine", "torch"])
    assert res.exit_code == 1 and "unknown model" in res.stderr


def test_the_text_says_the_measured_terms_come_from_one_profiled_step(capsys: pytest.CaptureFixture[str]) -> None:
    from planner.commands.run import _print

    doc = {"ratio": 1.2, "measured_iteration_s": 0.006, "predicted_iteration_s": 0.005, "warmup": 1, "losses": [1.0],
           "ranks": [], "stages": [{"stage": 0, "measured": {"compute": 0.002, "other": 0.008},
                                    "predicted": {"compute": 0.003, "engine": 0.002}},
                                   {"stage": 1, "measured": None, "predicted": {"compute": 0.003}}]}
    _print(doc, 3, check=False)
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == ""  # the summary is human output: stderr (docs/contracts.md), stdout is --json's
    assert "stage 0 (ms per step)  measured (one profiled step, 10.0 in all) compute 2.0, other 8.0  predicted " \
           "compute 3.0, engine 2.0" in lines
    assert "stage 1 (ms per step)  measured -  predicted compute 3.0" in lines


@pytest.mark.parametrize("as_json", [True, False])
def test_a_check_that_departs_exits_1_with_the_step_and_no_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                as_json: bool) -> None:
    """--check whose fp32 losses depart from one process by more than 1e-5 fails (it warned and exited 0: a model
    whose factory seeded its own generator per process trained 3% off and passed); the cause names the step."""
    import planner.runner

    def run_plan(*args: object, **kwargs: object) -> dict[str, object]:
        return {"losses": [2.0, 1.9], "reference_losses": [2.0, 1.8], "max_rel_loss_diff": 0.1 / 1.8, "warnings": []}

    monkeypatch.setattr(planner.runner, "run_plan", run_plan)
    res = CliRunner().invoke(main, ["run", _write(tmp_path), "--model", "tests.test_runner:tiny_mlp", "--engine",
                                    "torch", "--check", *(["--json"] if as_json else [])])
    assert res.exit_code == 1 and res.stdout == ""
    assert ("error: --check failed: the losses depart from single-process training by 0.0556 "
            "relative, more than 1e-05 for fp32 (step 1: 1.9, in one process 1.8)\n") in res.stderr
    assert "Traceback" not in res.stderr


def test_a_check_whose_weights_depart_exits_1_naming_the_weight_and_the_text_shows_the_weights(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The losses agree and a weight departs (a frozen norm trained by Adam): exit 1, the weight named, no JSON."""
    import planner.runner
    from planner.commands.run import _print

    weights = {"max_rel_weight_diff": 142.0, "worst_weight": "1.block.ln_1.bias", "weights_compared": 29,
               "weights_missing": []}

    def run_plan(*args: object, **kwargs: object) -> dict[str, object]:
        return {"losses": [2.0, 1.9], "reference_losses": [2.0, 1.9], "max_rel_loss_diff": 0.0, "warnings": [],
                **weights}

    monkeypatch.setattr(planner.runner, "run_plan", run_plan)
    res = CliRunner().invoke(main, ["run", _write(tmp_path), "--model", "tests.test_runner:tiny_mlp", "--engine",
                                    "torch", "--check", "--json"])
    assert res.exit_code == 1 and res.stdout == "" and "Traceback" not in res.stderr
    assert "after the steps layer 1's block.ln_1.bias differs from single-process training's by 142" in res.stderr
    doc = {"ratio": None, "measured_iteration_s": 0.006, "predicted_iteration_s": 0.0, "warmup": 1, "losses": [1.0],
           "ranks": [], "reference_losses": [1.0], "max_rel_loss_diff": 0.0, **weights, "max_rel_weight_diff": 2e-6}
    _print(doc, 3, check=True)
    assert "weights   29 parameters, largest difference 2e-06 of its update (1.block.ln_1.bias)" in \
        capsys.readouterr().err.splitlines()
    _print({**doc, "weights_unjudged": ["1.block.k.bias", "2.block.k.bias"]}, 3, check=True)
    assert ("weights   29 parameters, largest difference 2e-06 of its update (1.block.ln_1.bias); 2 not judged "
            "(gradients of rounding noise)") in capsys.readouterr().err.splitlines()


def test_without_engine_a_plan_runs_on_the_engine_it_was_searched_for(tmp_path: Path) -> None:
    """--engine defaulted to deepspeed, so a plan searched for torch ran on DeepSpeed unless told."""
    import dataclasses

    from planner.engines import run_engine

    plan = tiny_plan("tiny_mlp", [0, 2, -1])
    assert [run_engine(dataclasses.replace(plan, engine=e)) for e in ("any", "deepspeed", "torch", "torchtitan")
            ] == ["deepspeed", "deepspeed", "torch", "torch"]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(dataclasses.replace(plan, engine="torch").to_dict()))
    res = CliRunner().invoke(main, ["run", str(path), "--model", "tests.test_runner:tiny_mlp", "--steps", "1",
                                    "--warmup", "0", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["engine"] == "torch"


def test_a_plan_of_engine_any_that_only_torch_runs_runs_on_torch_by_default() -> None:
    """search without --engine emits ZeRO-3 plans; --engine defaulted to deepspeed for them, which refused
    ("stage 0 uses ZeRO stage 3; deepspeed runs 0, 1") a plan torch trains."""
    import dataclasses

    from planner.engines import run_engine
    from planner.runnable import is_runnable

    plan = tiny_plan("tiny_mlp", [0, -1], 2, microbatches=1)
    zero3 = dataclasses.replace(plan, engine="any",
                                stages=tuple(dataclasses.replace(st, zero=3) for st in plan.stages))
    assert not is_runnable(zero3, "deepspeed") and is_runnable(zero3, "torch")
    assert run_engine(zero3) == "torch"
    assert run_engine(dataclasses.replace(zero3, engine="deepspeed")) == "deepspeed"  # its own engine: its refusal
    assert run_engine(dataclasses.replace(plan, engine="any")) == "deepspeed"  # deepspeed runs it: unchanged

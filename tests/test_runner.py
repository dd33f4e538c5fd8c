"""runner: real training of plans under torchrun, checked against single-process training.

The factories below are the tiny models the slow tests (and tests of the export and CLI)
train; workers import them as ``tests.test_runner:<name>``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from planner import ir
from planner.errors import PlanError, RunError, UsageError
from planner.export.layers import layer_param_counts
from planner.export.partition import manual_plan
from planner.runner import run_plan
from planner.simulate import simulate
from tests.conftest import make_cluster_dict, weights_agree

ROOT = Path(__file__).resolve().parents[1]


def tiny_mlp() -> tuple[nn.Module, torch.Tensor]:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 10)), torch.randn(8, 16)


def tiny_mlp_wide() -> tuple[nn.Module, torch.Tensor]:
    """The same layer count as tiny_mlp but other shapes: must not run tiny_mlp's plan."""
    return nn.Sequential(nn.Linear(16, 48), nn.ReLU(), nn.Linear(48, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 10)), torch.randn(8, 16)


class _Tied(nn.Module):
    def __init__(self, emb: nn.Embedding) -> None:
        super().__init__()
        self.emb = emb

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.emb(x)


class _Head(nn.Module):
    def __init__(self, emb: nn.Embedding) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(emb.embedding_dim)
        self.emb = emb

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x) @ self.emb.weight.t()


def tiny_tied() -> tuple[nn.Module, torch.Tensor]:
    """A token model whose first and last layers share the embedding (like GPT-2's wte/lm_head)."""
    emb = nn.Embedding(20, 16)
    return nn.Sequential(_Tied(emb), nn.Linear(16, 16), nn.Tanh(), _Head(emb)), torch.randint(0, 20, (8, 6))


class _Boom(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if "RANK" in os.environ:
            raise ValueError("boom from the worker")
        return x


def tiny_crash() -> tuple[nn.Module, torch.Tensor]:
    """Runs in the parent, raises in every worker."""
    m, ex = tiny_mlp()
    return nn.Sequential(*m, _Boom()), ex


def tiny_plan(factory: str, parts: list[int], width: int = 1, *, microbatches: int = 2, batch: int = 8,
              schedule: str = "1f1b", forms: list[list[str]] | None = None, optimizer: str = "sgd",
              servers: tuple[int, int] = (1, 8)) -> ir.Plan:
    """A hand-made plan over the profiled layers of ``factory`` (a function in this module).

    ``servers``: the cluster's servers and GPUs per server; stages take devices in order.
    """
    from planner.profiler.layers import split_model

    torch.manual_seed(0)
    module, example = globals()[factory]()
    split = split_model(module, example)
    layers = split.layers
    counts = layer_param_counts(layers)
    doc: dict[str, Any] = {
        "kind": "profile", "version": 1, "model": f"tests.test_runner:{factory}", "batch_size": batch,
        "dtype": "float32", "mode": "measured", "device": "cpu", "device_flops": 1e10,
        "input_shape": list(example.shape[1:]),
        "layers": [{"name": f"l{i}", "type": kind, "forward_s": 1e-4, "backward_s": 2e-4,  # the profiler's types
                    "forward_flops": 1e6, "backward_flops": 2e6, "param_count": c, "param_bytes": 4 * c,
                    "output_bytes": 1, "saved_bytes": 1}
                   for i, (kind, c) in enumerate(zip(split.types, counts, strict=True))],
    }
    parts = [p if p >= 0 else len(layers) + 1 + p for p in parts]
    cluster = ir.Cluster.from_dict(make_cluster_dict(*servers))
    return manual_plan(ir.ModelProfile.from_dict(doc), cluster, parts, width, microbatches=microbatches,
                              schedule=schedule, optimizer=optimizer, forms=forms,
                              predicted=ir.Prediction(0.01, batch / 0.01, 0.1, 0))


@pytest.fixture(autouse=True)
def _cwd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("PLANNER_TEST_MARK", uuid.uuid4().hex)  # inherited by the launched processes (_stray)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_servers(commands: list[list[str]], out: Path, env: dict[str, str], timeout_s: float,
                cwd: Path = ROOT) -> list[tuple[int, str, str]]:
    """Start every command at once (one per "server"), each in its own process group; (rc, stdout, stderr) each.

    Every group is killed when the commands end, fail or run past ``timeout_s``.
    """
    procs = []
    try:
        for i, cmd in enumerate(commands):
            with open(out / f"server{i}.out", "wb") as so, open(out / f"server{i}.err", "wb") as se:
                procs.append(subprocess.Popen(cmd, cwd=cwd, env=env, stdout=so, stderr=se, stdin=subprocess.DEVNULL,
                                              start_new_session=True))
        deadline = time.monotonic() + timeout_s
        codes = [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return [(rc, (out / f"server{i}.out").read_text(), (out / f"server{i}.err").read_text())
            for i, rc in enumerate(codes)]


def _stray() -> list[str]:
    """This test's processes still alive: those whose environment carries the test's own mark.

    (Other sessions on a shared machine run the same commands; the mark tells ours apart.)
    """
    mark = f"PLANNER_TEST_MARK={os.environ['PLANNER_TEST_MARK']}".encode()
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if mark in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") and int(pid) != os.getpid():
                out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except (OSError, ValueError):
            continue
    return out


def test_model_that_does_not_match_the_profile_is_refused_before_launch() -> None:
    plan = tiny_plan("tiny_mlp", [0, 2, -1])
    with pytest.raises(RunError, match="parameters"):
        run_plan(plan, "tests.test_runner:tiny_mlp_wide", engine="torch", steps=2, warmup=1)


def test_world_size_the_machine_cannot_start(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = tiny_plan("tiny_mlp", [0, 1, 2, 3, 4], width=2, microbatches=4, batch=16)  # 8 processes
    monkeypatch.setattr("planner.runner.launch.max_world_size", lambda: 4)
    with pytest.raises(RunError, match="8 processes"):
        run_plan(plan, "tests.test_runner:tiny_mlp", engine="torch", steps=2, warmup=1)


def test_engine_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else real(name, *a))
    with pytest.raises(RunError, match="deepspeed is not installed"):
        run_plan(tiny_plan("tiny_mlp", [0, 2, -1]), "tests.test_runner:tiny_mlp", engine="deepspeed", steps=2,
                 warmup=1)


def test_plan_the_engine_cannot_run_is_refused() -> None:
    plan = tiny_plan("tiny_mlp", [0, 2, -1], width=2, forms=[["split_out", "dp"], ["dp", "dp"]])
    with pytest.raises(PlanError, match="deepspeed runs one grid") as err:  # planner.runnable's shared check
        run_plan(plan, "tests.test_runner:tiny_mlp", engine="deepspeed", steps=2, warmup=1)
    assert "--engine deepspeed" in err.value.hint


@pytest.mark.slow
def test_deepspeed_two_stages_matches_single_process() -> None:
    plan = dataclasses.replace(tiny_plan("tiny_mlp", [0, 2, -1], microbatches=4), engine="deepspeed")
    doc = run_plan(plan, "tests.test_runner:tiny_mlp", engine="deepspeed", steps=4, warmup=1, check=True,
                   log=sys.stdout)  # the workers' output shows if this fails
    assert doc["engine"] == "deepspeed" and doc["world_size"] == 2
    assert len(doc["losses"]) == 4 and doc["measured_iteration_s"] > 0
    assert doc["predicted_iteration_s"] == pytest.approx(0.01)
    assert doc["max_rel_loss_diff"] < 1e-5 and weights_agree(doc), doc
    if Path("/proc/stat").exists():  # the cores other work used meanwhile: at most the machine's
        assert 0 <= doc["background_cores"] <= (os.cpu_count() or 1)


@pytest.mark.slow
def test_deepspeed_two_by_two_with_tied_weights() -> None:
    plan = tiny_plan("tiny_tied", [0, 1, -1], width=2, microbatches=2)
    doc = run_plan(plan, "tests.test_runner:tiny_tied", engine="deepspeed", steps=3, warmup=1, check=True,
                   log=sys.stdout)
    assert doc["world_size"] == 4
    assert doc["max_rel_loss_diff"] < 1e-5 and weights_agree(doc), doc


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["deepspeed", "torch"])
def test_a_middle_stage_frees_a_tie_group_it_does_not_hold(engine: str) -> None:
    """A tied GPT-2 on 3 stages: the middle rank frees the embedding and head it does not run (their tie group
    included), the last keeps the embedding's layer whole for its tied head (DeepSpeed builds the group as one
    module there); both train like one process (planner.export.building; measured 2.9e-8)."""
    from tests.test_export_grids import grid_plan

    plan = dataclasses.replace(grid_plan("tiny_gpt2", [0, 2, 4, 6], servers=(1, 4), microbatches=4), engine=engine)
    doc = run_plan(plan, "tests.test_export_grids:tiny_gpt2", engine=engine, steps=3, warmup=1, check=True,
                   threads=1)
    assert doc["max_rel_loss_diff"] < 1e-5 and weights_agree(doc), doc


@pytest.mark.slow
def test_deepspeed_bf16_trains_a_float_input_model_like_single_process() -> None:
    """bf16 weights with float inputs (an MLP, not token ids): the stages take their inputs in bf16
    (once: "mat1 and mat2 must have the same dtype"); the losses are those of one process computing in bf16 within
    bf16's tolerance."""
    from tests.test_export_grids import BF16_TOL

    plan = dataclasses.replace(tiny_plan("tiny_mlp", [0, 2, -1], microbatches=2), precision="bf16")
    doc = run_plan(plan, "tests.test_runner:tiny_mlp", engine="deepspeed", steps=2, warmup=1, check=True,
                   log=sys.stdout)
    assert doc["world_size"] == 2 and len(doc["losses"]) == 2
    assert doc["max_rel_loss_diff"] < BF16_TOL


def _no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)


def test_fp16_under_deepspeed_without_a_gpu_is_refused_before_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """DeepSpeed's CPU accelerator has no fp16 ("Type fp16 is not supported on your device" in a worker)."""
    _no_cuda(monkeypatch)
    monkeypatch.setattr("planner.runner.launch._run_workers", lambda *a: pytest.fail("workers launched"))
    plan = dataclasses.replace(tiny_plan("tiny_mlp", [0, 2, -1]), precision="fp16")
    with pytest.raises(RunError, match="fp16, which DeepSpeed runs only on GPUs; this machine has none") as err:
        run_plan(plan, "tests.test_runner:tiny_mlp", engine="deepspeed", steps=2, warmup=1)
    assert "--precision bf16 or fp32" in err.value.hint
    with pytest.raises(PlanError, match="trains in fp32, bf16, not fp16"):  # the torch engine trains no fp16 at all
        run_plan(plan, "tests.test_runner:tiny_mlp", engine="torch", steps=2, warmup=1)


def test_precision_the_gpus_here_cannot_run_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from planner.runner.launch import check_precision

    plan = tiny_plan("tiny_mlp", [0, 2, -1])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    with pytest.raises(RunError, match="runs only on GPUs; DS_ACCELERATOR=cpu is set"):
        check_precision(dataclasses.replace(plan, precision="fp16"), "deepspeed")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla V100")
    with pytest.raises(RunError, match=r"bf16, which this machine's GPU \(Tesla V100\) does not support") as err:
        check_precision(dataclasses.replace(plan, precision="bf16"), "torch")
    assert "--precision fp16 or fp32" in err.value.hint
    _no_cuda(monkeypatch)
    for precision in ("fp32", "bf16"):  # what the CPU runs
        check_precision(dataclasses.replace(plan, precision=precision), "deepspeed")


@pytest.mark.slow
def test_worker_crash_reports_the_workers_cause_and_leaves_no_process() -> None:
    plan = tiny_plan("tiny_crash", [0, 2, -1])
    with pytest.raises(RunError, match="boom from the worker"):
        run_plan(plan, "tests.test_runner:tiny_crash", engine="torch", steps=2, warmup=1)
    assert not _stray()


@pytest.mark.slow
def test_timeout_kills_every_worker() -> None:
    plan = tiny_plan("tiny_mlp", [0, 2, -1])
    with pytest.raises(RunError, match="did not finish"):
        run_plan(plan, "tests.test_runner:tiny_mlp", engine="torch", steps=200, warmup=1, timeout_s=1.5)
    assert not _stray()


@pytest.mark.slow
def test_rendezvous_endpoint_that_does_not_answer_is_a_run_error_within_the_timeout() -> None:
    plan = tiny_plan("tiny_mlp", [0, 2, -1], servers=(2, 1))
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(RunError) as err:
        run_plan(plan, "tests.test_runner:tiny_mlp", engine="torch", steps=2, warmup=1, nnodes=2, node_rank=1,
                 rdzv_endpoint=f"127.0.0.1:{port}", rdzv_timeout_s=3, timeout_s=120)
    assert f"rendezvous at 127.0.0.1:{port} did not complete within 3 s (node rank 1 of 2)" in err.value.cause
    assert "--rdzv-endpoint" in err.value.hint and time.monotonic() - t0 < 120
    assert not _stray()


def test_launch_that_does_not_fit_the_plans_servers_is_refused_before_starting() -> None:
    plan = tiny_plan("tiny_mlp", [0, 2, -1], servers=(2, 1))
    with pytest.raises(UsageError, match="--nnodes 3 does not fit the plan: its 2 ranks run on 2 server"):
        run_plan(plan, "tests.test_runner:tiny_mlp", engine="torch", nnodes=3, rdzv_endpoint="127.0.0.1:1")
    with pytest.raises(UsageError, match="needs --rdzv-endpoint"):
        run_plan(plan, "tests.test_runner:tiny_mlp", engine="torch", nnodes=2, node_rank=1)
    with pytest.raises(UsageError, match=r"--rdzv-endpoint 127\.0\.0\.1:1 is for a run on several servers, and "
                                         r"--nnodes is 1"):  # it was ignored: node rank 0 trained the whole plan alone
        run_plan(plan, "tests.test_runner:tiny_mlp", engine="torch", rdzv_endpoint="127.0.0.1:1")
    with pytest.raises(UsageError, match=r"--node-rank 2 is outside 0\.\.1"):
        run_plan(plan, "tests.test_runner:tiny_mlp", engine="torch", nnodes=2, node_rank=2,
                 rdzv_endpoint="127.0.0.1:1")


def test_failure_is_the_rendezvous_only_when_no_worker_started(tmp_path: Path) -> None:
    from planner.runner.launch import Launch, _failure

    launch = Launch("m", "torch", 1, 2, "mse", 0, 1, nnodes=2, node_rank=1, rdzv_endpoint="h:1", rdzv_timeout_s=5)
    rdzv = "torch.distributed.DistStoreError: Timed out after 6 seconds waiting for clients. 1/2 clients joined."
    assert _failure(launch, tmp_path, rdzv).cause.startswith("the rendezvous at h:1 did not complete within 5 s")
    workers = "RuntimeError: Connection reset by peer\nDistNetworkError: x\n[0]:\n  exitcode  : 1 (pid: 3)"
    assert _failure(launch, tmp_path, workers).cause.startswith("a worker failed: DistNetworkError: x")
    one = Launch("m", "torch", 2, 2, "mse", 0, 1)
    assert _failure(one, tmp_path, rdzv).cause.startswith("a worker failed")  # one server: no rendezvous to miss


def test_a_rendezvous_port_in_use_is_named_as_such(tmp_path: Path) -> None:
    """Node rank 0 whose endpoint's port another program holds fails at once (EADDRINUSE): it said the
    rendezvous "did not complete within 10 s" after 6 s; it says the port is taken."""
    from planner.runner.launch import Launch, _failure

    launch = Launch("m", "torch", 1, 2, "mse", 0, 1, nnodes=2, node_rank=0, rdzv_endpoint="10.0.0.1:29556",
                    rdzv_timeout_s=10)
    text = ("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
            "address. port: 29556, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use")
    err = _failure(launch, tmp_path, text)
    assert err.cause.startswith("port 29556 is already in use on this server, so node rank 0 could not host the "
                                "rendezvous at 10.0.0.1:29556: torch.distributed.DistNetworkError")
    assert "free port" in err.hint


def test_the_run_doc_of_a_plan_searched_for_another_engine_predicts_it_as_run(tmp_path: Path) -> None:
    """A plan for any engine run on DeepSpeed: ``predicted_iteration_s``, ``ratio`` and each rank's
    ``predicted_memory_bytes`` are the plan as DeepSpeed runs it (what the stages' predicted terms add up to),
    and ``warnings`` says so; the plan's own numbers were reported (its ratio 2.5, its terms 1.6x its total)."""
    from planner.runner.launch import Launch, _run_doc
    from planner.runner.terms import PREDICTED

    plan = tiny_plan("tiny_mlp", [0, 2, -1])
    res = {"iteration_s": [0.02, 0.02], "cpu_s": [0.01, 0.01], "all_cpu_s": [0.02, 0.02],
           "machine_busy_s": [0.0, 0.0], "losses": [1.0, 0.9], "peak_memory_bytes": [10, 20], "node_rank": [0, 0]}
    doc = _run_doc(plan, Launch("m", "deepspeed", 2, 2, "mse", 0, 1), 1, res)
    sim = simulate(dataclasses.replace(plan, engine="deepspeed"))
    assert doc["predicted_iteration_s"] == sim.iteration_s != plan.predicted.iteration_s
    assert doc["ratio"] == pytest.approx(0.02 / sim.iteration_s)
    peaks = {d.device: d.peak_memory_bytes for d in sim.devices}
    assert [r["predicted_memory_bytes"] for r in doc["ranks"]] == [peaks["n0.g0"], peaks["n0.g1"]]
    for stage in doc["stages"]:
        total = sum(stage["predicted"][t] for t in PREDICTED if t != "transfers")
        assert total == pytest.approx(doc["predicted_iteration_s"])
    assert len(doc["warnings"]) == 1 and "searched for any engine (no --engine), not deepspeed" in doc["warnings"][0]
    same = _run_doc(dataclasses.replace(plan, engine="deepspeed"), Launch("m", "deepspeed", 2, 2, "mse", 0, 1), 1, res)
    assert same["predicted_iteration_s"] == plan.predicted.iteration_s and same["warnings"] == []


def _measured_with(plan: ir.Plan, *threads: int | None) -> ir.Plan:
    """``plan`` on its cluster whose nodes' devices were measured with ``threads`` (one per node, cycled)."""
    nodes = tuple(dataclasses.replace(n, threads=threads[i % len(threads)]) for i, n in enumerate(plan.cluster.nodes))
    return dataclasses.replace(plan, cluster=dataclasses.replace(plan.cluster, nodes=nodes))


def test_a_run_takes_the_threads_its_devices_were_measured_with(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1-thread device's plan run on both cores of a 2-core machine ran 1.4x faster than predicted (the README's
    mlp): a run starts each process with the threads its cluster's node says, warns where it cannot or is told
    otherwise, and shares the cores out only where the cluster says nothing (GPUs, hand-written clusters)."""
    from planner.runner.launch import run_threads

    for where in ("planner.cores", "planner.runner.launch"):
        monkeypatch.setattr(f"{where}.usable_cores", lambda: 8)
    plan = tiny_plan("tiny_mlp", [0, -1])  # one process
    assert run_threads(plan, 1, None) == (8, None) and run_threads(plan, 4, None) == (2, None)
    assert run_threads(_measured_with(plan, 1), 1, None) == (1, None)
    assert run_threads(_measured_with(plan, 3), 1, 3) == (3, None)
    threads, warning = run_threads(_measured_with(plan, 1), 1, 4)
    assert threads == 4 and warning and "measured with 1" in warning and "leave out --threads" in warning
    threads, warning = run_threads(_measured_with(plan, 16), 1, None)  # measured on a larger machine
    assert threads == 8 and warning and "measured with 16" in warning and "8 cores" in warning
    two = tiny_plan("tiny_mlp", [0, 2, -1], servers=(2, 1))  # a stage on each of two servers
    assert run_threads(_measured_with(two, 1, 2), 2, None) == (4, None)  # the servers disagree: no one number
    assert run_threads(_measured_with(two, 2, 2), 2, None) == (2, None)
    with pytest.raises(UsageError, match="--threads must be 1 to the 8 cores this process may run on, got 9"):
        run_threads(plan, 1, 9)


def test_the_layers_own_limits_are_checked_before_any_process_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A DeepSpeed bf16 plan whose first stage trains nothing is refused before a worker is launched: by the
    profile's trainable counts, and where the profile says nothing of them (made before the weights were
    frozen) by the model's own layers, with the hint (a worker's refusal reached the user without it)."""
    from planner.errors import ExportError
    from planner.runner import launch
    from tests.test_export_grids import grid_plan

    plan = dataclasses.replace(grid_plan("tiny_gpt2_frozen", [0, 1, 6], precision="bf16"), engine="deepspeed")
    monkeypatch.setattr(launch, "_run_workers", lambda *a, **k: pytest.fail("workers launched"))
    with pytest.raises(PlanError, match="stage 0 trains no weight"):
        run_plan(plan, plan.model, engine="deepspeed", steps=1, warmup=0)
    layers = tuple(dataclasses.replace(x, trainable_count=None) for x in plan.profile.layers)
    unknown = dataclasses.replace(plan, profile=dataclasses.replace(plan.profile, layers=layers))
    with pytest.raises(ExportError, match="stage 0 \\(layer 0\\) has no trainable weights") as err:
        run_plan(unknown, plan.model, engine="deepspeed", steps=1, warmup=0)
    assert "--precision fp32 with --zero 0" in err.value.hint


@pytest.mark.parametrize(("option", "value"), [("steps", "3"), ("steps", 2.0), ("warmup", 1.5), ("warmup", -1),
                                                ("threads", 0), ("threads", "x"), ("seed", -1), ("seed", 2**40),
                                                ("seed", 1.5), ("nnodes", "1"), ("check", "yes"),
                                                ("timeout_s", float("nan")), ("timeout_s", 0), ("rdzv_timeout_s", -1)])
def test_a_library_callers_option_of_the_wrong_kind_is_a_usage_error_before_any_process(option: str,
                                                                                      value: object) -> None:
    """They were TypeErrors, launched (threads 0, a NaN timeout, check 'yes'), or blamed on --steps."""
    plan = tiny_plan("tiny_mlp", [0, 2, -1])
    with pytest.raises(UsageError, match=f"{option} must be"):
        run_plan(plan, "tests.test_runner:tiny_mlp", engine="torch", **{option: value})  # type: ignore[arg-type]


def test_a_rendezvous_port_another_program_holds_fails_every_node_before_launch() -> None:
    """A program listening on the endpoint's port: node rank 1 waited for its answer past --rdzv-timeout, until
    --timeout (900 s); both node ranks now fail at once, naming the port and the process that holds it."""
    plan = tiny_plan("tiny_mlp", [0, 2, -1], servers=(2, 1))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        endpoint = f"127.0.0.1:{s.getsockname()[1]}"
        for node_rank, says in ((1, "a program that is not a torch rendezvous"), (0, "is already in use")):
            t0 = time.monotonic()
            with pytest.raises(RunError, match=says) as err:
                run_plan(plan, "tests.test_runner:tiny_mlp", engine="torch", steps=2, warmup=1, nnodes=2,
                         node_rank=node_rank, rdzv_endpoint=endpoint, rdzv_timeout_s=3, timeout_s=60)
            assert f"process {os.getpid()} (" in err.value.cause and time.monotonic() - t0 < 20
    assert not _stray()

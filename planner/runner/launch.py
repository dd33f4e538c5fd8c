"""The parent of ``planner run``: check, launch torchrun for this server, read the result back.

:func:`run_plan` checks everything it can before starting processes (engine installed, plan
runnable on it, its precision trainable on this machine, servers and node rank fitting the plan,
the rendezvous endpoint's port free on node rank 0 and not another program's elsewhere (planner.runner.rendezvous),
model matching the plan's profile, processes startable), then launches
``torchrun ... -m planner.runner.worker`` in its own process group (gloo on CPU, nccl on CUDA):
``--standalone`` with every rank on this machine (``nnodes`` 1, the default), or, on several
servers, this server's ranks meeting the others at torchrun's static rendezvous at
``rdzv_endpoint`` (planner.export.nodes says which ranks each server runs). Every server's
launcher gets the same run JSON (DESIGN.md section 4 and 6).

Dropout is switched off in every run, as is a mixture of experts' router noise and sampling
(planner.export.layers.disable_dropout; synthetic data; equivalence needs a deterministic forward).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from planner import ir
from planner.cores import check_threads, usable_cores
from planner.errors import RunError, UsageError, is_whole
from planner.export import ENGINES, SEED_MAX
from planner.export.data import data_spec
from planner.export.layers import load_layers
from planner.export.losses import LOSSES
from planner.export.nodes import (
    DEFAULT_RDZV_TIMEOUT_S,
    check_nnodes,
    check_node_rank,
    node_layout,
    parse_endpoint,
    rank_chunks,
    rank_devices,
    rank_stage,
    torchrun_args,
)
from planner.export.program import engine_module
from planner.runnable import check_runnable
from planner.runner.fingerprint import weight_check
from planner.runner.machine import steps_background
from planner.runner.processes import last_lines, port_in_use, rendezvous_failure, wait_workers, worker_cause
from planner.runner.reference import max_rel_diff, reference_run
from planner.runner.rendezvous import PROBE_S, check_endpoint, in_use_error
from planner.runner.terms import AsRun, as_run_prediction, stage_terms

DEFAULT_TIMEOUT_S = 900
__all__ = ["DEFAULT_RDZV_TIMEOUT_S", "DEFAULT_TIMEOUT_S", "Launch", "run_plan"]


def engine_available(engine: str) -> None:
    """RunError unless ``engine`` is known and installed."""
    if engine not in ENGINES:
        raise RunError(f"unknown engine {engine!r}", f"use one of {', '.join(ENGINES)}")
    if engine == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
        raise RunError("engine deepspeed is not installed", "pip install 'planner[deepspeed]', or use --engine torch")
    if engine == "torch" and importlib.util.find_spec("torch.distributed.pipelining") is None:
        raise RunError(f"torch {torch.__version__} has no torch.distributed.pipelining",
                       "install torch 2.4 or newer, or use --engine deepspeed")


def check_precision(plan: ir.Plan, engine: str) -> None:
    """RunError when the workers here could not train the plan's precision: DeepSpeed's fp16 runs only
    on CUDA GPUs (its CPU accelerator refuses it), and bf16 needs a GPU that has it."""
    accelerator = os.environ.get("DS_ACCELERATOR") or ("cuda" if torch.cuda.is_available() else "cpu")
    if plan.precision == "fp16" and engine == "deepspeed" and accelerator != "cuda":
        where = "this machine has none" if not torch.cuda.is_available() else f"DS_ACCELERATOR={accelerator} is set"
        raise RunError(f"the plan trains in fp16, which DeepSpeed runs only on GPUs; {where}",
                       "search the plan again with --precision bf16 or fp32 to run it here, or run it on a CUDA "
                       "machine")
    if plan.precision == "bf16" and torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
        raise RunError(f"the plan trains in bf16, which this machine's GPU ({torch.cuda.get_device_name()}) "
                       "does not support", "search the plan again with --precision fp16 or fp32")


def max_world_size() -> int:
    """Processes this machine can start: one per GPU on CUDA, four per core on CPU (gloo)."""
    if torch.cuda.is_available():
        return torch.cuda.device_count()
    return 4 * (os.cpu_count() or 1)


@dataclass(frozen=True)
class Launch:
    """What this server's torchrun and its workers are started with."""

    model: str
    engine: str
    nproc: int  # processes on this server
    steps: int
    loss: str
    seed: int
    threads: int
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str = ""
    rdzv_timeout_s: float = DEFAULT_RDZV_TIMEOUT_S
    weights: bool = False  # report the weights' projections (--check)

    def command(self, plan_path: Path, out_dir: str) -> list[str]:
        run = torchrun_args(self.nproc, self.nnodes, self.node_rank, self.rdzv_endpoint, self.rdzv_timeout_s)
        return [sys.executable, "-m", "torch.distributed.run", *run, "-m", "planner.runner.worker",
                "--plan", str(plan_path), "--model", self.model, "--engine", self.engine, "--steps", str(self.steps),
                "--loss", self.loss, "--seed", str(self.seed), "--threads", str(self.threads), "--out", out_dir,
                *(["--weights"] if self.weights else [])]


def _check_run_types(options: dict[str, Any]) -> None:
    """UsageError for a library caller's option of the wrong type or range (the CLI's types check them there):
    whole numbers in their ranges, ``check`` a bool, the timeouts finite and positive."""
    ranges = {"steps": (1, None), "warmup": (0, None), "seed": (0, SEED_MAX), "threads": (1, None),
              "nnodes": (1, None), "node_rank": (0, None)}
    for name, (low, high) in ranges.items():
        value = options[name]
        if value is None and name == "threads":
            continue
        if not is_whole(value, low, high):
            raise UsageError(f"{name} must be a whole number from {low}{'' if high is None else f' to {high}'}, got "
                             f"{value!r:.40}", f"e.g. {name}={max(low, 1)}")
    if not isinstance(options["check"], bool):
        raise UsageError(f"check must be True or False, got {options['check']!r:.40}", "check=True")
    for name in ("timeout_s", "rdzv_timeout_s"):
        value = options[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise UsageError(f"{name} must be a positive number of seconds, got {value!r:.40}", f"e.g. {name}=600")


def _check_run_args(steps: int, warmup: int, loss: str) -> None:
    if steps < 1 or warmup < 0 or warmup >= steps:
        raise RunError(f"--steps {steps} with {warmup} warm-up steps leaves nothing to measure",
                       "use more steps than warm-up steps")
    if loss not in LOSSES:
        raise RunError(f"unknown loss {loss!r}", f"use one of {', '.join(LOSSES)}")


def local_processes(plan: ir.Plan, nnodes: int, node_rank: int, endpoint: str | None) -> int:
    """Processes this server starts; UsageError when the servers or node rank do not fit the plan."""
    check_node_rank(nnodes, node_rank)
    if nnodes == 1 and endpoint:  # it was ignored: each server then trained every rank of the plan alone
        raise UsageError(f"--rdzv-endpoint {endpoint} is for a run on several servers, and --nnodes is 1 (every "
                         "rank on this machine)", "give every server's `planner run` --nnodes N (the plan's "
                         "servers) and --node-rank, or leave out --rdzv-endpoint")
    if nnodes == 1:
        return plan.world_size
    if not endpoint:
        raise UsageError(f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT",
                         "give node rank 0's address and a free port, the same on every server")
    parse_endpoint(endpoint)
    layout = node_layout(plan, RunError)
    check_nnodes(layout, nnodes)
    return layout.nproc_per_node


def _check_processes(nproc: int) -> None:
    limit = max_world_size()
    if nproc > limit:
        where = f"{limit} CUDA devices" if torch.cuda.is_available() else f"{os.cpu_count()} cores (limit {limit})"
        raise RunError(f"the plan needs {nproc} processes; this machine can start {limit} ({where})",
                       "search a plan for a smaller cluster (planner calibrate --nproc N)")


def run_threads(plan: ir.Plan, nproc: int, threads: int | None) -> tuple[int, str | None]:
    """Torch threads per process, and a warning where they are not those the plan's prediction is for.

    ``threads`` where given (at most this machine's cores: torch crashes starting a million); else those the
    plan's devices were measured with (:attr:`planner.ir.Node.threads`, which ``planner calibrate`` writes), at
    most the cores; else the cores shared among the ``nproc`` processes."""
    if threads is not None:
        check_threads(threads, "or leave it out, to run with the threads the plan's devices were measured with")
    cores = usable_cores()
    calibrated = plan.process_threads
    chosen = threads or min(calibrated or max(1, cores // nproc), cores)
    if calibrated is None or chosen == calibrated:
        return chosen, None
    why = "leave out --threads to run as predicted" if threads else f"this machine has {cores} cores"
    return chosen, (f"{chosen} torch threads per process, but the plan's devices (cluster {plan.cluster.name!r}) "
                    f"were measured with {calibrated}, and its prediction is for them: {why}")


def _worker_env(threads: int, tmp: str) -> dict[str, str]:
    """This process's environment with the workers' threads, import path and engine settings."""
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads)
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions"))
    env.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")
    env.setdefault("TORCHELASTIC_ERROR_FILE", str(Path(tmp) / "elastic-error.json"))
    return env


def _failure(launch: Launch, tmp: Path, text: str) -> RunError:
    """The RunError of a failed launch: a worker's own cause, else the rendezvous that did not complete."""
    rdzv = rendezvous_failure(text) if launch.nnodes > 1 else None
    started = "exitcode" in text or any(tmp.glob("error-rank*.txt"))  # torchrun's summary of failed workers
    if rdzv is not None and not started and port_in_use(rdzv):
        return in_use_error(launch.rdzv_endpoint, launch.node_rank, rdzv)
    if rdzv is not None and not started:
        return RunError(f"the rendezvous at {launch.rdzv_endpoint} did not complete within "
                        f"{launch.rdzv_timeout_s:g} s (node rank {launch.node_rank} of {launch.nnodes}): {rdzv}",
                        "start `planner run` with the same --nnodes and --rdzv-endpoint (node rank 0's address "
                        "and a free port) on every server, or raise --rdzv-timeout")
    return RunError(f"a worker failed: {worker_cause(tmp, text)}",
                    "the cause is the worker's own message; fix it, or rerun with PLANNER_DEBUG=1 to see the "
                    "workers' output")


def _run_workers(plan: ir.Plan, launch: Launch, timeout_s: float, log: Any) -> dict[str, Any]:
    """Launch this server's workers under torchrun and return their result (losses, times, memory)."""
    with tempfile.TemporaryDirectory(prefix="planner-run-") as tmp:
        plan_path = Path(tmp) / "plan.json"
        plan_path.write_text(json.dumps(plan.to_dict()))
        log_path = Path(tmp) / "workers.log"
        rc = wait_workers(launch.command(plan_path, tmp), _worker_env(launch.threads, tmp), log_path, timeout_s)
        text = log_path.read_text(errors="replace")
        if log is not None:
            log.write(text)
        if rc != 0:
            raise _failure(launch, Path(tmp), text)
        result_path = Path(tmp) / "result.json"
        if not result_path.exists():
            raise RunError(f"the workers exited without a result ({last_lines(log_path)})", "report this")
        res: dict[str, Any] = json.loads(result_path.read_text())
        return res


def _ranks(plan: ir.Plan, res: dict[str, Any], as_run: AsRun) -> list[dict[str, Any]]:
    """Per rank: the node rank that ran it, its device, pipeline stage, measured and predicted peak memory
    (the plan's, or as the run's engine runs it where the plan was searched for another: ``as_run``)."""
    devices = rank_devices(plan)
    out = []
    for rank, (peak, node) in enumerate(zip(res["peak_memory_bytes"], res["node_rank"], strict=True)):
        stage, chunks = rank_stage(plan, rank), rank_chunks(plan, rank)
        predicted = as_run.peak_memory_bytes.get(devices[rank], max(c.memory_bytes for c in chunks))
        out.append({"rank": rank, "node_rank": node, "device": devices[rank], "stage": stage,
                    "peak_memory_bytes": peak, "predicted_memory_bytes": predicted})
    return out


def _background(launch: Launch, warmup: int, res: dict[str, Any]) -> float | None:
    """Cores other work on this machine used during the timed steps (planner.runner.machine);
    None on several servers (the ranks' CPU time is every server's) or where it cannot be read."""
    return None if launch.nnodes > 1 else steps_background(res, warmup)


def _run_doc(plan: ir.Plan, launch: Launch, warmup: int, res: dict[str, Any]) -> dict[str, Any]:
    """The run JSON (without the reference losses) from the workers' result."""
    times = res["iteration_s"]
    as_run = as_run_prediction(plan, launch.engine)
    ranks = _ranks(plan, res, as_run)
    doc: dict[str, Any] = {
        "kind": "run", "version": 1, "engine": launch.engine, "world_size": plan.world_size, "nnodes": launch.nnodes,
        "node_rank": launch.node_rank, "model": launch.model, "config": plan.config, "schedule": plan.schedule,
        "microbatches": plan.microbatches, "batch_size": plan.batch_size, "steps": launch.steps, "warmup": warmup,
        "threads": launch.threads, "measured_iteration_s": statistics.median(times[warmup:]),
        "predicted_iteration_s": as_run.iteration_s, "iteration_times_s": times,
        # CPU seconds of the busiest process per step (wall time well above it: waiting or
        # a machine shared with other work)
        "cpu_iteration_s": statistics.median(res["cpu_s"][warmup:]),
        "background_cores": _background(launch, warmup, res),
        "losses": res["losses"], "ranks": ranks,
        "peak_memory_bytes": max(r["peak_memory_bytes"] for r in ranks),
    }
    doc["ratio"] = doc["measured_iteration_s"] / doc["predicted_iteration_s"] if as_run.iteration_s else None
    doc["stages"] = stage_terms(plan, launch.engine, res.get("terms"), [r["stage"] for r in ranks])
    doc["warnings"] = [as_run.warning] if as_run.warning else []
    return doc


def run_plan(plan: ir.Plan, model: str, *, engine: str = "deepspeed", steps: int = 10, warmup: int = 2,
             loss: str = "cross_entropy", check: bool = False, seed: int = 0, threads: int | None = None,
             timeout_s: float = DEFAULT_TIMEOUT_S, log: Any = None, nnodes: int = 1, node_rank: int = 0,
             rdzv_endpoint: str | None = None, rdzv_timeout_s: float = DEFAULT_RDZV_TIMEOUT_S) -> dict[str, Any]:
    """Train ``plan`` for real with ``engine`` (this server's ranks); the run JSON of DESIGN.md section 4."""
    _check_run_types({"steps": steps, "warmup": warmup, "seed": seed, "threads": threads, "nnodes": nnodes,
                      "node_rank": node_rank, "check": check, "timeout_s": timeout_s, "rdzv_timeout_s": rdzv_timeout_s})
    _check_run_args(steps, warmup, loss)
    nproc = local_processes(plan, nnodes, node_rank, rdzv_endpoint)
    engine_available(engine)
    check_runnable(plan, engine)
    width: int = engine_module(engine).check_plan(plan)
    check_precision(plan, engine)
    _check_processes(nproc)
    if nnodes > 1 and rdzv_endpoint:  # a port another program holds: fail now, not after --timeout
        check_endpoint(rdzv_endpoint, node_rank, min(rdzv_timeout_s, PROBE_S))
    threads, threads_warning = run_threads(plan, nproc, threads)
    torch.set_num_threads(threads)
    layers, example = load_layers(model, plan, seed)
    engine_module(engine).check_plan(plan, layers)  # the layers' own limits, before any process starts
    spec = data_spec(layers, example, loss)
    reference = layers if check else None  # the workers build their own; this copy is --check's reference only
    del layers, example
    launch = Launch(model, engine, nproc, steps, loss, seed, threads, nnodes, node_rank, rdzv_endpoint or "",
                    rdzv_timeout_s, weights=check)
    res = _run_workers(plan, launch, timeout_s, log)
    doc = _run_doc(plan, launch, warmup, res)
    doc["warnings"] += [threads_warning] if threads_warning else []
    if reference is not None:
        ref, ref_weights = reference_run(reference, plan, spec, steps, seed, width)
        doc["reference_losses"] = ref
        doc["max_rel_loss_diff"] = max_rel_diff(doc["losses"], ref)
        doc.update(weight_check(res.get("weights") or {}, ref_weights).to_dict())
    return doc

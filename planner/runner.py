"""`planner run`: train a plan for real under torchrun, measure it, compare with the prediction.

The parent (:func:`run_plan`) checks everything it can before starting processes (engine
installed, plan runnable on it, model matching the plan's profile, world size startable),
then launches ``torchrun --standalone --nproc_per_node W -m planner.runner`` in its own
process group (gloo on CPU, nccl on CUDA). Each worker builds the model from the same seed,
splits it into the profiled layers, builds the engine's pipeline (planner.export.deepspeed or
planner.export.torch), trains ``steps`` steps on synthetic data of the profile's input shape
(the same data on every process: a seeded generator per step) and times every step between
barriers (the slowest rank counts). Rank 0 writes the losses and times as JSON.

On error or timeout the whole process group is killed, and the cause is the worker's own
message (each worker writes ``error-rank<N>.txt`` before it exits; else the last error line
of the workers' output). ``--check`` trains the unsplit model in this process on the same data
with the same initial weights, micro-batch by micro-batch (so that batch-norm sees the same
samples), and reports the largest relative difference of the per-step losses.

Dropout is switched off in every run (synthetic data; equivalence needs a deterministic
forward).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from planner import ir
from planner.errors import PlannerError, RunError
from planner.export import common

DEFAULT_TIMEOUT_S = 900


# ----------------------------------------------------------------------------- model


def load_layers(spec: str, plan: ir.Plan, seed: int | None = None) -> tuple[tuple[nn.Module, ...], torch.Tensor]:
    """Build ``spec`` (zoo name or package.module:factory) and split it into the profiled layers.

    The layers are checked against the plan's profile (count and parameters per layer).
    """
    if seed is not None:
        torch.manual_seed(seed)
    loader = importlib.import_module("planner.profiler.loader")
    loaded = loader.load_model(spec, plan.batch_size, plan.profile.input_shape)
    layers = common.as_layers(loaded.module, loaded.example_input)
    common.check_layers_match(layers, plan.profile, RunError)
    return layers, loaded.example_input


def engine_available(engine: str) -> None:
    if engine not in common.ENGINES:
        raise RunError(f"unknown engine {engine!r}", f"use one of {', '.join(common.ENGINES)}")
    if engine == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
        raise RunError("engine deepspeed is not installed", "pip install 'planner[deepspeed]', or use --engine torch")
    if engine == "torch" and importlib.util.find_spec("torch.distributed.pipelining") is None:
        raise RunError(f"torch {torch.__version__} has no torch.distributed.pipelining",
                       "install torch 2.4 or newer, or use --engine deepspeed")


def engine_module(engine: str) -> Any:
    return importlib.import_module(f"planner.export.{engine}")


def max_world_size() -> int:
    """Processes this machine can start: one per GPU on CUDA, four per core on CPU (gloo)."""
    if torch.cuda.is_available():
        return torch.cuda.device_count()
    return 4 * (os.cpu_count() or 1)


# ----------------------------------------------------------------------------- reference


def reference_losses(layers: tuple[nn.Module, ...], plan: ir.Plan, spec: common.DataSpec, steps: int, seed: int,
                     width: int, lr: float | None = None) -> list[float]:
    """Train the unsplit model in this process: the same micro-batches, mean loss, one step per batch."""
    common.disable_dropout(nn.Sequential(*layers))
    model = nn.Sequential(*layers).train()
    loss_fn = common.make_loss(spec.loss)
    params = list({id(p): p for p in model.parameters()}.values())
    opt = common.torch_optimizer(plan.optimizer, params, common.DEFAULT_LR[plan.optimizer] if lr is None else lr)
    m, pieces = plan.microbatches, plan.microbatches * width
    out = []
    for step in range(steps):
        x, y = spec.batch(step, plan.batch_size, seed)
        opt.zero_grad()
        total = 0.0
        for mb in range(m):
            for w in range(width):
                loss = loss_fn(model(common.sub_batch(x, mb, w, m, width)), common.sub_batch(y, mb, w, m, width))
                (loss / pieces).backward()
                total += float(loss.detach())
        opt.step()
        out.append(total / pieces)
    return out


def max_rel_diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b, strict=True))


# ----------------------------------------------------------------------------- parent


@dataclass(frozen=True)
class _Launch:
    """What every torchrun worker is started with."""

    model: str
    engine: str
    world_size: int
    steps: int
    loss: str
    seed: int
    threads: int

    def command(self, plan_path: Path, out_dir: str) -> list[str]:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={self.world_size}",
                "-m", "planner.runner", "--plan", str(plan_path), "--model", self.model, "--engine", self.engine,
                "--steps", str(self.steps), "--loss", self.loss, "--seed", str(self.seed), "--threads",
                str(self.threads), "--out", out_dir]


def _check_run_args(steps: int, warmup: int, loss: str) -> None:
    if steps < 1 or warmup < 0 or warmup >= steps:
        raise RunError(f"--steps {steps} with {warmup} warm-up steps leaves nothing to measure",
                       "use more steps than warm-up steps")
    if loss not in common.LOSSES:
        raise RunError(f"unknown loss {loss!r}", f"use one of {', '.join(common.LOSSES)}")


def _check_world_size(world: int) -> None:
    limit = max_world_size()
    if world > limit:
        where = f"{limit} CUDA devices" if torch.cuda.is_available() else f"{os.cpu_count()} cores (limit {limit})"
        raise RunError(f"the plan needs {world} processes; this machine can start {limit} ({where})",
                       "search a plan for a smaller cluster (planner calibrate --nproc N)")


def _worker_env(threads: int, tmp: str) -> dict[str, str]:
    """This process's environment with the workers' threads, import path and engine settings."""
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads)
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions"))
    env.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")
    env.setdefault("TORCHELASTIC_ERROR_FILE", str(Path(tmp) / "elastic-error.json"))
    return env


def _wait_workers(cmd: list[str], env: dict[str, str], log_path: Path, timeout_s: float) -> int:
    """Run ``cmd`` in its own process group, output to ``log_path``; the group is killed however it ends."""
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise RunError(f"the workers did not finish within {timeout_s:.0f} s "
                           f"({_last_lines(log_path)})", "use fewer --steps or a smaller model") from None
        except BaseException:
            _kill_group(proc)
            raise
        finally:
            _kill_group(proc)


def _run_workers(plan: ir.Plan, launch: _Launch, timeout_s: float, log: Any) -> dict[str, Any]:
    """Launch the workers under torchrun and return rank 0's result (losses, wall and CPU times per step)."""
    with tempfile.TemporaryDirectory(prefix="planner-run-") as tmp:
        plan_path = Path(tmp) / "plan.json"
        plan_path.write_text(json.dumps(plan.to_dict()))
        log_path = Path(tmp) / "workers.log"
        rc = _wait_workers(launch.command(plan_path, tmp), _worker_env(launch.threads, tmp), log_path, timeout_s)
        text = log_path.read_text(errors="replace")
        if log is not None:
            log.write(text)
        if rc != 0:
            raise RunError(f"a worker failed: {_worker_cause(Path(tmp), text)}",
                           "the cause is the worker's own message; fix it, or rerun with PLANNER_DEBUG=1 "
                           "to see the workers' output")
        result_path = Path(tmp) / "result.json"
        if not result_path.exists():
            raise RunError(f"the workers exited without a result ({_last_lines(log_path)})", "report this")
        res: dict[str, Any] = json.loads(result_path.read_text())
        return res


def _run_doc(plan: ir.Plan, launch: _Launch, warmup: int, res: dict[str, Any]) -> dict[str, Any]:
    """The run JSON (without the reference losses) from the workers' result."""
    times = res["iteration_s"]
    doc: dict[str, Any] = {
        "engine": launch.engine, "world_size": launch.world_size, "model": launch.model, "config": plan.config,
        "schedule": plan.schedule, "microbatches": plan.microbatches, "batch_size": plan.batch_size,
        "steps": launch.steps, "warmup": warmup, "threads": launch.threads,
        "measured_iteration_s": statistics.median(times[warmup:]),
        "predicted_iteration_s": plan.predicted.iteration_s, "iteration_times_s": times,
        # CPU seconds of the busiest process per step (wall time well above it: waiting or
        # a machine shared with other work)
        "cpu_iteration_s": statistics.median(res["cpu_s"][warmup:]),
        "losses": res["losses"],
    }
    doc["ratio"] = doc["measured_iteration_s"] / doc["predicted_iteration_s"] if plan.predicted.iteration_s else None
    return doc


def run_plan(plan: ir.Plan, model: str, *, engine: str = "deepspeed", steps: int = 10, warmup: int = 2,
             loss: str = "cross_entropy", check: bool = False, seed: int = 0, threads: int | None = None,
             timeout_s: float = DEFAULT_TIMEOUT_S, log: Any = None) -> dict[str, Any]:
    """Train ``plan`` for real with ``engine``; the run JSON of DESIGN.md section 4."""
    _check_run_args(steps, warmup, loss)
    engine_available(engine)
    width = engine_module(engine).check_plan(plan)
    world = plan.world_size
    _check_world_size(world)
    threads = threads or max(1, (os.cpu_count() or 1) // world)
    torch.set_num_threads(max(1, threads))
    layers, example = load_layers(model, plan, seed)
    spec = common.data_spec(layers, example, loss)
    launch = _Launch(model, engine, world, steps, loss, seed, threads)
    doc = _run_doc(plan, launch, warmup, _run_workers(plan, launch, timeout_s, log))
    if check:
        ref = reference_losses(layers, plan, spec, steps, seed, width)
        doc["reference_losses"] = ref
        doc["max_rel_loss_diff"] = max_rel_diff(doc["losses"], ref)
    return doc


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Terminate the workers' process group (torchrun and every worker), then make sure."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = proc.pid
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except (ProcessLookupError, PermissionError):
                break
            if proc.poll() is not None:
                # the leader is reaped; members of the group may remain: probe again shortly
                time.sleep(0.05)
            else:
                time.sleep(0.05)
        else:
            continue
        break
    if proc.poll() is None:
        proc.wait()


def _last_lines(path: Path, n: int = 3) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no output"
    return " | ".join(lines[-n:]) if lines else "no output"


_TORCHRUN_SUMMARY = ("error_file", "time ", "time:", "host ", "host:", "rank ", "rank:", "traceback :", "traceback:",
                     "root cause", "failures:", "[")


def _worker_cause(tmp: Path, text: str) -> str:
    """The first failing rank's own message; else the workers' last error line and torchrun's exit code."""
    errors = sorted(tmp.glob("error-rank*.txt"), key=lambda p: int(p.stem.split("rank")[1]))
    if errors:
        first = errors[0]
        return f"rank {first.stem.split('rank')[1]}: {first.read_text().strip()}"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    exit_line = next((ln for ln in reversed(lines) if ln.startswith("exitcode")), "")
    signal_line = next((ln for ln in reversed(lines) if "Signal" in ln or "signal" in ln), "")
    for ln in reversed(lines):
        if ("Error" in ln or "error" in ln) and not ln.startswith(("File ", *_TORCHRUN_SUMMARY)):
            return "; ".join(filter(None, [ln, exit_line]))
    found = "; ".join(filter(None, [exit_line, signal_line]))
    return found or (lines[-1] if lines else "no output")


# ----------------------------------------------------------------------------- worker


def _worker(args: argparse.Namespace) -> None:
    rank = int(os.environ.get("RANK", "0"))
    torch.set_num_threads(args.threads)
    plan = ir.Plan.from_dict(json.loads(Path(args.plan).read_text()))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if args.engine == "deepspeed":
        import deepspeed

        from planner.export.deepspeed import skip_shm_build

        skip_shm_build()
        deepspeed.init_distributed(dist_backend=backend)
    else:
        torch.distributed.init_process_group(backend)
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    layers, example = load_layers(args.model, plan, args.seed)
    for layer in layers:
        common.disable_dropout(layer)
    spec = common.data_spec(layers, example, args.loss)
    step_fn = engine_module(args.engine).make_trainer(layers, plan, spec.loss)
    data = [spec.batch(s, plan.batch_size, args.seed) for s in range(args.steps)]
    losses, times, cpu = [], [], []
    for s in range(args.steps):
        torch.distributed.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        loss = step_fn(*data[s])
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        losses.append(loss)
    t = torch.tensor([times, cpu], dtype=torch.float64)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    if rank == 0:
        (Path(args.out) / "result.json").write_text(json.dumps(
            {"losses": losses, "iteration_s": t[0].tolist(), "cpu_s": t[1].tolist()}))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m planner.runner", description="planner run's worker (torchrun)")
    ap.add_argument("--plan", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--engine", choices=common.ENGINES, required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--loss", default="cross_entropy")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    rank = os.environ.get("RANK", "0")
    try:
        _worker(args)
    except BaseException as exc:
        cause = exc.cause if isinstance(exc, PlannerError) else f"{type(exc).__name__}: {exc}".strip()
        first = cause.splitlines()[0] if cause else type(exc).__name__
        with contextlib.suppress(OSError):
            (Path(args.out) / f"error-rank{rank}.txt").write_text(first)
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)


if __name__ == "__main__":
    main()

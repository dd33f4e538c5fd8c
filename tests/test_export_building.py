"""export.building: a rank keeps its own stages' weights (and its tie groups'), and a server's processes build
in turns where whole models would not fit its memory."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from planner import ir
from planner.errors import RunError
from planner.export import building
from planner.export.building import build_slots, build_turn, kept_layers, model_build_bytes, release_others
from planner.export.layers import layer_param_counts
from planner.export.partition import manual_plan
from tests.conftest import make_cluster_dict
from tests.test_runner import tiny_mlp, tiny_plan, tiny_tied

GIB = 2**30


def _layers(factory: str) -> tuple[nn.Module, ...]:
    """The model's children as its layers (7 for tiny_mlp, 4 for tiny_tied: embedding, linear, tanh, head)."""
    torch.manual_seed(0)
    module, _ = {"tiny_mlp": tiny_mlp, "tiny_tied": tiny_tied}[factory]()
    return tuple(module.children())


def _plan(layers: tuple[nn.Module, ...], parts: list[int], width: int = 1) -> ir.Plan:
    doc = {"kind": "profile", "version": 1, "model": "m", "batch_size": 8, "dtype": "float32", "mode": "measured",
           "device": "cpu", "device_flops": 1e10, "input_shape": [16],
           "layers": [{"name": f"l{i}", "type": "Linear", "forward_s": 1e-4, "backward_s": 2e-4, "forward_flops": 1e6,
                       "backward_flops": 2e6, "param_count": c, "param_bytes": 4 * c, "output_bytes": 1,
                       "saved_bytes": 1} for i, c in enumerate(layer_param_counts(layers))]}
    return manual_plan(ir.ModelProfile.from_dict(doc), ir.Cluster.from_dict(make_cluster_dict(1, 8)), parts, width,
                       microbatches=2, predicted=ir.Prediction(0.01, 800, 0.1, 0))


def _held(layer: nn.Module) -> int:
    return sum(t.untyped_storage().nbytes() for t in [*layer.parameters(), *layer.buffers()])


def test_a_stage_keeps_its_layers_and_frees_the_others() -> None:
    layers = _layers("tiny_mlp")
    plan = _plan(layers, [0, 3, 7])
    before = [_held(layer) for layer in layers]
    freed = release_others(layers, plan, rank=1)  # stage 1: layers 3..6
    assert kept_layers(layers, plan, 1) == frozenset(range(3, 7))
    assert [_held(layer) for layer in layers] == [0, 0, 0, *before[3:]]
    assert freed == sum(before[:3]) > 0
    assert [p.shape for p in layers[0].parameters()] == [torch.Size([32, 16]), torch.Size([32])]  # shapes stay
    x = torch.randn(2, 32)
    assert layers[4](x).shape == (2, 32)  # the kept layers compute as before


def test_a_data_parallel_rank_keeps_its_stage_whatever_its_replica() -> None:
    layers = _layers("tiny_mlp")
    plan = _plan(layers, [0, 3, 7], width=2)  # ranks 0, 1: stage 0; ranks 2, 3: stage 1
    assert kept_layers(layers, plan, 1) == frozenset(range(3))
    assert kept_layers(layers, plan, 2) == frozenset(range(3, 7))


def test_a_tie_group_stays_whole_on_every_stage_that_holds_a_member() -> None:
    """GPT-2's head shares the embedding: the last stage keeps layer 0 whole (DeepSpeed builds the group as one
    module there), the tied weight stays the same object in both layers, and the middle layers go."""
    layers = _layers("tiny_tied")
    plan = _plan(layers, [0, 2, 4])  # stage 0: layers 0-1, stage 1: layers 2-3
    tied = layers[0].emb.weight
    release_others(layers, plan, rank=1)
    assert kept_layers(layers, plan, 1) == frozenset({0, 2, 3})
    assert _held(layers[1]) == 0 and _held(layers[0]) > 0 and layers[3].emb.weight is tied


def test_a_storage_a_kept_layer_uses_is_not_freed() -> None:
    """Two layers that are views of one storage (a flat buffer) without sharing a parameter object."""
    flat = torch.randn(2 * 16 * 16)
    a, b = nn.Linear(16, 16, bias=False), nn.Linear(16, 16, bias=False)
    a.weight, b.weight = nn.Parameter(flat[:256].view(16, 16)), nn.Parameter(flat[256:].view(16, 16))
    layers = (a, nn.ReLU(), b, nn.ReLU())
    plan = _plan(layers, [0, 2, 4])
    assert release_others(layers, plan, rank=1) == 0
    assert torch.equal(a.weight.flatten(), flat[:256])


def test_build_slots_are_whole_models_in_half_the_host() -> None:
    assert build_slots(32 * GIB, 8, 2048 * GIB) == 8  # an 8B model on a 2 TB server: all at once
    assert build_slots(32 * GIB, 8, 256 * GIB) == 4
    assert build_slots(280 * GIB, 8, 512 * GIB) == 1  # 70B in fp32: one at a time, never none
    assert build_slots(32 * GIB, 8, None) == 8
    assert build_slots(0, 3, 1) == 3


def test_model_build_bytes_count_fp32() -> None:
    plan = tiny_plan("tiny_mlp", [0, 3, -1])
    assert model_build_bytes(plan) == 4 * plan.profile.param_count


def _env(local_rank: int) -> dict[str, str]:
    return {"LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": str(local_rank), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29999", "TORCHELASTIC_RUN_ID": "run7"}


def _spans(plan_host_bytes: int, folder: Path) -> tuple[list[tuple[float, float]], list[float]]:
    """Two local ranks building (0.2 s each) under build_turn: each build's (start, end), and when each rank left
    build_turn."""
    plan = tiny_plan("tiny_mlp", [0, 3, -1])
    spans: list[tuple[float, float]] = []
    left: list[float] = []

    def build(local_rank: int) -> None:
        with build_turn(plan, _env(local_rank), host_bytes=plan_host_bytes, folder=str(folder), poll_s=0.01):
            start = time.monotonic()
            time.sleep(0.2)
            spans.append((start, time.monotonic()))
        left.append(time.monotonic())

    threads = [threading.Thread(target=build, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(spans), left


def test_builds_take_turns_where_one_model_fits_and_wait_for_each_other(tmp_path: Path) -> None:
    """One whole model in half the host: one build at a time; the first to build waits for the second before it
    goes on to the engine's collectives (whose timeout would run over the turns of a large model)."""
    plan = tiny_plan("tiny_mlp", [0, 3, -1])
    spans, left = _spans(2 * model_build_bytes(plan), tmp_path)
    assert spans[1][0] >= spans[0][1]
    assert min(left) >= spans[1][1]
    assert len(list(tmp_path.glob("planner-build-*-127.0.0.1-29999-*-0.lock"))) == 1
    assert len([line for p in tmp_path.glob("planner-build-*.count") for line in p.read_text().splitlines()]) == 2


def _dead_pids(n: int) -> list[int]:
    """Process ids of ``n`` processes that have ended."""
    out = []
    for _ in range(n):
        proc = subprocess.Popen([sys.executable, "-c", "pass"])
        proc.wait()
        out.append(proc.pid)
    return out


def test_a_count_left_by_an_earlier_run_of_the_same_name_does_not_end_the_wait(tmp_path: Path) -> None:
    """The DeepSpeed launcher names every run alike (port 29500, no run id), as does torchrun's static rendezvous
    (run id ``none``): the count of an earlier run that finished (or failed while building) once let the next
    run's first builder go on at once, 0.2 s before the other had built; its processes have ended and count no
    more."""
    plan = tiny_plan("tiny_mlp", [0, 3, -1])
    count = tmp_path / f"planner-build-{building._safe(building._user())}-127.0.0.1-29999-run7.count"
    count.write_text("".join(f"{pid} {r} 1\n" for r, pid in enumerate(_dead_pids(2))))
    spans, left = _spans(2 * model_build_bytes(plan), tmp_path)
    assert spans[1][0] >= spans[0][1] and min(left) >= spans[1][1]


def test_builds_again_in_the_same_processes_wait_again(tmp_path: Path) -> None:
    """``train_plan`` called again in the same processes (planner calibrate's rounds): the first build's count
    does not end the second's wait."""
    plan = tiny_plan("tiny_mlp", [0, 3, -1])
    _spans(2 * model_build_bytes(plan), tmp_path)
    spans, left = _spans(2 * model_build_bytes(plan), tmp_path)
    assert spans[1][0] >= spans[0][1] and min(left) >= spans[1][1]


def test_builds_run_together_where_all_fit(tmp_path: Path) -> None:
    spans, _ = _spans(2**40, tmp_path)
    assert spans[1][0] < spans[0][1]
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("env", [{}, {"LOCAL_WORLD_SIZE": "4", "LOCAL_RANK": "1"},
                                 {"LOCAL_WORLD_SIZE": "x", "MASTER_PORT": "1"}])
def test_no_launcher_no_wait(env: dict[str, str], tmp_path: Path) -> None:
    plan = tiny_plan("tiny_mlp", [0, 3, -1])
    with build_turn(plan, env, host_bytes=1, folder=str(tmp_path)):
        pass
    assert not list(tmp_path.iterdir())


def test_an_unwritable_folder_does_not_wait(tmp_path: Path) -> None:
    plan = tiny_plan("tiny_mlp", [0, 3, -1])
    with build_turn(plan, _env(0), host_bytes=1, folder=str(tmp_path / "missing")):
        pass


def _job(folder: Path) -> str:
    """The file names' stem of _env's job in ``folder``."""
    return str(folder / f"planner-build-{building._safe(building._user() + '-127.0.0.1-29999-run7')}")


def _builds(local_ranks: list[int], env: dict[str, str], folder: Path, host_bytes: int, build_s: float = 0.0,
            stall_s: float = 0.5, join_s: float = 30.0) -> dict[int, BaseException | None]:
    """Local ranks building in threads under build_turn (``env`` beside each one's LOCAL_RANK); what each raised
    (None: nothing). A thread still waiting after ``join_s`` fails the test instead of hanging it."""
    plan = tiny_plan("tiny_mlp", [0, 3, -1])
    raised: dict[int, BaseException | None] = {}

    def build(local_rank: int) -> None:
        try:
            with build_turn(plan, {**env, "LOCAL_RANK": str(local_rank)}, host_bytes=host_bytes, folder=str(folder),
                            poll_s=0.01, stall_s=stall_s):
                time.sleep(build_s)
            raised[local_rank] = None
        except BaseException as exc:
            raised[local_rank] = exc

    threads = [threading.Thread(target=build, args=(r,), daemon=True) for r in local_ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_s)
    assert not any(t.is_alive() for t in threads), f"build_turn still waiting after {join_s} s"
    return raised


def test_a_local_world_size_above_the_processes_started_fails_naming_the_missing(tmp_path: Path) -> None:
    """LOCAL_WORLD_SIZE 3 on a server where only local ranks 0 and 1 run: the wait for local rank 2's build never
    ended (the whole job hung); with no build running it fails, naming who is missing and the count file."""
    plan = tiny_plan("tiny_mlp", [0, 3, -1])
    t0 = time.monotonic()
    raised = _builds([0, 1], {**_env(0), "LOCAL_WORLD_SIZE": "3"}, tmp_path, 2 * model_build_bytes(plan))
    assert time.monotonic() - t0 < 10
    for exc in raised.values():
        assert isinstance(exc, RunError)
        assert "2 of 3 (LOCAL_WORLD_SIZE) have built (local ranks 0, 1), local ranks 2 have not" in exc.cause
        assert f"{_job(tmp_path)}.count" in exc.cause and "LOCAL_WORLD_SIZE=3" in exc.hint


def test_a_process_killed_holding_its_turn_frees_it_and_the_others_fail_naming_it(tmp_path: Path) -> None:
    """Local rank 0 killed (SIGKILL) while it builds, holding the only turn: local rank 1 builds (the kernel drops
    the lock), then its wait for rank 0's build fails within the stall bound instead of hanging."""
    plan = tiny_plan("tiny_mlp", [0, 3, -1])
    hold = "import fcntl, sys, time; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); print('held', " \
           "flush=True); time.sleep(120)"
    proc = subprocess.Popen([sys.executable, "-c", hold, f"{_job(tmp_path)}-0.lock"], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"held\n"
        threading.Timer(0.3, proc.kill).start()
        t0 = time.monotonic()
        raised = _builds([1], _env(1), tmp_path, 2 * model_build_bytes(plan))
    finally:
        proc.kill()
        proc.wait()
    exc = raised[1]
    assert isinstance(exc, RunError) and "local ranks 0 have not" in exc.cause
    assert 0.3 < time.monotonic() - t0 < 10


def test_builds_that_hold_their_turn_longer_than_the_stall_bound_are_waited_for(tmp_path: Path) -> None:
    """The bound runs only while no build turn is held: turns of 0.4 s each under a 0.1 s bound all complete."""
    plan = tiny_plan("tiny_mlp", [0, 3, -1])
    raised = _builds([0, 1, 2], {**_env(0), "LOCAL_WORLD_SIZE": "3"}, tmp_path, 2 * model_build_bytes(plan),
                     build_s=0.4, stall_s=0.1)
    assert raised == {0: None, 1: None, 2: None}

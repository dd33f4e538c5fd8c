"""calibrate: this machine as a cluster JSON that the rest of planner reads."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import click
import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner import ir
from planner.calibrate import calibrate, cluster_doc, fit_collective, measure_flops, measure_memory_bandwidth
from planner.errors import UsageError
from tests.conftest import make_profile_dict


def test_flops_benchmark_is_positive_and_finite() -> None:
    got = measure_flops(1)
    assert 1e8 < got["flops"] < 1e14
    assert min(got["matmul_flops"], got["conv_flops"]) <= got["flops"] <= max(got["matmul_flops"], got["conv_flops"])


@pytest.mark.slow
def test_calibrated_cluster_is_a_valid_cluster_of_p_devices() -> None:
    cluster, meta = calibrate(2, 1)
    doc = cluster_doc(cluster, meta)
    back = ir.Cluster.from_dict(doc)
    assert [g.name for g in back.gpus] == ["cpu0", "cpu1"]
    link = back.link("intra_node")
    assert link.bandwidth_Bps > 1e6 and 0 < link.latency_s < 0.1
    assert meta["allreduce_4mib_s"] > 0 and meta["flops_source"] == "benchmark"
    assert link.collective_latency_s == meta["allreduce_fixed_s"] >= 0  # fitted over the sizes, in the file
    gather, scatter = meta["allgather_bus_bandwidth_Bps"], meta["reduce_scatter_bus_bandwidth_Bps"]
    assert link.allreduce_bandwidth_Bps == meta["allreduce_bus_bandwidth_Bps"] > 0
    assert link.allgather_bandwidth_Bps == pytest.approx(2 / (1 / gather + 1 / scatter))
    assert back.link("inter_node") == link  # one node: the network is the node's
    assert 0 < meta["core_share"] <= 1 and meta["concurrent_share"] > 0
    assert [g.flops for g in back.gpus] == pytest.approx([meta["flops"] * meta["core_share"]] * 2)
    assert {g.memory_bandwidth_Bps for g in back.gpus} == {meta["memory_bandwidth_Bps"]}
    assert back.nodes[0].concurrent_devices == len(os.sched_getaffinity(0))  # 1 thread each: one per core
    assert back.nodes[0].threads == 1  # what planner run starts each process with
    handoff_s = back.nodes[0].handoff_s  # measured beside the efficiency, carried in the file
    assert handoff_s is not None and 0 <= handoff_s < 0.1 and handoff_s == meta["handoff_s"]
    efficiency = back.nodes[0].sharing_efficiency  # measured with the benchmark kernel: no profile
    assert efficiency is not None and 0 < efficiency <= 1 and meta["sharing_kernel"] == "matmul+conv"
    if len(os.sched_getaffinity(0)) >= 2:  # a core each: the fair share is whole
        assert meta["core_share"] == pytest.approx(efficiency)


@pytest.mark.slow
def test_more_processes_than_cores_carry_their_measured_sharing_efficiency() -> None:
    from planner.cores import usable_cores

    cores = usable_cores()
    if cores > 8:
        pytest.skip(f"{cores} cores: oversubscribing them takes too many processes for a test")
    cluster, meta = calibrate(cores + 1, 1)
    node = cluster.nodes[0]
    assert node.sharing_efficiency is not None and 0 < node.sharing_efficiency <= 1
    assert node.sharing_efficiency == meta["sharing_efficiency"]
    fair = cores / (cores + 1)
    assert meta["core_share"] == pytest.approx(fair * node.sharing_efficiency) == node.core_share
    assert [g.flops for g in cluster.gpus] == pytest.approx([meta["flops"] * meta["core_share"]] * (cores + 1))
    assert ir.Cluster.from_dict(cluster_doc(cluster, meta)).nodes[0].sharing_efficiency == node.sharing_efficiency


@given(st.floats(1e8, 1e11), st.floats(0.0, 0.01), st.floats(0.0, 0.001),
       st.lists(st.floats(1e5, 1e9), min_size=2, max_size=5, unique=True))
def test_a_collectives_sweep_gives_back_the_bandwidth_and_fixed_cost_that_made_it(
        bandwidth_Bps: float, fixed_s: float, ring_s: float, bus_bytes: list[float]) -> None:
    times = [fixed_s + ring_s + b / bandwidth_Bps for b in bus_bytes]
    got_bw, got_fixed = fit_collective(bus_bytes, times, ring_s)
    assert got_bw == pytest.approx(bandwidth_Bps, rel=1e-6)
    assert got_fixed == pytest.approx(fixed_s, rel=1e-6, abs=1e-9)


def test_a_sweep_that_does_not_grow_with_size_reads_the_largest_and_no_fixed_cost() -> None:
    # gloo on a busy machine: the 16 MiB call faster than the smaller ones
    bw, fixed = fit_collective([1e6, 4e6, 16e6], [0.010, 0.011, 0.009], 0.0002)
    assert (bw, fixed) == (pytest.approx(16e6 / (0.009 - 0.0002)), 0.0)
    bw, fixed = fit_collective([4e6], [0.004], 0.0)  # one size: nothing to separate
    assert (bw, fixed) == (pytest.approx(1e9), 0.0)


def test_a_fixed_cost_below_the_rings_latencies_is_none() -> None:
    # the intercept (0.1 ms) is less than the ring's latencies (0.2 ms): no negative cost
    bw, fixed = fit_collective([1e6, 2e6], [0.0001 + 1e-3, 0.0001 + 2e-3], 0.0002)
    assert bw == pytest.approx(1e9) and fixed == 0.0


def test_memory_bandwidth_benchmark_is_plausible() -> None:
    assert 1e8 < measure_memory_bandwidth(1, mib=8) < 1e13


@pytest.mark.slow
def test_match_profile_takes_the_profiles_flops() -> None:
    profile = ir.ModelProfile.from_dict(make_profile_dict(device_flops=3.5e10))
    cluster, meta = calibrate(2, 1, name="x", profile=profile)
    assert {g.flops for g in cluster.gpus} == {3.5e10 * meta["core_share"]} and meta["flops_source"] == "profile"


def test_more_threads_than_cores_share_them() -> None:
    from planner.calibrate import core_share

    cores = len(os.sched_getaffinity(0))
    assert core_share(1, 1) == 1.0 and core_share(cores, 1) == 1.0
    assert core_share(2 * cores, 1) == pytest.approx(0.5) and core_share(cores, 4) == pytest.approx(0.25)


@pytest.mark.parametrize("nproc", [2, 3, 4, 5, 8])
def test_engine_calibration_runs_on_the_clusters_own_processes(nproc: int) -> None:
    from planner.calibrate_engines import BATCH, batch_size, shapes

    plans = shapes(nproc, "torch")
    assert all(sum(gpus) == nproc for gpus, _, _, _ in plans)
    assert {len(gpus) for gpus, _, _, _ in plans} == {1, nproc}  # data parallel, and one stage per process
    batch = batch_size(nproc)
    assert batch >= BATCH and all(batch % (m * gpus[0]) == 0 for gpus, m, _, _ in plans)
    assert all(m >= len(gpus) for gpus, m, _, _ in plans)  # 1F1B on torch needs M >= K
    assert all(len(gpus) == 1 for gpus, _, zero, _ in plans if zero)  # ZeRO shards over a data-parallel stage
    assert {tp for _, _, _, tp in plans} == {1, nproc}  # torch runs a tensor group: its collectives are measured
    plain = (((2,), 1, 0, 1), ((2,), 4, 0, 1), ((1, 1), 2, 0, 1), ((1, 1), 4, 0, 1), ((1, 1), 8, 0, 1))
    if nproc == 2:  # DeepSpeed runs no tensor group
        assert shapes(2, "deepspeed") == (*plain, ((2,), 1, 1, 1), ((2,), 4, 1, 1)) and batch == 16  # its ZeRO-1
        assert plans == (*plain, ((2,), 1, 2, 1), ((2,), 4, 2, 1), ((2,), 4, 3, 1),  # torch's FSDP: ZeRO-2 and 3
                         ((2,), 1, 0, 2), ((2,), 4, 0, 2))


def test_one_process_is_refused() -> None:
    with pytest.raises(UsageError, match="--nproc"):
        calibrate(1)


@pytest.mark.slow
def test_cli_writes_a_cluster_file(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from planner.cli import main

    out = tmp_path / "cluster.json"
    res = CliRunner().invoke(main, ["calibrate", "-o", str(out), "--nproc", "2", "--threads", "1",
                                    "--engines", "none"])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["kind"] == "cluster" and len(doc["nodes"][0]["gpus"]) == 2
    assert "engine_overheads" not in doc


def test_the_report_names_each_engines_unit_cost_for_what_it_is(capsys: pytest.CaptureFixture[str]) -> None:
    """torch's per-unit cost is an FSDP unit's gather or reduction; DeepSpeed's, its ZeRO-1's per layer."""
    from planner.commands.calibrate import _report

    link = {"bandwidth_Bps": 1e9, "latency_s": 1e-5}
    cluster = ir.Cluster.from_dict({"kind": "cluster", "version": 1, "name": "cpu", "nodes": [{"name": "n0", "gpus": [
        {"name": f"n0.g{i}", "flops": 1e10, "memory_bytes": 2**30} for i in range(2)]}],
        "links": {"intra_node": link, "inter_node": link}})
    over = ir.EngineOverhead(1e-4, 2e-4, 3e-3, per_shard_s=5e-4)
    cluster = dataclasses.replace(cluster, engine_overheads=(("deepspeed", over), ("torch", over)))
    _report(cluster, {"flops_source": "x", "memory_bandwidth_Bps": 1e10, "concurrent_share": 1.0,
                      "sharing_kernel": "k", "handoff_s": None}, "out.json")
    err = capsys.readouterr().err
    assert "deepspeed: " in err and "ms per layer's ZeRO-1 reduction or gather" in err
    assert "torch: " in err and "ms per FSDP unit's gather or reduction" in err
    assert err.count("FSDP") == 1


def test_the_cli_refuses_an_analytic_profile_to_match_and_an_overlong_name_before_measuring(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from planner.cli import main
    from tests.conftest import make_profile_dict

    profile = tmp_path / "p.json"
    profile.write_text(json.dumps(make_profile_dict()))  # analytic, for a device called "test"
    out = tmp_path / "cluster.json"
    res = CliRunner().invoke(main, ["calibrate", "-o", str(out), "--match-profile", str(profile)])
    assert res.exit_code == 2 and "is an analytic profile" in res.stderr and not out.exists()
    res = CliRunner().invoke(main, ["calibrate", "-o", str(out), "--name", "x" * 2000])
    assert res.exit_code == 2 and "2000 characters" in res.stderr and not out.exists()


def test_a_profile_to_match_timed_beside_other_work_is_named_in_a_warning(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Its FLOP/s become every calibrated device's, so a profile whose layers were timed while other work took the
    cores (its ``meta`` says how many) makes a slow cluster: calibrate says so before measuring."""
    from planner.commands.calibrate import _matched_profile

    doc = make_profile_dict(2, mode="measured", device="cpu")
    doc["meta"] = {"threads": 1, "timing_attempts": 2, "background_cores": 1.4, "waited_for_idle_s": 60.0}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    assert _matched_profile(str(path), 1) is not None
    err = capsys.readouterr().err
    assert "warning: --match-profile" in err and "other work used 1.40 of" in err
    doc["meta"]["background_cores"] = 0.01
    path.write_text(json.dumps(doc))
    _matched_profile(str(path), 1)
    assert "warning" not in capsys.readouterr().err


def test_fit_recovers_the_overheads_that_made_the_residuals() -> None:
    import numpy as np

    from planner.calibrate_engines import fit_overheads

    features = np.array([[2.0, 0.0, 1.0], [8.0, 0.0, 1.0], [6.0, 2.0, 1.0], [10.0, 4.0, 1.0], [18.0, 8.0, 1.0]])
    truth = np.array([2e-4, 5e-4, 3e-3])
    got = fit_overheads(features, features @ truth)
    assert [got.per_action_s, got.per_microbatch_s, got.per_step_s] == pytest.approx(list(truth), rel=1e-9)
    assert fit_overheads(features, -features @ truth) == ir.EngineOverhead()  # a pessimistic model: nothing
    partial = fit_overheads(features, features @ np.array([1e-3, -2e-3, 0.0]))
    assert min(partial.per_action_s, partial.per_microbatch_s, partial.per_step_s) >= 0.0


def test_calibration_plans_leave_the_nodes_handoff_cost_out() -> None:
    """The tiny model leaves the cores mostly idle, so its plans are predicted without what a
    hand-off costs on busy cores, and the engine's fit does not absorb it."""
    import dataclasses

    from planner.calibrate_engines import calibration_plans, overhead_features, shapes
    from tests.conftest import make_cluster_dict

    doc = make_profile_dict(4, batch_size=16)
    for layer in doc["layers"]:  # 500 x 500 weights: layers a tensor group may split
        layer.update(in_features=500, out_features=500)
    profile = ir.ModelProfile.from_dict(doc)
    base = ir.Cluster.from_dict(make_cluster_dict(1, 2))
    node = dataclasses.replace(base.nodes[0], concurrent_devices=1.0, handoff_s=1e-3)
    cluster = dataclasses.replace(base, nodes=(node,))
    plans = calibration_plans(profile, cluster, "torch", shapes(2, "torch"))
    assert [p.config for p in plans] == ["2", "2", "1-1", "1-1", "1-1", "2", "2", "2", "2", "2"]
    assert [p.stages[0].zero for p in plans] == [0, 0, 0, 0, 0, 2, 2, 3, 0, 0]
    assert all(st.tp == 1 for p in plans[:-2] for st in p.stages)  # a stage of 2 devices is 2 data-parallel ranks
    for tensor in plans[-2:]:  # one tensor group of both, every layer row-parallel, run by the engine measured
        assert tensor.stages[0].tp == 2 and set(tensor.stages[0].forms) == {"split_in"} and tensor.engine == "torch"
    # forward: each layer's all-reduce; backward: layers 1-3 all-gather their input's gradient, leaving the split
    # forms all-gathers the output's (this profile's input has 0 bytes: entering and layer 0's gather move none)
    assert overhead_features(plans[-2], "torch")[1][-1] == pytest.approx(8.0)
    assert all(p.cluster.nodes[0].handoff_s is None for p in plans)
    assert all(p.cluster.nodes[0].concurrent_devices == 1.0 for p in plans)


def test_features_count_actions_on_the_critical_path_and_sends_only_between_stages() -> None:
    from planner.calibrate_engines import overhead_features
    from tests.test_validate import make_plan

    two = make_plan("1f1b", 4)
    base, f = overhead_features(two, "torch")
    assert base > 0 and f[0] == pytest.approx(2 * (4 + 2 - 1), rel=0.05) and f[2] == pytest.approx(1.0, rel=0.05)
    one = make_plan("1f1b", 4, stages=[((0, 4), ("n0.g0",))])
    _, f1 = overhead_features(one, "torch")
    assert f1 == pytest.approx([8.0, 0.0, 1.0, 0.0, 0.0])  # no FSDP units under ZeRO-0, no tensor group


@pytest.mark.slow
def test_tiny_torch_calibration_fits_non_negative_overheads_from_real_runs() -> None:
    from planner.api import profile_model
    from planner.calibrate_engines import BATCH, INPUT_SHAPE, MODEL, measure_engine
    from tests.conftest import make_cluster_dict

    profile = profile_model(MODEL, batch_size=BATCH, input_shape=INPUT_SHAPE, threads=1, repeats=3, warmup=1)
    cluster = ir.Cluster.from_dict(make_cluster_dict(1, 2))
    overhead, runs = measure_engine(cluster, "torch", 1, profile,
                                    (((2,), 1, 0, 1), ((1, 1), 2, 0, 1), ((1, 1), 4, 0, 1), ((2,), 1, 2, 1),
                                     ((2,), 1, 0, 2)), steps=4, rounds=1)
    assert [(r["config"], r["microbatches"], r["zero"], r["tp"]) for r in runs] == [
        ("2", 1, 0, 1), ("1-1", 2, 0, 1), ("1-1", 4, 0, 1), ("2", 1, 2, 1), ("2", 1, 0, 2)]
    assert all(r["measured_s"] > 0 and r["predicted_s"] > 0 for r in runs)
    assert min(overhead.per_action_s, overhead.per_microbatch_s, overhead.per_step_s, overhead.per_shard_s) >= 0.0
    # the engine costs something beyond the layers' own time on this machine: the fit charges it
    assert sum(r["fitted_s"] for r in runs) > sum(r["predicted_s"] for r in runs)
    # FSDP's gathers and reductions on gloo cost milliseconds where the tiny model's bytes take microseconds, and so
    # do a tensor group's all-reduces and all-gathers of its activations
    assert overhead.per_shard_s > 1e-4 and overhead.per_collective_s > 1e-4


def test_unknown_engine_is_bad_usage(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from planner.cli import main

    res = CliRunner().invoke(main, ["calibrate", "-o", str(tmp_path / "c.json"), "--engines", "jax"])
    assert res.exit_code == 2 and "jax" in res.output and not (tmp_path / "c.json").exists()


def test_engine_list_auto_none_and_duplicates() -> None:
    from planner.commands.calibrate import engine_list

    assert "torch" in engine_list("auto") and engine_list("none") == [] and engine_list("") == []
    assert engine_list("torch, deepspeed,torch") == ["torch", "deepspeed"]
    for mixed in ("none,torch", "torch,auto"):
        with pytest.raises(click.BadParameter, match="'none' or 'auto' beside engines"):
            engine_list(mixed)


def test_more_processes_than_run_starts_here_are_bad_usage(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from planner.cli import main

    nproc = 4 * (os.cpu_count() or 1) + 1
    res = CliRunner().invoke(main, ["calibrate", "-o", str(tmp_path / "c.json"), "--nproc", str(nproc)])
    assert res.exit_code == 2 and f"--nproc {nproc} is more than" in res.stderr
    assert not (tmp_path / "c.json").exists()


def test_more_threads_than_cores_and_a_gpu_profile_to_match_are_bad_usage_before_measuring(tmp_path: Path) -> None:
    """A million threads ended the process in libgomp's abort; a GPU-measured profile's FLOP/s became the CPU
    processes' (35 TFLOP/s each)."""
    from click.testing import CliRunner

    from planner.cli import main
    from tests.conftest import make_profile_dict

    out = tmp_path / "c.json"
    cores = len(os.sched_getaffinity(0))
    for threads in (cores + 1, 10**6):
        res = CliRunner().invoke(main, ["calibrate", "-o", str(out), "--threads", str(threads)])
        assert res.exit_code == 2 and f"--threads must be 1 to the {cores} cores" in res.stderr and not out.exists()
    with pytest.raises(UsageError, match="--threads"):
        calibrate(2, cores + 1)
    profile = tmp_path / "gpu.json"
    profile.write_text(json.dumps({**make_profile_dict(), "mode": "measured", "device": "cuda"}))
    res = CliRunner().invoke(main, ["calibrate", "-o", str(out), "--match-profile", str(profile)])
    assert res.exit_code == 2 and "was measured on cuda" in res.stderr and not out.exists()
    two_threads = tmp_path / "cpu.json"  # a CPU profile timed with 2 threads, for processes of 1
    two_threads.write_text(json.dumps({**make_profile_dict(), "mode": "measured", "device": "cpu",
                                       "meta": {"threads": 2}}))
    res = CliRunner().invoke(main, ["calibrate", "-o", str(out), "--match-profile", str(two_threads)])
    assert res.exit_code == 2 and "was measured with 2 threads, not the --threads 1" in res.stderr
    assert not out.exists()


_PRINTING_WORKERS = """
import subprocess, sys
import planner.calibrate
from planner.cluster import load_cluster
from planner.cli import main

def fake(nproc, threads, name, profile, engines):
    subprocess.run([sys.executable, "-c", "print('SEED_LAYERS=False BASE_SEED=1234')"], check=True)
    print("Using topology: {}")
    meta = {"flops_source": "benchmark", "memory_bandwidth_Bps": 1e10, "concurrent_share": 1.0,
            "sharing_kernel": "matmul", "handoff_s": 0.0}
    return load_cluster("pipepar-4x2-2080ti"), meta

planner.calibrate.calibrate = fake
main(["calibrate", "-o", sys.argv[1], "--engines", "none", "--json"])
"""


def test_json_stays_one_document_when_the_workers_print(tmp_path: Path) -> None:
    """The measuring processes inherit stdout (DeepSpeed prints banners there): --json must stay one document."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _PRINTING_WORKERS, str(tmp_path / "c.json")], capture_output=True,
                         text=True, cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["kind"] == "cluster"
    assert "SEED_LAYERS" in out.stderr and "Using topology" in out.stderr


@pytest.mark.slow
def test_time_plans_probes_the_machines_speed_after_every_round_when_asked() -> None:
    from planner.api import profile_model
    from planner.calibrate_engines import BATCH, INPUT_SHAPE, MODEL, calibration_plans, time_plans
    from tests.conftest import make_cluster_dict

    profile = profile_model(MODEL, batch_size=BATCH, input_shape=INPUT_SHAPE, threads=1, repeats=3, warmup=1)
    cluster = ir.Cluster.from_dict(make_cluster_dict(1, 2))
    plans = calibration_plans(profile, cluster, "torch", (((2,), 1, 0, 1), ((1, 1), 2, 0, 1)))
    got = time_plans(plans, "torch", 1, steps=3, rounds=2, idle_timeout_s=0, probe=True)
    assert [len(t) for t in got.times_s] == [2, 2]
    assert [len(p) for p in got.probe_s] == [2, 2]
    # the probe is the whole tiny model at the plan's batch, forward and backward: well under a second
    assert all(0 < p < 1.0 for row in got.probe_s for p in row)


def test_the_last_probe_is_the_last_plans_last_round_and_none_without_probes() -> None:
    from planner.calibrate_engines import Timings

    probed = Timings(((1.0, 1.1), (2.0, 2.1)), ((0.0, 0.0), (0.0, 0.0)), ((0.5, 0.6), (0.7, 0.8)))
    assert probed.last_probe_s == 0.8
    assert Timings(((1.0,),), ((0.0,),), ((),)).last_probe_s is None


def test_rounds_stop_waiting_for_an_idle_machine_once_other_work_spoiled_two(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine busy for good: the first BUSY_ROUNDS rounds wait and retry (ATTEMPTS each), the later ones measure
    once at once; the counter moves alike on every rank (the background is the group's)."""
    import torch

    import planner.runner.machine as machine
    import planner.runner.worker as worker
    from planner.calibrate_engines import ATTEMPTS, BUSY_ROUNDS, _timed_round

    calls = {"measure": 0, "wait": 0}

    def train(*_: object, **__: object) -> None:
        calls["measure"] += 1

    monkeypatch.setattr(torch.distributed, "barrier", lambda: None)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 0)
    monkeypatch.setattr(worker, "train_plan", train)
    monkeypatch.setattr(worker, "group_timing", lambda _: {"iteration_s": [0.1] * 8})
    monkeypatch.setattr(machine, "steps_background", lambda *_: 1.0)  # another process on a core throughout
    monkeypatch.setattr(machine, "wait_idle", lambda **_: calls.__setitem__("wait", calls["wait"] + 1))
    busy = [0]
    per_round = []
    for _ in range(BUSY_ROUNDS + 2):
        before = dict(calls)
        assert _timed_round(None, "m", "torch", 8, 30.0, busy) == (0.1, 1.0)  # type: ignore[arg-type]
        per_round.append((calls["measure"] - before["measure"], calls["wait"] - before["wait"]))
    assert per_round == [(ATTEMPTS, ATTEMPTS)] * BUSY_ROUNDS + [(1, 0)] * 2
    assert busy == [BUSY_ROUNDS + 2]


def test_the_report_warns_of_engine_rounds_other_work_spoiled() -> None:
    from planner.commands.calibrate import busy_warnings

    runs = {"runs": {"torch": [{"busy_rounds": 2}, {"busy_rounds": 1}], "deepspeed": [{"busy_rounds": 0}]}}
    (warning,) = busy_warnings({"engine_runs": runs})
    assert warning.startswith("torch: other work used the cores during 3 of its timed rounds")
    assert busy_warnings({}) == [] and busy_warnings({"engine_runs": {"runs": {"torch": [{}]}}}) == []

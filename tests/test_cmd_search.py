"""``planner search`` on the command line: plans, JSON, and every kind of bad input."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from planner.cli import main
from tests.conftest import make_cluster_dict, make_profile_dict


def _write(tmp_path: Path, name: str, doc) -> str:
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(p)


def _run(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.fixture
def files(tmp_path):
    return (_write(tmp_path, "p.json", make_profile_dict(6, batch_size=8)),
            _write(tmp_path, "c.json", make_cluster_dict(2, 2)), tmp_path)


def test_search_writes_plan_and_json(files) -> None:
    prof, clus, tmp = files
    out = tmp / "plan.json"
    r = _run("search", prof, "--cluster", clus, "-o", str(out), "--json", "--microbatches", "4")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["kind"] == "plan" and doc["version"] == 2
    for key in ("model", "cluster", "schedule", "microbatches", "batch_size", "optimizer", "config", "stages",
                "predicted", "dp_iteration_s", "speedup_over_dp", "profile"):
        assert key in doc
    for key in ("iteration_s", "samples_per_s", "bubble_fraction", "peak_memory_bytes"):
        assert key in doc["predicted"]
    assert doc["microbatches"] == 4
    explanation = doc.pop("explanation")  # stdout adds why this plan to the plan file's keys
    assert json.loads(out.read_text()) == doc
    assert {"bottleneck_stage", "bound", "idle_devices", "runner_ups", "all_gpus", "stages"} <= set(explanation)
    stage = doc["stages"][0]
    assert {"layers", "devices", "forms", "memory_bytes"} <= set(stage)


def test_search_with_preset_and_config(files) -> None:
    prof, _, _ = files
    r = _run("search", prof, "--cluster", "pipepar-4x2-2080ti", "--config", "2-1", "--json", "--microbatches", "2")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["config"] == "2-1"


@pytest.mark.parametrize("engine", ["deepspeed", "torch"])
def test_search_engine_same_widths(files, engine) -> None:
    prof, clus, _ = files
    r = _run("search", prof, "--cluster", clus, "--engine", engine, "--json", "--microbatches", "2")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert len({len(s["devices"]) for s in doc["stages"]}) == 1
    if engine == "deepspeed":
        assert all(f == "dp" for s in doc["stages"] for f in s["forms"])


def test_brute_solver_and_schedules(files) -> None:
    prof, clus, _ = files
    for schedule in ("gpipe", "1f1b", "interleaved", "pipedream", "zb-h1"):
        r = _run("search", prof, "--cluster", clus, "--schedule", schedule, "--json", "--microbatches", "2")
        assert r.exit_code == 0, (schedule, r.output)
    a = json.loads(_run("search", prof, "--cluster", clus, "--json", "--microbatches", "2", "--solver", "dp").stdout)
    b = json.loads(_run("search", prof, "--cluster", clus, "--json", "--microbatches", "2",
                        "--solver", "brute").stdout)
    assert a["predicted"]["iteration_s"] == pytest.approx(b["predicted"]["iteration_s"], rel=1e-9)


def _bad_profile(mutate):
    d = make_profile_dict(3, batch_size=8)
    mutate(d)
    return d


@pytest.mark.parametrize("doc, words", [
    ("{not json", ["not valid JSON"]),
    (_bad_profile(lambda d: d.update(kind="plan")), ["kind"]),
    (_bad_profile(lambda d: d.update(version=9)), ["version"]),
    (_bad_profile(lambda d: d.pop("layers")), ["layers"]),
    (_bad_profile(lambda d: d["layers"][0].pop("forward_s")), ["forward_s"]),
    (_bad_profile(lambda d: d["layers"][1].update(forward_s=-1.0)), ["forward_s", "-1.0"]),
    (_bad_profile(lambda d: d["layers"][1].update(output_bytes=-5)), ["output_bytes"]),
])
def test_bad_profiles(tmp_path, doc, words) -> None:
    prof = _write(tmp_path, "p.json", doc)
    clus = _write(tmp_path, "c.json", make_cluster_dict())
    r = _run("search", prof, "--cluster", clus)
    assert r.exit_code in (1, 2), r.output
    assert "Traceback" not in r.output
    for w in words:
        assert w in r.output


def test_nan_in_profile(tmp_path) -> None:
    text = json.dumps(make_profile_dict(2)).replace('"forward_s": 0.01', '"forward_s": NaN', 1)
    r = _run("search", _write(tmp_path, "p.json", text), "--cluster", _write(tmp_path, "c.json", make_cluster_dict()))
    assert r.exit_code in (1, 2) and "forward_s" in r.output


def _bad_cluster(mutate):
    d = make_cluster_dict()
    mutate(d)
    return d


@pytest.mark.parametrize("doc, word", [
    (_bad_cluster(lambda d: d.update(nodes=[])), "nodes"),
    (_bad_cluster(lambda d: d["links"]["inter_node"].update(bandwidth_Bps=0)), "bandwidth_Bps"),
    (_bad_cluster(lambda d: d["nodes"][0]["gpus"][0].update(memory_bytes=-1)), "memory_bytes"),
    (_bad_cluster(lambda d: d.update(kind="profile")), "kind"),
])
def test_bad_clusters(tmp_path, doc, word) -> None:
    r = _run("search", _write(tmp_path, "p.json", make_profile_dict(3)), "--cluster", _write(tmp_path, "c.json", doc))
    assert r.exit_code in (1, 2), r.output
    assert word in r.output


def test_unknown_preset(files) -> None:
    prof, _, _ = files
    r = _run("search", prof, "--cluster", "nope")
    assert r.exit_code == 1 and "pipepar-4x2-2080ti" in r.output


@pytest.mark.parametrize("args, word", [
    (["--microbatches", "3"], "does not divide"),
    (["--microbatches", "zero"], "--microbatches"),
    (["--config", "2-2-2"], "needs 6 devices"),
    (["--config", "1-1-1-1"], "stages"),
    (["--config", "2-x"], "PipeDream notation"),
    (["--config", "2-1", "--engine", "deepspeed"], "one width"),
    (["--virtual-stages", "2"], "needs --schedule interleaved"),
    (["--virtual-stages", "0", "--schedule", "interleaved"], "--virtual-stages"),
    (["--schedule", "interleaved", "--engine", "deepspeed"], "deepspeed runs the schedules 1f1b, not interleaved"),
])
def test_bad_options(tmp_path, args, word) -> None:
    prof = _write(tmp_path, "p.json", make_profile_dict(3, batch_size=8))
    clus = _write(tmp_path, "c.json", make_cluster_dict(2, 2))
    r = _run("search", prof, "--cluster", clus, *args)
    assert r.exit_code in (1, 2), r.output
    assert word in r.output


def test_no_plan_fits_exits_3(tmp_path) -> None:
    prof = _write(tmp_path, "p.json", make_profile_dict(3, batch_size=8))
    clus = _write(tmp_path, "c.json", make_cluster_dict(1, 2, memory_bytes=1000))
    out = tmp_path / "plan.json"
    r = _run("search", prof, "--cluster", clus, "-o", str(out))
    assert r.exit_code == 3, r.output
    assert "needs" in r.output and "(1000 bytes per device at most)" in r.output  # in the unit that keeps digits
    assert not out.exists()


def test_search_needs_no_torch(tmp_path) -> None:
    prof = _write(tmp_path, "p.json", make_profile_dict(4, batch_size=8))
    code = ("import sys, json\nfrom planner import ir\nfrom planner.cluster import load_cluster\n"
            "from planner.search import search\n"
            f"p = ir.ModelProfile.from_dict(json.load(open({prof!r})))\n"
            "plan = search(p, load_cluster('pipepar-4x2-2080ti'), microbatches=2)\n"
            "assert not any(m.split('.')[0] in ('torch', 'click', 'rich') for m in sys.modules), 'imported'\n"
            "print(plan.config)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parent.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()


def test_speedup_over_dp_is_consistent(files) -> None:
    prof, clus, _ = files
    doc = json.loads(_run("search", prof, "--cluster", clus, "--json", "--microbatches", "2").stdout)
    assert math.isclose(doc["speedup_over_dp"], doc["dp_iteration_s"] / doc["predicted"]["iteration_s"], rel_tol=1e-9)


def test_rerank_with_simulator(files) -> None:
    prof, clus, _ = files
    r = _run("search", prof, "--cluster", clus, "--json", "--rerank", "4")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["kind"] == "plan"


@pytest.mark.parametrize("v", [None, 3])
def test_interleaved_plan_with_virtual_stages(tmp_path, v) -> None:
    """--schedule interleaved plans v chunks per group (default 2): K*v chunks in model order,
    chunk c on the devices of chunk c mod K; the plan validates, simulates to its prediction,
    and each device holds the in-flight chunk micro-batches of the closed form."""
    from planner import ir
    from planner.schedule import in_flight_microbatches
    from planner.simulate import simulate, validate_plan

    prof = _write(tmp_path, "p.json", make_profile_dict(12, batch_size=8))
    clus = _write(tmp_path, "c.json", make_cluster_dict(2, 2))
    out = tmp_path / "plan.json"
    extra = [] if v is None else ["--virtual-stages", str(v)]
    r = _run("search", prof, "--cluster", clus, "--schedule", "interleaved", "--config", "1-1", "--microbatches",
             "4", "-o", str(out), "--json", *extra)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    v = v or 2
    assert doc["schedule"] == "interleaved" and doc["virtual_stages"] == v and len(doc["stages"]) == 2 * v
    assert [s["layers"][0] for s in doc["stages"]] == sorted(s["layers"][0] for s in doc["stages"])
    for c, s in enumerate(doc["stages"]):
        assert s["devices"] == doc["stages"][c % 2]["devices"]
    plan = ir.Plan.from_dict(json.loads(out.read_text()))
    validate_plan(plan)
    result = simulate(plan)
    assert result.iteration_s == pytest.approx(doc["predicted"]["iteration_s"], rel=1e-9)
    for d in result.devices:
        assert d.peak_in_flight == in_flight_microbatches("interleaved", 2, 4, d.lane, v)
    sim = _run("simulate", str(out), "--json")
    assert sim.exit_code == 0, sim.output
    assert json.loads(sim.stdout)["iteration_s"] == pytest.approx(doc["predicted"]["iteration_s"], rel=1e-9)


def test_interleaved_virtual_stages_1_is_one_chunk_per_group(files) -> None:
    prof, clus, _ = files
    r = _run("search", prof, "--cluster", clus, "--schedule", "interleaved", "--virtual-stages", "1", "--json",
             "--microbatches", "2")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["virtual_stages"] == 1 and doc["schedule"] == "interleaved"


def test_cli_rerank_default_is_the_search_default() -> None:
    from planner import commands, compare, search

    assert commands.RERANK == search.RERANK == compare.RERANK


def test_output_in_a_missing_folder_fails_before_searching(files) -> None:
    prof, clus, tmp = files
    r = _run("search", prof, "--cluster", clus, "-o", str(tmp / "nope" / "plan.json"))
    assert r.exit_code == 1 and "does not exist" in r.output
    assert not (tmp / "nope").exists()


def test_search_explains_itself_on_the_issues_case(tmp_path) -> None:
    """vgg16 on pipepar-4x2-2080ti leaves GPUs idle: the output says which, what using them costs, the bound,
    the runner-ups and the headroom; --explain adds the per-stage tables; --json carries the same facts."""
    r = _run("search", "profiles/vgg16-b64-2080ti.json", "--cluster", "pipepar-4x2-2080ti", "--explain", "--json")
    assert r.exit_code == 0, r.output
    e = json.loads(r.stdout)["explanation"]
    assert e["idle_devices"] and e["all_gpus"]["world_size"] == 8 and e["runner_ups"]
    idle = f"idle: {len(e['idle_devices'])} of 8 GPUs"
    for needle in ("why this plan", "bound by stage", idle, "the best judged plan on all 8",
                   "runner-ups:", "memory headroom:", "where the", "other plans the search judged"):
        assert needle in r.stderr, needle
    assert e["all_gpus"]["config"] in r.stderr


def test_piped_output_keeps_names_whole(files) -> None:
    """Not a terminal (CliRunner): tables widen instead of cutting names to 'devic…'."""
    prof, clus, _ = files
    r = _run("search", prof, "--cluster", clus, "--microbatches", "2")
    assert r.exit_code == 0, r.output
    assert "…" not in r.stderr and "devices" in r.stderr and "memory / device" in r.stderr


def test_progress_lines_when_asked_off_a_terminal(files) -> None:
    prof, clus, _ = files
    quiet = _run("search", prof, "--cluster", clus)
    loud = _run("search", prof, "--cluster", clus, "--progress")
    assert "searching plans" not in quiet.stderr
    assert "searching plans for toy" in loud.stderr and " s  M=" in loud.stderr


def test_a_cpu_profile_off_its_calibrated_clusters_speed_is_warned_on_stderr_and_in_json(tmp_path) -> None:
    profile = {**make_profile_dict(6, batch_size=8), "device": "cpu", "device_flops": 9e10}
    cluster = make_cluster_dict(1, 2)
    cluster["nodes"][0]["concurrent_devices"] = 2.0  # calibrated: two processes, two cores, flops 1e12
    r = _run("search", _write(tmp_path, "p.json", profile), "--cluster", _write(tmp_path, "c.json", cluster), "--json")
    assert r.exit_code == 0, r.output
    assert "warning: this CPU profile's times are scaled x0.09" in r.stderr and "--match-profile" in r.stderr
    assert "--match-profile" in json.loads(r.stdout)["rescale"]["warning"]
    matched = {**profile, "device_flops": 1e12}
    r = _run("search", _write(tmp_path, "m.json", matched), "--cluster", _write(tmp_path, "c.json", cluster), "--json")
    assert r.exit_code == 0 and "warning" not in r.stderr and "rescale" not in json.loads(r.stdout)


def test_the_rescale_note_escapes_the_names_it_quotes(tmp_path) -> None:
    """The note naming the profile's device and the cluster printed them raw: a device of "\\x1b]0;pwn\\x07" set the
    terminal's title (names read from files are printed escaped, README)."""
    profile = {**make_profile_dict(6, batch_size=8), "device": "\x1b]0;pwn\x07gpu", "device_flops": 5e11}
    cluster = {**make_cluster_dict(1, 2), "name": "\x1b[31mred"}
    r = _run("search", _write(tmp_path, "p.json", profile), "--cluster", _write(tmp_path, "c.json", cluster))
    assert r.exit_code == 0, r.output
    assert "note: profile times for \\x1b]0;pwn\\x07gpu" in r.stderr and "rescaled to \\x1b[31mred" in r.stderr
    assert "\x1b" not in r.stderr and "\x07" not in r.stderr


def test_a_forced_setting_that_changes_nothing_is_warned_on_stderr(files) -> None:
    """--recompute selective recomputes attention cores; a model without transformer blocks keeps every activation,
    as none does: the search says so (run said it before, the search did not), and its JSON stays one document."""
    prof, clus, _ = files
    r = _run("search", prof, "--cluster", clus, "--recompute", "selective", "--json", "--microbatches", "2")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["stages"][0]["recompute"] == "selective"
    assert "warning: the plan: stage 0 recomputes 'selective'" in r.stderr and "as 'none' does" in r.stderr
    quiet = _run("search", prof, "--cluster", clus, "--recompute", "full", "--json", "--microbatches", "2")
    assert quiet.exit_code == 0 and "as 'none' does" not in quiet.stderr


def test_a_plan_no_engine_runs_is_said_so(tmp_path: Path) -> None:
    """The default search (no --engine) ranges over plans no engine runs (here three processes on one server and one
    on the other, which no launcher starts); the plan is still written, with a warning naming each engine's refusal
    and the --engine that finds a runnable one, and that search's plan draws no warning."""
    profile = make_profile_dict(6, batch_size=16)
    for layer in profile["layers"][:2]:
        layer["param_bytes"], layer["param_count"] = 100_000_000, 25_000_000
    cluster = make_cluster_dict(2, 3)
    cluster["nodes"][1]["gpus"] = cluster["nodes"][1]["gpus"][:1]
    prof, clus = _write(tmp_path, "p.json", profile), _write(tmp_path, "c.json", cluster)
    r = _run("search", prof, "--cluster", clus, "-o", str(tmp_path / "plan.json"))
    assert r.exit_code == 0, r.output
    warning = [line for line in r.stderr.splitlines() if line.startswith("warning: no engine runs")]
    assert len(warning) == 1 and "(deepspeed, torch: the plan runs different numbers of processes per server (n0: 3, " \
        "n1: 1); each engine's launcher starts" in warning[0], warning  # alike refusals said once
    assert "torchtitan: toy is not a Llama-family model" in warning[0] and "--engine deepspeed|torch`" in warning[0]
    assert json.loads((tmp_path / "plan.json").read_text())["engine"] == "any"
    r = _run("search", prof, "--cluster", clus, "--engine", "torch", "-o", str(tmp_path / "torch.json"))
    assert r.exit_code == 0 and "warning" not in r.stderr, r.output


def test_a_nearly_full_gpu_is_warned_and_memory_headroom_keeps_a_share_free(tmp_path: Path) -> None:
    """A plan at 97% of its GPU's memory is written with a warning (the runtime's own memory and the allocator's
    fragmentation are not counted), which simulate repeats; --memory-headroom 0.1 plans within 90%, where the same
    plan does not fit (exit 3), and the plan embeds the cluster so reduced."""
    prof = _write(tmp_path, "p.json", make_profile_dict(3, batch_size=8))
    roomy = _write(tmp_path, "roomy.json", make_cluster_dict(1, 1))
    args = ("--config", "1", "--microbatches", "1", "--json")
    peak = json.loads(_run("search", prof, "--cluster", roomy, *args).stdout)["predicted"]["peak_memory_bytes"]
    assert "little memory free" not in _run("search", prof, "--cluster", roomy, *args).stderr
    tight = _write(tmp_path, "tight.json", make_cluster_dict(1, 1, memory_bytes=int(peak / 0.97)))
    out = tmp_path / "plan.json"
    r = _run("search", prof, "--cluster", tight, *args, "-o", str(out))
    assert r.exit_code == 0, r.output
    assert "little memory free: stage 0's peak is" in r.stderr and "(97.00%)" in r.stderr
    assert "--memory-headroom 0.1" in r.stderr
    sim = _run("simulate", str(out), "--json")
    assert any("little memory free" in w for w in json.loads(sim.stdout)["warnings"])
    r = _run("search", prof, "--cluster", tight, *args, "--memory-headroom", "0.1")
    assert r.exit_code == 3, r.output
    assert "keeps 10% of every GPU's memory free" in r.stderr
    r = _run("search", prof, "--cluster", roomy, *args, "--memory-headroom", "0.5")
    gpu = json.loads(r.stdout)["cluster"]["nodes"][0]["gpus"][0]
    assert gpu["memory_bytes"] == make_cluster_dict(1, 1)["nodes"][0]["gpus"][0]["memory_bytes"] // 2
    assert _run("search", prof, "--cluster", roomy, *args, "--memory-headroom", "0.95").exit_code == 2


def test_a_memory_headroom_of_nan_is_bad_usage(files) -> None:
    """click's range lets NaN through (it compares false with both bounds): --memory-headroom nan was an error (exit
    1) from deep in the search instead of the usage error (exit 2) every other value outside [0, 0.9] is."""
    prof, cluster, _ = files
    for command in ("search", "compare"):
        r = _run(command, prof, "--cluster", cluster, "--memory-headroom", "nan", "--json")
        assert r.exit_code == 2, (command, r.output)
        assert "not a finite number" in r.output and r.stdout == ""


def test_a_plan_searched_with_memory_headroom_is_judged_on_the_gpus_whole_memory(tmp_path: Path) -> None:
    """--memory-headroom 0.1 on a GPU the plan fills to 89% of: the plan's cluster offers 90%, where the plan is at
    99%, and search and simulate warned 'leaves little memory free' and to use `--memory-headroom 0.1`, the option
    already given; the plan's cluster records the share kept free (memory_kept_free) and the share is the whole
    GPU's. A smaller headroom still warns, in the whole GPU's numbers."""
    prof = _write(tmp_path, "p.json", make_profile_dict(3, batch_size=8))
    roomy = _write(tmp_path, "roomy.json", make_cluster_dict(1, 1))
    args = ("--config", "1", "--microbatches", "1", "--json")
    peak = json.loads(_run("search", prof, "--cluster", roomy, *args).stdout)["predicted"]["peak_memory_bytes"]
    memory = int(peak / 0.89)
    gpu = _write(tmp_path, "gpu.json", make_cluster_dict(1, 1, memory_bytes=memory))
    out = tmp_path / "plan.json"
    r = _run("search", prof, "--cluster", gpu, *args, "--memory-headroom", "0.1", "-o", str(out))
    assert r.exit_code == 0, r.output
    assert "little memory free" not in r.stderr
    assert json.loads(out.read_text())["cluster"]["memory_kept_free"] == 0.1
    sim = _run("simulate", str(out), "--json")
    assert not any("little memory free" in w for w in json.loads(sim.stdout)["warnings"]), sim.stdout
    tight = _write(tmp_path, "tight.json", make_cluster_dict(1, 1, memory_bytes=int(peak / 0.97)))
    r = _run("search", prof, "--cluster", tight, *args, "--memory-headroom", "0.02", "-o", str(out))
    assert r.exit_code == 0, r.output
    assert "of which the plan keeps free (97.00%)" in r.stderr and "--memory-headroom 0.1" in r.stderr
    sim = _run("simulate", str(out), "--json")
    assert any("(97.00%)" in w for w in json.loads(sim.stdout)["warnings"])


def test_sequence_parallelism_is_on_by_default_and_off_keeps_the_norms_whole(tmp_path) -> None:
    """A block whose norms and residual adds are 20% of its time: with --tp 2 the default splits them over the
    sequence; --no-sequence-parallel runs them whole on both ranks, a slower step (planner.costmodel.blocks)."""
    import dataclasses

    from tests.test_export_torchtitan import llama_profile

    base = llama_profile(4)
    prof = dataclasses.replace(base, layers=tuple(
        dataclasses.replace(x, forward_replicated_s=0.2 * x.forward_s, backward_replicated_s=0.2 * x.backward_s)
        if x.block is not None else x for x in base.layers))
    p = _write(tmp_path, "p.json", prof.to_dict())
    c = _write(tmp_path, "c.json", make_cluster_dict(1, 2))
    plans = {}
    for flag in ("--sequence-parallel", "--no-sequence-parallel"):
        res = _run("search", p, "--cluster", c, "--tp", "2", "--config", "2", "--micro-batch-size", "1", flag, "--json")
        assert res.exit_code == 0, res.output
        plans[flag] = json.loads(res.stdout)
    on, off = plans["--sequence-parallel"], plans["--no-sequence-parallel"]
    assert [s["sequence_parallel"] for s in on["stages"]] == [True]
    assert [s.get("sequence_parallel", False) for s in off["stages"]] == [False]
    assert off["predicted"]["iteration_s"] > on["predicted"]["iteration_s"]


def test_a_search_for_an_engine_a_cpu_cluster_was_not_calibrated_for_warns(tmp_path: Path) -> None:
    """The README's cluster measured DeepSpeed only; its torch plan was a tensor group predicted at 14.4 ms that ran
    at 33: the search says the engine's overheads are missing and how to measure them, and not once they are."""
    cluster = make_cluster_dict(1, 2)
    cluster["nodes"][0]["concurrent_devices"] = 2.0  # CPU processes sharing cores, as planner calibrate writes
    cluster["engine_overheads"] = {"deepspeed": {"per_action_s": 1e-4}}
    prof = _write(tmp_path, "p.json", make_profile_dict(4, batch_size=8))
    clus = _write(tmp_path, "c.json", cluster)
    warned = _run("search", prof, "--cluster", clus, "--engine", "torch", "-o", str(tmp_path / "t.json"))
    assert warned.exit_code == 0 and "no measured overheads for torch" in warned.stderr
    assert "planner calibrate --engines torch" in warned.stderr
    quiet = _run("search", prof, "--cluster", clus, "--engine", "deepspeed", "-o", str(tmp_path / "d.json"))
    assert quiet.exit_code == 0 and "no measured overheads" not in quiet.stderr

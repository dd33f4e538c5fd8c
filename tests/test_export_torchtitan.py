"""export.torchtitan: job configs for Llama-family plans in torchtitan 0.2.0's schema, and refusals.

Most plans here use a hand-made profile with the shape of torchtitan's llama3 ``debugmodel`` (the
config writer reads only the layers' structure and block shapes), so that the flavor maps; the
profiler's tiny Llama is exported too.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import tomllib
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from planner import ir
from planner.cli import main
from planner.errors import ExportError
from planner.export import torchtitan as tt
from planner.export.quoting import one_line
from tests.conftest import make_cluster_dict
from tests.test_export_grids import grid_plan
from tests.test_export_quoting import HOSTILE


def llama_profile(blocks: int = 6, hidden: int = 256, heads: int = 16, kv_heads: int = 16,
                  shaped: bool = True, ffn: int | None = None, vocab: int = 1024) -> ir.ModelProfile:
    """A Llama-shaped profile (FFN ``4 * hidden`` wide unless ``ffn``); ``shaped``: its embedding and head carry their
    weight shapes (the split forms open), as a profile of a real model does."""
    shape = ir.BlockShape(hidden, heads, kv_heads, ffn or 4 * hidden, 64, gated=True)
    ends = [{"in_features": vocab, "out_features": hidden}, {"in_features": hidden, "out_features": vocab}]
    if not shaped:
        ends = [{}, {}]
    layer = {"forward_s": 1e-3, "backward_s": 2e-3, "forward_flops": 1e9, "backward_flops": 2e9, "param_count": 1000,
             "param_bytes": 4000, "output_bytes": 1000, "saved_bytes": 1000}
    layers = [{"name": "model.embed_tokens", "type": "Embedding", **layer, **ends[0]}]
    layers += [{"name": f"model.layers.{i}", "type": "LlamaDecoderLayer", "block": shape.to_dict(), **layer}
               for i in range(blocks)]
    layers += [{"name": "lm_head", "type": "Linear", **layer, **ends[1]}]
    return ir.ModelProfile.from_dict({"kind": "profile", "version": 1, "model": "llama-debug", "batch_size": 8,
                                      "dtype": "float32", "mode": "analytic", "device": "cpu",
                                      "device_flops": 1e12, "input_shape": [64], "layers": layers})


def titan_plan(parts: list[int], tp: int = 1, dp: int = 1, **stage: Any) -> ir.Plan:
    prof = llama_profile(ffn=768, vocab=2048)  # torchtitan's debugmodel: 768 = 4 x 256 x 2/3 up to a multiple of 256
    cluster = ir.Cluster.from_dict(make_cluster_dict(2, 4))
    k = len(parts) - 1
    devices = [g.name for g in cluster.gpus]
    w = tp * dp
    ends = {0: "split_in", len(prof.layers) - 1: "split_out"}  # torchtitan's vocabulary-parallel embedding and head
    stages = tuple(ir.Stage((parts[s], parts[s + 1]), tuple(devices[s * w:(s + 1) * w]),
                            tuple(("tp" if prof.layers[i].block else ends.get(i, "dp")) if tp > 1 else "dp"
                                  for i in range(parts[s], parts[s + 1])),
                            0, tp=tp, **stage) for s in range(k))
    return ir.Plan(profile=prof, cluster=cluster, schedule="1f1b", microbatches=2, optimizer="adam", stages=stages,
                   predicted=ir.Prediction(0.01, 800.0, 0.1, 0), engine="torchtitan")


def _parse(plan: ir.Plan) -> dict[str, Any]:
    doc = tomllib.loads(tt.config_text(plan))
    for section, values in doc.items():
        for key, value in values.items():
            assert isinstance(value, tt.SCHEMA[section][key]), (section, key, value)
    return doc


def test_uneven_pipeline_by_fsdp_grid_with_bf16_and_full_recompute() -> None:
    plan = dataclasses.replace(titan_plan([0, 3, 8], dp=2, zero=3, recompute="full"), precision="bf16")
    doc = _parse(plan)
    par = doc["parallelism"]
    assert par["module_fqns_per_model_part"] == [["tok_embeddings", "layers.0", "layers.1"],
                                                 ["layers.2", "layers.3", "layers.4", "layers.5", "norm", "output"]]
    assert (par["pipeline_parallel_degree"], par["tensor_parallel_degree"]) == (2, 1)
    assert (par["data_parallel_shard_degree"], par["data_parallel_replicate_degree"]) == (2, 1)
    assert par["fsdp_reshard_after_forward"] == "always"
    assert par["pipeline_parallel_schedule"] == "1F1B" and par["pipeline_parallel_microbatch_size"] == 2
    assert doc["training"]["local_batch_size"] == 4 and doc["training"]["global_batch_size"] == 8
    assert doc["training"]["mixed_precision_param"] == "bfloat16" and doc["training"]["seq_len"] == 64
    assert doc["activation_checkpoint"]["mode"] == "full"
    assert doc["model"] == {"name": "llama3", "flavor": "debugmodel"}


def test_without_a_pipeline_torchtitan_accumulates_the_plans_micro_batches() -> None:
    """K = 1: the local batch is one micro-batch, so torchtitan's gradient accumulation steps
    (global // (local x dp)) are the plan's M, not one pass over the rank's batch with M times the
    activations; with a pipeline the local batch is the rank's and its schedule makes the M."""
    one = titan_plan([0, 8], dp=2, zero=2)
    training = _parse(one)["training"]
    assert training["local_batch_size"] == 2 and training["global_batch_size"] == 8
    assert training["global_batch_size"] // (training["local_batch_size"] * 2) == one.microbatches
    piped = _parse(titan_plan([0, 4, 8], dp=2))
    assert piped["training"]["local_batch_size"] == 4
    assert piped["training"]["local_batch_size"] // piped["parallelism"]["pipeline_parallel_microbatch_size"] == 2


def test_tensor_by_replicated_data_grid_with_zero2_and_interleaved_chunks() -> None:
    plan = titan_plan([0, 8], tp=2, dp=2, sequence_parallel=True)
    par = _parse(plan)["parallelism"]
    assert (par["tensor_parallel_degree"], par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]) \
        == (2, 2, 1)
    chunks = titan_plan([0, 2, 4, 6, 8], dp=1)
    stages = tuple(dataclasses.replace(s, devices=(f"n0.g{i % 2}",)) for i, s in enumerate(chunks.stages))
    inter = dataclasses.replace(chunks, stages=stages, virtual_stages=2, schedule="interleaved")
    par = _parse(inter)["parallelism"]
    assert par["pipeline_parallel_degree"] == 2 and len(par["module_fqns_per_model_part"]) == 4
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    zero2 = _parse(titan_plan([0, 8], dp=2, zero=2))["parallelism"]
    assert zero2["fsdp_reshard_after_forward"] == "never"


@pytest.mark.parametrize(("change", "words"), [
    ({"zero": 1}, "ZeRO stage 1; torchtitan runs 0, 2, 3"), ({"recompute": "selective"}, "recomputes 'selective'"),
    ({"precision": "fp16"}, "fp16"),
    ({"tp": 2}, "without sequence parallelism")])
def test_what_torchtitan_cannot_express_is_refused(change: dict[str, Any], words: str) -> None:
    tp = change.pop("tp", 1)
    precision = change.pop("precision", "fp32")
    plan = dataclasses.replace(titan_plan([0, 8], tp=tp, dp=2 if tp == 1 else 1, **change), precision=precision)
    with pytest.raises(ExportError, match=words) as err:
        tt.check_plan(plan)
    assert "--engine torchtitan" in err.value.hint


def test_blocks_in_a_tensor_group_without_the_tp_form_are_refused() -> None:
    """torchtitan would shard the block Megatron-style: not what the plan says."""
    plan = titan_plan([0, 8], tp=2, sequence_parallel=True)
    st = plan.stages[0]
    one_dp = dataclasses.replace(plan, stages=(dataclasses.replace(st, forms=("dp", "dp", *st.forms[2:])),))
    with pytest.raises(ExportError, match=r"transformer block\(s\) 1 in a tensor group of 2 without the tp form"):
        tt.check_plan(one_dp)


def test_a_model_that_is_not_llama_family_is_refused() -> None:
    plan = dataclasses.replace(grid_plan("tiny_gpt2", [0, 6], dp=2), engine="torchtitan")
    with pytest.raises(ExportError, match="not a Llama-family model"):
        tt.check_plan(plan)


def test_a_model_without_transformer_blocks_is_refused_not_crashed(tmp_path: Path) -> None:
    """The README's flavor note read the first block before the plan was checked: an IndexError (exit 1, 'internal
    error') instead of the refusal, for any plan of a model without blocks (an MLP, a ResNet)."""
    plan = titan_plan([0, 8], dp=2)
    blockless = dataclasses.replace(plan.profile, layers=tuple(dataclasses.replace(lp, block=None)
                                                               for lp in plan.profile.layers))
    plan = dataclasses.replace(plan, profile=blockless)
    with pytest.raises(ExportError, match="not a Llama-family model"):
        tt.files(plan)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.to_dict()))
    res = CliRunner().invoke(main, ["export", str(path), "--to", "torchtitan", "-o", str(tmp_path / "tt")])
    assert res.exit_code == 1, res.output
    assert "not a Llama-family model" in res.output and "internal error" not in res.output
    assert not (tmp_path / "tt").exists()


def test_cli_exports_a_job_config(tmp_path: Path) -> None:
    plan = titan_plan([0, 4, 8], dp=2, zero=3)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.to_dict()))
    res = CliRunner().invoke(main, ["export", str(path), "--to", "torchtitan", "-o", str(tmp_path / "tt"), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert (out["kind"], out["version"], out["engine"], out["world_size"]) == ("export", 1, "torchtitan", 4)
    assert sorted(Path(f).name for f in out["files"]) == ["README.md", "job_config.toml", "plan.json"]
    assert out["commands"] == [tt.launch_command(plan, str(tmp_path / "tt"))]
    doc = tomllib.loads((tmp_path / "tt" / "job_config.toml").read_text())
    assert doc["parallelism"]["data_parallel_shard_degree"] == 2


def test_one_server_launches_every_rank_with_one_torchrun() -> None:
    plan = titan_plan([0, 4, 8], dp=2, zero=3)  # n0's 4 GPUs
    assert tt.servers(plan) == (None, "") and tt.launch_scripts(plan) == {}
    assert tt.launch_commands(plan, "out dir") == [
        "cd 'out dir' && torchrun --nproc_per_node 4 -m torchtitan.train --job.config_file job_config.toml"]
    assert "torchrun --nproc_per_node 4 -m torchtitan.train" in tt.files(plan)["README.md"]


def test_a_plan_on_two_servers_gets_a_launch_script_per_server() -> None:
    """Once one torchrun of all 8 ranks (no --nnodes, no rendezvous): now node rank R's script on server R."""
    plan = titan_plan([0, 4, 8], dp=4, zero=3)  # stage 0 on n0's 4 GPUs, stage 1 on n1's
    files = tt.files(plan)
    assert sorted(files) == ["README.md", "job_config.toml", "launch_node0.sh", "launch_node1.sh", "plan.json"]
    for rank in (0, 1):
        script = files[f"launch_node{rank}.sh"]
        assert f"--nnodes=2 --node-rank={rank} --nproc-per-node=4 --rdzv-backend=static" in script
        assert script.rstrip().endswith('-m torchtitan.train --job.config_file job_config.toml "$@"')
        assert "train.py" not in script
    assert tt.launch_commands(plan, "o") == ["server n0: cd o && sh launch_node0.sh HOST:PORT",
                                             "server n1: cd o && sh launch_node1.sh HOST:PORT"]
    assert "sh launch_node1.sh HOST:PORT   # on server n1" in files["README.md"]
    assert "--nproc_per_node 8" not in files["README.md"]


def test_a_launch_script_passes_the_endpoint_and_torchtitan_options_to_torchrun(tmp_path: Path) -> None:
    script = tmp_path / "launch_node1.sh"
    script.write_text(tt.files(titan_plan([0, 4, 8], dp=4, zero=3))["launch_node1.sh"])
    run = subprocess.run(["sh", str(script), "10.0.0.1:29400", "--training.steps", "20"], capture_output=True,
                         text=True, env={**os.environ, "TORCHRUN": "echo"}, timeout=60, check=True)
    assert run.stdout.split() == ["--nnodes=2", "--node-rank=1", "--nproc-per-node=4", "--rdzv-backend=static",
                                  "--rdzv-endpoint=10.0.0.1:29400", "--rdzv-conf=timeout=60", "-m",
                                  "torchtitan.train", "--job.config_file", "job_config.toml", "--training.steps",
                                  "20"]


def test_a_plan_torchrun_cannot_start_server_by_server_says_why() -> None:
    """6 ranks on 4 + 2 GPUs: torchrun starts as many processes on every server, so one torchrun, and why."""
    plan = titan_plan([0, 8], dp=6, zero=3)
    layout, why = tt.servers(plan)
    assert layout is None and "different numbers of GPUs per server" in why
    assert tt.launch_scripts(plan) == {}
    assert tt.launch_commands(plan, "o") == [tt.launch_command(plan, "o")]


def test_cli_exports_a_plan_on_two_servers(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(titan_plan([0, 4, 8], dp=4, zero=3).to_dict()))
    res = CliRunner().invoke(main, ["export", str(path), "--to", "torchtitan", "-o", str(tmp_path / "tt"), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert (out["kind"], out["version"]) == ("export", 1)
    assert [Path(f).name for f in out["files"] if f.endswith(".sh")] == ["launch_node0.sh", "launch_node1.sh"]
    assert out["commands"][1] == f"server n1: cd {shlex.quote(str(tmp_path / 'tt'))} && sh launch_node1.sh HOST:PORT"
    assert os.access(tmp_path / "tt" / "launch_node1.sh", os.X_OK)


def test_torchtitans_own_loader_accepts_the_file(tmp_path: Path) -> None:
    """Runs where torchtitan 0.2.0 and its loader's dependencies (tyro) are installed."""
    manager = pytest.importorskip("torchtitan.config.manager")
    path = tmp_path / "job.toml"
    path.write_text(tt.config_text(dataclasses.replace(titan_plan([0, 3, 8], dp=2, zero=3), precision="bf16")))
    cfg = manager.ConfigManager().parse_args(["--job.config_file", str(path)])
    assert cfg.parallelism.module_fqns_per_model_part[0] == ["tok_embeddings", "layers.0", "layers.1"]
    assert cfg.parallelism.data_parallel_shard_degree == 2


def test_a_profiled_llama_exports_with_its_own_flavor_to_register() -> None:
    """The profiler's tiny Llama (hidden 64, 2 blocks, 4 heads, 2 KV heads) has no torchtitan flavor:
    the file names 'planner' and says which TransformerModelArgs to register."""
    plan = dataclasses.replace(grid_plan("tiny_llama", [0, 2, 4], dp=2, zero=3), engine="torchtitan", optimizer="adam")
    text = tt.config_text(plan)
    doc = tomllib.loads(text)
    assert doc["model"]["flavor"] == "planner"
    assert "TransformerModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2" in text
    assert doc["parallelism"]["module_fqns_per_model_part"] == [["tok_embeddings", "layers.0"],
                                                                ["layers.1", "norm", "output"]]


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_model_name_stays_in_its_toml_string(name: str) -> None:
    plan = titan_plan([0, 4, 8], dp=2, zero=3)
    hostile = dataclasses.replace(plan, profile=dataclasses.replace(plan.profile, model=name))
    files, ordinary = tt.files(hostile), tt.files(plan)
    assert tomllib.loads(files["job_config.toml"]).keys() == tomllib.loads(ordinary["job_config.toml"]).keys()
    assert _parse(hostile)["job"]["description"] == f"planner plan {plan.config} for {one_line(name)}"
    assert files["job_config.toml"].count("\n") == ordinary["job_config.toml"].count("\n")
    assert files["README.md"].count("\n") == ordinary["README.md"].count("\n")
    files["job_config.toml"].encode("utf-8")


def test_toml_strings_escape_quotes_backslashes_and_control_characters() -> None:
    text = tt.toml_text({"job": {"description": 'a"b\\c\nd = 1\n[x]\x00'}}, "line one\nline\x1b two")
    assert tomllib.loads(text) == {"job": {"description": 'a"b\\c\nd = 1\n[x]\x00'}}
    assert text.splitlines()[:2] == ["# line one", "# 'line\\x1b two'"]


def test_a_flavor_is_named_only_for_the_model_it_builds() -> None:
    """torchtitan's debugmodel has 256 x 6 blocks of 16 heads, an FFN 768 wide and 2048 tokens; a profile with its
    blocks but a 1024-wide FFN and 1024 tokens got the flavor too, so torchtitan trained another model than the
    plan's. It gets the 'planner' flavor, with every argument that builds it, under torchtitan's name for the table
    (``llama3_args``; the file said ``llama3_configs``, which torchtitan 0.2.0 does not have)."""
    other = dataclasses.replace(titan_plan([0, 8], dp=2), profile=llama_profile())
    text = tt.config_text(other)
    assert tomllib.loads(text)["model"]["flavor"] == "planner"
    assert ("llama3_args['planner'] = TransformerModelArgs(dim=256, n_layers=6, n_heads=16, n_kv_heads=16, "
            "vocab_size=1024, multiple_of=1024, ffn_dim_multiplier=1.502199)") in text
    assert tt.titan_ffn(256, 1024, 1.502199) == 1024
    readme = tt.files(other)["README.md"]
    assert "add `llama3_args['planner'] = TransformerModelArgs(dim=256" in readme
    assert "cd . &&" not in readme and "torchrun --nproc_per_node 2 -m torchtitan.train" in readme
    assert "llama3_args" not in tt.files(titan_plan([0, 8], dp=2))["README.md"]  # debugmodel: nothing to add


def test_torchtitans_own_flavors_are_their_ffn_widths() -> None:
    """torchtitan/models/llama3/__init__.py: 8B (x1.3, multiple of 1024), 70B (x1.3, 4096), 405B (x1.2, 4096) and
    debugmodel (defaults) build FFNs of 14336, 28672, 53248 and 768, the widths :data:`tt.FLAVORS` holds."""
    built = {tt.titan_ffn(4096, 1024, 1.3), tt.titan_ffn(8192, 4096, 1.3), tt.titan_ffn(16384, 4096, 1.2),
             tt.titan_ffn(256)}
    assert built == {key[4] for key in tt.FLAVORS}


@given(st.integers(1, 20_000), st.integers(1, 100_000))
def test_the_ffn_arguments_build_the_profiles_width(dim: int, ffn: int) -> None:
    assert tt.titan_ffn(dim, **tt.ffn_args(dim, ffn)) == ffn  # type: ignore[arg-type]


def test_a_plan_for_another_optimizer_than_adam_is_refused() -> None:
    """torchtitan builds Adam or AdamW only: an sgd plan was written as AdamW, two fp32 states per weight its memory
    did not count."""
    plan = dataclasses.replace(titan_plan([0, 8], dp=2), optimizer="sgd")
    with pytest.raises(ExportError, match=r"torchtitan trains with the optimizer adam, not sgd") as err:
        tt.check_plan(plan)
    assert "--engine torchtitan" in err.value.hint

"""planner profile: the command end to end, and every bad input as a one-line error with no file left."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch import nn

from planner.cli import main
from planner.ir import ModelProfile
from planner.schemas.build import MAX_BATCH, MAX_BYTES, MAX_DIM, MAX_FLOPS, MAX_ITEMS


def fixed_linear() -> nn.Module:
    return nn.Sequential(nn.Linear(10, 4))


def raising_factory() -> nn.Module:
    raise RuntimeError("checkpoint shards missing: cannot build")


class _Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) if x.mean() > 0 else -self.fc(x)


def untraceable() -> nn.Module:
    return _Branchy()


class _Two(nn.Module):
    """Two linear layers; ``frozen``: none trains; ``argmax``: returns class indices, no gradient."""

    def __init__(self, frozen: bool = False, argmax: bool = False) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)
        self.argmax = argmax
        self.requires_grad_(not frozen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.b(self.a(x))
        return y.argmax(-1) if self.argmax else y


def no_params() -> nn.Module:
    return nn.Sequential(nn.ReLU(), nn.Tanh())


def frozen() -> nn.Module:
    return _Two(frozen=True)


def int_out() -> nn.Module:
    return _Two(argmax=True)


def _run(args: list[str]) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, args)
    return result.exit_code, result.stdout, result.stderr


def test_analytic_profile_written_and_loadable(tmp_path: Path) -> None:
    out = tmp_path / "vgg.json"
    code, stdout, stderr = _run(["profile", "vgg11", "--batch-size", "8", "--mode", "analytic",
                                 "--device-flops", "v100", "-o", str(out)])
    assert code == 0, stderr
    prof = ModelProfile.from_dict(json.loads(out.read_text()))
    assert prof.model == "vgg11" and prof.batch_size == 8 and prof.mode == "analytic"
    assert prof.device_flops == 15.7e12 and len(prof.layers) == 11
    assert "overrides" not in prof.meta  # no --set, nothing recorded
    assert "features.0" in stderr and "total" in stderr  # the summary table, on stderr
    assert stdout == ""


def test_measured_json_is_one_document_on_stdout(tmp_path: Path) -> None:
    out = tmp_path / "mlp.json"
    code, stdout, stderr = _run(["profile", "mlp", "--batch-size", "4", "--threads", "1", "--repeats", "1",
                                 "--json", "-o", str(out)])
    assert code == 0, stderr
    doc = json.loads(stdout)
    assert doc["kind"] == "profile" and doc["mode"] == "measured" and doc == json.loads(out.read_text())


@pytest.mark.parametrize("as_json", [False, True])
def test_no_progress_bar_under_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, as_json: bool) -> None:
    """docs/contracts.md: progress shows on a terminal when --json is not given; profile drew its bar anyway."""
    import contextlib

    from planner.render import profile as render

    asked: list[bool] = []

    @contextlib.contextmanager
    def spy(title: str, show: bool = True) -> Iterator[Callable[[int, int, str], None]]:
        asked.append(show)
        yield lambda done, total, what: None

    monkeypatch.setattr(render, "progress_bar", spy)
    code, _, stderr = _run(["profile", "mlp", "--batch-size", "4", "--mode", "analytic", "--device-flops", "v100",
                            "-o", str(tmp_path / "p.json"), *(["--json"] if as_json else [])])
    assert code == 0, stderr
    assert asked == [not as_json]


def test_factory_model_with_input_shape(tmp_path: Path) -> None:
    out = tmp_path / "f.json"
    code, _, stderr = _run(["profile", "tests.test_cmd_profile:fixed_linear", "--input-shape", "10",
                            "--mode", "analytic", "-o", str(out)])
    assert code == 0, stderr
    assert json.loads(out.read_text())["layers"][0]["in_features"] == 10


def test_llama_in_bfloat16_on_a100_uses_the_bf16_peak_and_records_blocks(tmp_path: Path) -> None:
    out = tmp_path / "llama.json"
    code, _, stderr = _run(["profile", "llama2-70b", "--set", "num_hidden_layers=2", "--set", "vocab_size=1000",
                            "--mode", "analytic", "--device-flops", "a100", "--dtype", "bfloat16",
                            "--batch-size", "1", "--input-shape", "4096", "-o", str(out)])
    assert code == 0, stderr
    doc = json.loads(out.read_text())
    assert doc["device_flops"] == 312e12 and doc["dtype"] == "bfloat16" and len(doc["layers"]) == 4
    assert doc["layers"][1]["block"] == {"hidden": 8192, "heads": 64, "kv_heads": 8, "ffn": 28672, "seq_len": 4096,
                                         "gated": True, "attention_saved": False}  # SDPA: fused kernels
    assert "block" not in doc["layers"][0] and doc["input_shape"] == [4096]
    assert ModelProfile.from_dict(doc).layers[2].block is not None


def test_set_parses_ints_floats_and_bools(tmp_path: Path) -> None:
    out = tmp_path / "g.json"
    code, _, stderr = _run(["profile", "gpt2", "--set", "n_layer=1", "--set", "layer_norm_epsilon=1e-6", "--set",
                            "tie_word_embeddings=false", "--input-shape", "2048", "--mode", "analytic", "-b", "1",
                            "-o", str(out)])
    assert code == 0, stderr
    doc = json.loads(out.read_text())
    assert len(doc["layers"]) == 3 and doc["ties"] == [] and doc["layers"][1]["block"]["seq_len"] == 2048
    # recorded, so that `planner run PLAN --model gpt2` builds this model and not the full-size one
    assert doc["meta"]["overrides"] == {"n_layer": 1, "layer_norm_epsilon": 1e-6, "tie_word_embeddings": False}


def test_set_null_unsets_a_field_the_config_may_leave_unset(tmp_path: Path) -> None:
    """Gemma 2's soft caps off (``float | None`` fields): recorded as null, so `planner run` builds the same model;
    a field that must hold a value is refused with its default."""
    out = tmp_path / "g.json"
    args = ["profile", "gemma2-9b", "--set", "num_hidden_layers=1", "--set", "final_logit_softcapping=null", "--set",
            "attn_logit_softcapping=None", "--input-shape", "64", "--mode", "analytic", "-b", "1", "-o", str(out)]
    code, _, stderr = _run(args)
    assert code == 0, stderr
    overrides = json.loads(out.read_text())["meta"]["overrides"]
    assert overrides == {"num_hidden_layers": 1, "final_logit_softcapping": None, "attn_logit_softcapping": None}
    code, _, stderr = _run([*args[:4], "--set", "hidden_size=null", *args[8:]])
    assert code == 2 and "--set hidden_size=null: gemma2-9b's hidden_size cannot be unset (default 3584)" in stderr
    assert "e.g. --set hidden_size=3584" in stderr


GPT2 = ["profile", "gpt2", "--mode", "analytic", "-b", "2"]


def own(factory: str, *args: str) -> list[str]:
    """``planner profile`` of a factory of this file at batch 2, one thread, with ``args``."""
    return ["profile", f"tests.test_cmd_profile:{factory}", "-b", "2", "--threads", "1", *args]


BAD_INPUTS = [
    (["profile", "vgg17"], 1, "built-in models: mlp"),
    (["profile", "no_such_pkg.nets:build", "--input-shape", "4"], 1, "cannot import"),
    (["profile", "tests.test_cmd_profile:raising_factory", "--input-shape", "4"], 1, "checkpoint shards missing"),
    (["profile", "tests.test_cmd_profile:fixed_linear", "--input-shape", "7"], 1, "rejects input of shape (7,)"),
    (["profile", "tests.test_cmd_profile:untraceable", "--input-shape", "4"], 1, "cannot trace"),
    (["profile", "mlp", "--batch-size", "0"], 2, "--batch-size"),
    (["profile", "mlp", "--input-shape", "3,-1"], 2, "--input-shape"),
    (["profile", "mlp", "--mode", "analytic", "--device-flops", "tpu9"], 2, "--device-flops"),
    (["profile", "llama-tiny", "--mode", "analytic", "--set", "num_hiden_layers=2"], 2, "num_hidden_layers"),
    (["profile", "llama-tiny", "--mode", "analytic", "--set", "layers"], 2, "KEY=VALUE"),
    (["profile", "mlp", "--mode", "analytic", "--set", "depth=2"], 2, "no transformer"),
    (["profile", "llama", "--set", "hidden_size=64"], 1, "built-in models: mlp"),  # a misspelt zoo name with --set
    (["profile", "tests.test_cmd_profile:fixed_linear", "--set", "n_layer=1"], 2, "your own model"),
    (["profile", "llama-tiny", "--mode", "analytic", "--dtype", "bfloat16", "--device-flops", "v100"], 2, "bf16"),
    # --set values of the wrong kind, sizes below 1, models the library refuses to build
    ([*GPT2, "--set", "num_hidden_layers=abc"], 2, "--set num_hidden_layers='abc': num_hidden_layers is a size"),
    ([*GPT2, "--set", "num_hidden_layers=2=3"], 2, "--set num_hidden_layers='2=3'"),
    ([*GPT2, "--set", "num_hidden_layers=-1"], 2, f"a whole number from 1 to {MAX_ITEMS:,}"),
    ([*GPT2, "--set", "vocab_size=0"], 2, "--set vocab_size=0"),
    ([*GPT2, "--set", "n_head=5"], 2, "gpt2 cannot be built with --set n_head=5: `embed_dim` must be divisible"),
    ([*GPT2, "--set", "n_embd=7"], 2, "cannot be built with --set n_embd=7"),
    ([*GPT2, "--set", "activation_function=evil"], 2, "activation_function=evil: unknown name 'evil'"),
    ([*GPT2, "--set", "n_positions=4"], 2, "--set n_positions=4: gpt2 then holds 4 positions, fewer than the 128"),
    (["profile", "gpt2", "-b", "2", "--threads", "1", "--set", "n_positions=4"], 2, "fewer than the 128 tokens"),
    # more threads than cores (torch started a million and the process died of a segmentation fault)
    (["profile", "mlp", "-b", "2", "--threads", "1000000"], 2, "cores this process may run on, got 1000000"),
    (["profile", "mlp", "-b", "2", "--threads", "0"], 2, "--threads"),
    # passes without end (10**23 repeats profiled until killed), or none
    (["profile", "mlp", "-b", "2", "--repeats", str(10**23)], 2, "--repeats must be 1 to 1000 and --warmup 0 to 1000"),
    (["profile", "mlp", "-b", "2", "--warmup", str(10**23)], 2, "--repeats must be 1 to 1000"),
    (["profile", "mlp", "-b", "2", "--repeats", "0"], 2, "--repeats must be 1 to 1000"),
    (["profile", "mlp", "-b", "2", "--warmup", "-1"], 2, "--warmup 0 to 1000"),
    # models with nothing to train or no gradient, measured and analytic alike
    (own("no_params", "--input-shape", "4"), 1, "has no parameters, so training it has nothing to update"),
    (own("no_params", "--input-shape", "4", "--mode", "analytic"), 1, "has no parameters"),
    (own("frozen", "--input-shape", "4"), 1, "4 parameter tensors requires grad (all frozen)"),
    (own("frozen", "--input-shape", "4", "--mode", "analytic"), 1, "(all frozen)"),
    (own("int_out", "--input-shape", "4"), 1, "is a tensor of int64, not floating point"),
    (own("int_out", "--input-shape", "4", "--mode", "analytic"), 1, "not floating point"),
    # input shapes: empty sizes, sizes and batches beyond what a profile holds
    (["profile", "mlp", "--mode", "analytic", "-b", "2", "--input-shape", "3,,224"], 2, "has an empty size"),
    (["profile", "mlp", "--mode", "analytic", "-b", "2", "--input-shape", "3,224,"], 2, "has an empty size"),
    (["profile", "vgg11", "--mode", "analytic", "-b", "2", "--input-shape", "99999999999999999999999"], 2,
     f"above the {MAX_DIM:,} a profile holds per dimension"),
    (["profile", "mlp", "-b", "64", "--input-shape", "1000000000000"], 2, f"above the {MAX_DIM:,}"),
    (["profile", "mlp", "--mode", "analytic", "-b", "8", "--input-shape", "1000000000000"], 2,
     f"above the {MAX_DIM:,}"),
    (["profile", "vgg11", "--mode", "analytic", "-b", "2", "--input-shape", f"3,{MAX_DIM},{MAX_DIM}"], 2,
     f"above the {MAX_BYTES:.0e} bytes a profile holds"),
    (["profile", "mlp", "--mode", "analytic", "-b", str(MAX_BATCH + 1)], 2,
     f"--batch-size must be from 1 to {MAX_BATCH:,}"),
    # rates beyond the profile's bounds
    (["profile", "mlp", "--mode", "analytic", "-b", "8", "--device-flops", "1e30"], 2,
     f"--device-flops must be a FLOP/s figure above 0 and at most {MAX_FLOPS:.0e}"),
    (["profile", "mlp", "-b", "8", "--device-flops", "1e30"], 2, "--device-flops must be a FLOP/s figure"),
    (["profile", "mlp", "--mode", "analytic", "-b", "8", "--device-flops", "1e-300"], 2,
     "--device-flops 1e-300 x --efficiency 0.5 is 5e-301 FLOP/s: one FLOP would take longer than"),
    (["profile", "mlp", "--mode", "analytic", "-b", "8", "--efficiency", "1e-300"], 2, "one FLOP would take longer"),
    (["profile", "mlp", "--mode", "analytic", "--efficiency", "1.5"], 2, "--efficiency must be a share of peak"),
    (["profile", "vgg11", "--mode", "analytic", "-b", "8", "--device-flops", "1e9", "--efficiency", "1e-5"], 1,
     "above the maximum 1e+06 (seconds): out of what a profile file holds, so none is written"),
]


@pytest.mark.parametrize(("args", "code", "needle"), BAD_INPUTS)
def test_bad_input_is_one_line_no_traceback_no_file(tmp_path: Path, args: list[str], code: int,
                                                     needle: str) -> None:
    out = tmp_path / "p.json"
    got, stdout, stderr = _run([*args, "-o", str(out)])
    assert got == code, stderr
    assert needle in stderr
    assert "Traceback" not in stderr and stdout == ""
    assert stderr.startswith("error: ") and len(stderr.strip().splitlines()) <= 2  # cause and hint
    assert list(tmp_path.iterdir()) == []


def test_unwritable_output_path(tmp_path: Path) -> None:
    for target in (tmp_path / "missing" / "p.json", tmp_path):
        code, _, stderr = _run(["profile", "mlp", "--mode", "analytic", "-o", str(target)])
        assert code == 1 and "cannot write" in stderr and "Traceback" not in stderr
    assert list(tmp_path.iterdir()) == []
    if os.geteuid() != 0:  # root can write anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        code, _, stderr = _run(["profile", "mlp", "--mode", "analytic", "-o", str(locked / "p.json")])
        assert code == 1 and list(locked.iterdir()) == []


def test_missing_output_is_a_usage_error() -> None:
    code, _, stderr = _run(["profile", "mlp"])
    assert code == 2 and "-o FILE" in stderr


def test_console_script_runs_as_a_process(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "planner", "profile", "resnet18", "--batch-size", "2",
                           "--mode", "analytic", "-o", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(out.read_text())["layers"]) == 10


CPU_OOM = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
           "allocate {} bytes. Error code 12 (Cannot allocate memory)")


def test_an_input_too_big_for_memory_is_one_error_with_the_sizes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    def no_memory(*args: object, **_kwargs: object) -> torch.Tensor:
        raise RuntimeError(CPU_OOM.format(240000000000))

    monkeypatch.setattr(torch, "randn", no_memory)  # as on a machine with less than 240 GB
    code, stdout, stderr = _run(["profile", "vgg11", "-b", "2", "--input-shape", "3,100000,100000", "--threads", "1",
                                 "-o", str(tmp_path / "p.json")])
    assert code == 1 and stdout == "" and "internal error" not in stderr
    assert "error: out of memory making the input batch (2, 3, 100000, 100000) (2.4e+11 bytes) on cpu" in stderr
    assert "--batch-size" in stderr and "--mode analytic" in stderr and list(tmp_path.iterdir()) == []


def test_a_model_too_big_for_memory_is_one_error_with_the_sizes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    from planner.profiler.zoo import ZOO

    def no_memory(**_kwargs: object) -> nn.Module:
        raise RuntimeError(CPU_OOM.format(4096000000000))

    monkeypatch.setitem(ZOO, "mlp", dataclasses.replace(ZOO["mlp"], factory=no_memory))
    code, stdout, stderr = _run(["profile", "mlp", "-b", "64", "--input-shape", "1000000000", "--threads", "1",
                                 "-o", str(tmp_path / "p.json")])
    assert code == 1 and stdout == "" and "internal error" not in stderr
    assert "error: out of memory building mlp for input shape (1000000000,) on cpu (torch asked for 4.1e+12 bytes)" \
        in stderr
    assert "--mode analytic" in stderr and list(tmp_path.iterdir()) == []

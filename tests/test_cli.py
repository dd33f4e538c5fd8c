"""cli: the shell around the library: help, exit codes, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from planner.cli import main
from tests.conftest import make_cluster_dict, make_profile_dict


def test_help_lists_every_command() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    for name in ("profile", "clusters", "search", "simulate", "compare", "export", "run", "calibrate"):
        assert name in result.output


def test_unknown_command_is_usage_error() -> None:
    result = CliRunner().invoke(main, ["frobnicate"])
    assert result.exit_code == 2


def test_python_dash_m_works() -> None:
    out = subprocess.run([sys.executable, "-m", "planner", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and "planner" in out.stdout


def broken_falcon() -> object:
    """A Falcon whose config transformers builds but cannot run (the new decoder architecture without its parallel
    attention: its forward reads a norm it did not make)."""
    import transformers

    return transformers.FalconForCausalLM(transformers.FalconConfig(
        vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, new_decoder_architecture=True,
        parallel_attn=False, num_kv_heads=2))


def test_a_failure_in_the_models_own_code_is_said_to_be_the_models(tmp_path: object) -> None:
    """An exception raised in the model's code (transformers' module here) below planner's frames is the model's:
    the message names the file, line and function, not an internal error to report; one raised in planner's own
    code stays an internal error (tests/test_hostile)."""
    from pathlib import Path

    from planner.cli import model_frame

    out = Path(str(tmp_path)) / "p.json"
    result = CliRunner().invoke(main, ["profile", "tests.test_cli:broken_falcon", "--input-shape", "8", "-b", "2",
                                       "-o", str(out)])
    assert result.exit_code == 1 and not out.exists()
    assert "error: the model's own code failed: AttributeError" in result.output
    assert "modeling_falcon.py" in result.output and "internal error" not in result.output
    try:
        sorted([1, "a"])  # the standard library's own frame, called from here: no planner frame above it
    except TypeError as exc:
        assert model_frame(exc) is None


def test_a_closed_stderr_does_not_stop_a_command_writing_its_files(tmp_path: object) -> None:
    """A reader of the human output that goes away (``planner profile ... 2>&1 | head -1``) silences it; the command
    still writes its file and its ``--json`` and exits 0 (rich's console exited 1 there, before the file was
    committed)."""
    import json
    import os
    from pathlib import Path

    out = Path(str(tmp_path)) / "p.json"
    read, write = os.pipe()
    os.close(read)  # every write to stderr fails with a broken pipe
    try:
        done = subprocess.run([sys.executable, "-m", "planner", "profile", "gpt2", "--mode", "analytic", "-b", "2",
                               "-o", str(out), "--json"], stdout=subprocess.PIPE, stderr=write, text=True,
                              timeout=300)
    finally:
        os.close(write)
    assert done.returncode == 0
    assert json.loads(out.read_text())["kind"] == json.loads(done.stdout)["kind"] == "profile"


def _closed(tmp: object, args: list[str], stream: str) -> subprocess.CompletedProcess[str]:
    """``planner ARGS`` in the folder ``tmp`` with its ``stream`` (stdout or stderr) on a pipe whose reader has gone:
    every write to it fails with a broken pipe."""
    read, write = os.pipe()
    os.close(read)
    pipes = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, stream: write}
    try:
        return subprocess.run([sys.executable, "-m", "planner", *args], cwd=str(tmp), text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}, **pipes)
    finally:
        os.close(write)


@pytest.mark.parametrize("stream", ["stderr", "stdout"])
def test_a_reader_that_goes_away_does_not_stop_search_or_export(tmp_path: Path, stream: str) -> None:
    """A reader that goes away (``planner search ... 2>&1 | head -1``, ``planner search --json ... | head -c 9``)
    silences what it would have read; the command writes its files and exits as it would have: search's ``note:`` on
    a rescaled profile (written with click, not the rich console) and its ``--json`` document came before the plan
    was committed (exit 1, no plan), export's ``wrote`` line after its files (exit 1, the files left); a plan that
    does not fit still exits 3."""
    (tmp_path / "p.json").write_text(json.dumps(make_profile_dict(device_flops=2e12)))
    (tmp_path / "c.json").write_text(json.dumps(make_cluster_dict()))
    search = ["search", "p.json", "--cluster", "c.json", "-o", "plan.json", "--json"]
    assert _closed(tmp_path, search, stream).returncode == 0
    assert json.loads((tmp_path / "plan.json").read_text())["kind"] == "plan"
    export = ["export", "plan.json", "--to", "torch", "-o", "out", "--json"]
    assert _closed(tmp_path, export, stream).returncode == 0
    assert (tmp_path / "out" / "train.py").is_file()
    (tmp_path / "small.json").write_text(json.dumps(make_cluster_dict(memory_bytes=10**5)))
    infeasible = ["search", "p.json", "--cluster", "small.json", "-o", "none.json"]
    assert _closed(tmp_path, infeasible, stream).returncode == 3 and not (tmp_path / "none.json").exists()


@pytest.mark.parametrize(("args", "code"), [(["search", "--bogus"], 2), (["--bogus"], 2), (["bogus"], 2),
                                            (["--help"], 0), (["--version"], 0), (["search", "--help"], 0)])
@pytest.mark.parametrize("stream", ["stderr", "stdout"])
def test_a_reader_that_goes_away_keeps_usage_and_help_exit_codes(tmp_path: Path, args: list[str], code: int,
                                                                  stream: str) -> None:
    """Click prints a usage error, ``--help`` and ``--version`` outside the command's run: with their reader gone
    they still exit 2 (bad usage) and 0; a usage error exited 1 and ``planner --help | head -1`` exited 1."""
    assert _closed(tmp_path, args, stream).returncode == code

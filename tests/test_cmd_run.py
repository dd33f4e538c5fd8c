"""planner run: the CLI over runner.run_plan (JSON contract, exit codes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from planner.cli import main
from tests.test_runner import tiny_plan

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _cwd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def _write(tmp_path: Path, **kw: object) -> str:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(tiny_plan("tiny_mlp", [0, 2, -1], **kw).to_dict()))  # type: ignore[arg-type]
    return str(path)


@pytest.mark.slow
def test_run_json_contract(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["run", _write(tmp_path), "--model", "tests.test_runner:tiny_mlp", "--engine",
                                    "torch", "--steps", "3", "--warmup", "1", "--check", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    for key in ("engine", "world_size", "measured_iteration_s", "predicted_iteration_s", "losses",
                "reference_losses", "max_rel_loss_diff"):
        assert key in doc
    assert doc["world_size"] == 2 and len(doc["losses"]) == 3 and doc["max_rel_loss_diff"] < 1e-5


def test_model_mismatch_exits_1_with_cause(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["run", _write(tmp_path), "--model", "tests.test_runner:tiny_mlp_wide",
                                    "--engine", "torch", "--steps", "2"])
    assert res.exit_code == 1
    assert "parameters" in res.stderr and "Traceback" not in res.stderr


def test_unknown_model_exits_1(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["run", _write(tmp_path), "--model", "nosuchmodel", "--engine", "torch"])
    assert res.exit_code == 1 and "unknown model" in res.stderr

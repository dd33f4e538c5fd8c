"""scripts/gpu_replay.py: the saved H200 runs (docs/gpu) predicted again by the cost model as it is, on the CPU."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import gpu_replay as gr


def test_every_saved_run_is_found() -> None:
    found = gr.runs_in(gr.DEFAULT)
    assert {(folder.name, key) for folder, key in found} >= {("b8", "gpt"), ("b8", "llama"), ("tiny", "tiny")}


def test_a_replayed_run_keeps_the_measurement_and_predicts_it_again(tmp_path: Path) -> None:
    shutil.copytree(gr.DEFAULT / "b8", tmp_path / "b8")
    run = json.loads((tmp_path / "b8" / "llama-run.json").read_text())
    got = gr.replay(tmp_path / "b8", "llama")
    assert got["measured_s"] == run["measured_iteration_s"]
    assert got["peak_bytes"] == run["ranks"][0]["peak_memory_bytes"]
    assert got["predicted_s"] > 0 and got["analytic_s"] > 0 and got["loss"] is not None
    # the H200's Llama: a prediction within 25% of the run, its memory within 10% (docs/fidelity.md)
    assert 0.75 < got["measured_s"] / got["predicted_s"] < 1.25
    assert 0.9 < got["peak_bytes"] / got["predicted_peak_bytes"] < 1.1
    ratio = got["measured_s"] / got["predicted_s"]
    text = gr.report([got])
    assert f"| {ratio:.3f} |" in text and f"{int(0.9 <= ratio <= 1.1)} of 1" in text


def test_an_empty_folder_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert gr.main([str(tmp_path)]) == 2
    assert "no saved runs" in capsys.readouterr().err

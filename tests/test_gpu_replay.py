"""scripts/gpu_replay.py: the saved H200 runs (docs/gpu) predicted again by the cost model as it is, on the CPU."""

from __future__ import annotations

import json
import os
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


@pytest.mark.slow
def test_several_sizes_in_one_run_are_saved_and_replayed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """``gpu_checks.py --sizes`` (here on the CPU) saves each size in its own folder; gpu_replay reads them all."""
    import gpu_checks as gc

    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))  # main() extends it for the workers
    assert gc.main(["--device", "cpu", "--models", "tiny", "--dtype", "float32", "--sizes", "2x16,4x8", "--steps",
                    "3", "--save", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["2x16", "4x8"]
    capsys.readouterr()
    assert gr.main([str(tmp_path)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 2x16") or
            line.startswith("| 4x8")]
    assert [r.split("|")[3].strip() for r in rows] == ["2 x 16", "4 x 8"]


def test_a_size_that_is_not_batch_x_seq_is_refused() -> None:
    import gpu_checks as gc

    with pytest.raises(SystemExit, match="is not BATCHxSEQ"):
        gc.main(["--device", "cpu", "--models", "tiny", "--sizes", "8by1024"])

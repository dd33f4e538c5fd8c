"""scripts/gpu_checks.py, run on the CPU: the flow the CUDA checks take (profiles, plan, run, report) works end to
end; its figures mean something only on a GPU."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import gpu_checks as gc

from planner import gpus


def test_one_gpu_cluster_is_the_catalogued_gpu() -> None:
    cluster = gc.one_gpu("a100")
    (gpu,) = cluster.gpus
    spec = gpus.gpu_spec("a100")
    assert gpu.memory_bytes == spec.memory_bytes and gpu.flops_for("bf16") == 312e12


@pytest.mark.slow
def test_the_checks_run_end_to_end_on_the_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))  # main() extends it for the workers
    out = tmp_path / "report.md"
    assert gc.main(["--device", "cpu", "--models", "tiny", "--dtype", "float32", "--batch", "4", "--seq", "16",
                    "--steps", "3", "--out", str(out)]) == 0
    (row,) = [line for line in out.read_text().splitlines() if line.startswith("| tiny |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "4"  # the layers of llama-tiny
    predicted, measured, ratio = float(cells[5]), float(cells[7]), float(cells[8])
    assert predicted > 0 and measured > 0 and ratio == pytest.approx(measured / predicted, rel=1e-2)

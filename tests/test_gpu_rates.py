"""scripts/gpu_rates.py: its GPT-2 parameter shapes are GPT-2 small's, and without a GPU it says so."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import gpu_rates

from planner.profiler import load_model


def test_the_adam_shapes_are_gpt2_smalls_parameters() -> None:
    shapes = gpu_rates.gpt2_shapes()
    model = load_model("gpt2", 1, (8,), device="meta").module
    params = list({id(p): p for p in model.parameters()}.values())  # the head's weight is the embedding's
    assert len(shapes) == len(params) == 148
    assert sum(torch.Size(s).numel() for s in shapes) == sum(p.numel() for p in params) == 124_439_808


def test_without_a_gpu_it_measures_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert gpu_rates.main([]) == 2
    assert "no CUDA device" in capsys.readouterr().err

"""planner profile's table: a layer's input and output shapes (not a block's inner widths), plurals."""

from __future__ import annotations

import pytest
from rich.console import Console

from planner import ir
from planner.render.profile import io_shapes, summary_table
from tests.conftest import make_profile_dict


def _gpt2_like() -> ir.ModelProfile:
    doc = make_profile_dict(3, batch_size=8, input_shape=[128])
    shapes = ([8, 128, 768], [8, 128, 768], [8, 128, 50257])
    inner = ((50257, 768), (768, 3072), (768, 50257))  # a block's weight widths: what the column must not show
    for layer, shape, (fin, fout) in zip(doc["layers"], shapes, inner, strict=True):
        layer.update(output_shape=shape, in_features=fin, out_features=fout)
    return ir.ModelProfile.from_dict(doc)


def test_in_out_is_the_previous_output_and_this_output_without_batch() -> None:
    p = _gpt2_like()
    assert io_shapes(p, 0) == "128→128x768"
    assert io_shapes(p, 1) == "128x768→128x768"
    assert io_shapes(p, 2) == "128x768→128x50257"


def test_without_shapes_the_features_are_shown() -> None:
    doc = make_profile_dict(2)
    doc["layers"][0].update(in_features=10, out_features=20)
    p = ir.ModelProfile.from_dict(doc)
    assert io_shapes(p, 0) == "10→20" and io_shapes(p, 1) == ""


def test_title_shows_the_input_shape_and_a_singular_layer() -> None:
    console = Console(record=True, width=200)
    console.print(summary_table(ir.ModelProfile.from_dict(make_profile_dict(1, input_shape=[128]))))
    out = console.export_text()
    assert "toy: 1 layer, batch 8 of 128," in out


def test_progress_bar_is_not_drawn_under_json(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/contracts.md: progress shows on a terminal when --json is not given; profile drew its bar anyway."""
    from planner.render import profile as render

    console = Console(record=True, force_terminal=True, width=120)
    monkeypatch.setattr(render, "stderr_console", lambda: console)
    for show in (False, True):
        with render.progress_bar("counting toy", show=show) as update:
            update(1, 2, "layer 1")
        assert ("counting toy" in console.export_text()) is show

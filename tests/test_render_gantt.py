"""The simulation picture (planner.render.gantt): complete legend, labels that never overlap, capacity
lines per GPU, the per-stage breakdown; PNGs written atomically."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pytest

from planner import ir
from planner.errors import PlannerError
from planner.explain import explain
from planner.render.gantt import figure, plot_simulation
from planner.search import search
from planner.simulate import simulate, simulate_costs
from tests.conftest import make_cluster_dict, make_profile_dict
from tests.test_simulate import cost, uniform


def _texts(fig: Any, ax_index: int = 0) -> list[Any]:
    return list(fig.axes[ax_index].texts)


def _legend(ax: Any) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def _overlaps(fig: Any, texts: list[Any]) -> int:
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in texts]
    return sum(a.overlaps(b) for a, b in itertools.combinations(boxes, 2))


def test_legend_names_every_kind_of_bar_and_the_row_labels() -> None:
    link = ir.Link(1e6, 1e-3)
    r = simulate_costs([cost(("g0", "g1"), 1.0, 2.0, 0.5, link=link, nbytes=1e5, ar=0.5),
                        cost("g2", 1.0, 2.0, 0.5)], "zb-h1", 4)
    fig = figure(r)
    try:
        legend = " | ".join(_legend(fig.axes[0]))
        for entry in ("stage 0", "stage 1", "forward", "backward", "weight gradient", "all-reduce", "optimizer step",
                      "transfer: activations", "transfer: gradients", "'g +n'"):
            assert entry in legend, entry
    finally:
        plt.close(fig)


@pytest.mark.parametrize(("k", "m"), [(2, 1), (4, 16), (8, 64)])
def test_micro_batch_labels_never_overlap(k: int, m: int) -> None:
    fig = figure(simulate_costs(uniform(k), "1f1b", m))
    try:
        texts = _texts(fig)
        assert _overlaps(fig, texts) == 0
        if m <= 16:
            assert texts, "sparse enough to label"
    finally:
        plt.close(fig)


def test_too_dense_to_label_draws_no_numbers() -> None:
    fig = figure(simulate_costs(uniform(16), "1f1b", 256))
    try:
        assert _texts(fig) == []
    finally:
        plt.close(fig)


def test_capacity_line_per_gpu_kind_in_scale_and_named_when_above() -> None:
    gib = 2**30
    r = simulate_costs([cost("a", static=gib, act=gib // 4, capacity=2 * gib),
                        cost("b", static=gib, act=gib // 4, capacity=3 * gib // 2),
                        cost("c", static=gib // 8, capacity=80 * gib)], "1f1b", 4)
    fig = figure(r)
    try:
        legend = _legend(fig.axes[1])
        assert any("capacity 2.0 GiB (a)" in x for x in legend) and any("capacity 1.5 GiB (b)" in x for x in legend)
        assert "80.0 GiB (c)" in fig.axes[1].get_title(loc="left")
    finally:
        plt.close(fig)


def test_breakdown_panel_from_the_explanation() -> None:
    profile = ir.ModelProfile.from_dict(make_profile_dict(4, batch_size=8))
    plan = search(profile, ir.Cluster.from_dict(make_cluster_dict(2, 2)), config=(2, 1), microbatches=4)
    result = simulate(plan)
    fig = figure(result, explanation=explain(plan, result=result))
    try:
        assert len(fig.axes) == 3
        assert "bottleneck" in fig.axes[2].get_title(loc="left")
        assert {"compute", "all-reduce", "optimizer step", "idle (bubble)"} <= set(_legend(fig.axes[2]))
        assert fig.axes[2].get_yticklabels()[0].get_text().startswith("0: n0.g0")
    finally:
        plt.close(fig)


def test_an_engines_overheads_have_their_bar_and_their_word_in_the_legend() -> None:
    import dataclasses

    profile = ir.ModelProfile.from_dict(make_profile_dict(4, batch_size=8))
    bare = ir.Cluster.from_dict(make_cluster_dict(2, 2))
    cluster = dataclasses.replace(bare, engine_overheads=(("torch", ir.EngineOverhead(1e-3, 1e-3, 5e-3)),))
    plan = search(profile, cluster, config=(2, 2), microbatches=2, engine="torch")
    result = simulate(plan)
    fig = figure(result, explanation=explain(plan, result=result))
    try:
        assert "engine" in _legend(fig.axes[2])
        assert "optimizer step\n+ the engine's per-step cost" in _legend(fig.axes[0])
    finally:
        plt.close(fig)
    plain = search(profile, bare, config=(2, 1), microbatches=4)
    result = simulate(plain)
    fig = figure(result, explanation=explain(plain, result=result))
    try:
        assert "engine" not in _legend(fig.axes[2]) and "optimizer step" in _legend(fig.axes[0])
    finally:
        plt.close(fig)


def test_plot_writes_a_png_atomically(tmp_path: Path) -> None:
    link = ir.Link(1e6, 1e-3)
    r = simulate_costs([cost(f"g{s}", 1.0, 2.0, 0.5, link=link, nbytes=1e5, static=2**30, act=2**28,
                             capacity=2**32) for s in range(3)], "zb-h1", 4)
    out = tmp_path / "gantt.png"
    plot_simulation(r, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["gantt.png"]


def test_plot_of_pipedream_and_interleaved(tmp_path: Path) -> None:
    plot_simulation(simulate_costs(uniform(3), "pipedream", 2), tmp_path / "pd.png")
    plot_simulation(simulate_costs(uniform(2, v=2), "interleaved", 4, 2), tmp_path / "il.png", title="t")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["il.png", "pd.png"]


def test_plot_into_missing_folder_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(PlannerError, match="does not exist"):
        plot_simulation(simulate_costs(uniform(2), "gpipe", 2), tmp_path / "nope" / "x.png")
    assert list(tmp_path.iterdir()) == []

"""Terminal and picture output of the simulator: text Gantt, summary table, PNG."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from planner import ir
from planner.errors import PlannerError
from planner.render.simulate import gantt_plain, gantt_rows, gantt_text, lane_label, plot_simulation, summary_table
from planner.simulate import simulate_costs
from tests.test_simulate import cost, uniform


def test_text_gantt_of_gpipe_shows_microbatches_and_bubbles() -> None:
    # K=2, M=2, tf=1, tb=2: 9 time units; 18 columns = 2 per unit.
    r = simulate_costs(uniform(2), "gpipe", 2)
    text = gantt_plain(r, 18)
    rows = [line.split("│")[1] for line in text.splitlines()]
    assert rows[0] == "0>1>······0<<<1<<<"  # forward '>', backward '<', each led by its micro-batch
    assert rows[1] == "··0>1>0<<<1<<<····"


def test_text_gantt_rows_mark_ops_and_links() -> None:
    link = ir.Link(1e6, 0.0)
    r = simulate_costs([cost("a", 1.0, 1.0, link=link, nbytes=5e5, link_id="L", ar=1.0), cost("b", 1.0, 1.0)],
                       "1f1b", 2)
    rows = gantt_rows(r, 40)
    labels = [label for label, _ in rows]
    assert labels == ["a", "b", "L fwd", "L bwd"]
    ops = {op for _, cells in rows for _, op in cells}
    assert {"F", "B", "AR", "act", "grad", ""} <= ops
    assert any(char == "#" for char, _ in rows[0][1])
    assert any(char == "=" for char, _ in rows[2][1])


def test_text_gantt_renders_with_styles_and_summary() -> None:
    r = simulate_costs([cost(("a", "b"), static=2**30, act=2**20, capacity=2**31), cost("c", act=100, capacity=10)],
                       "1f1b", 4)
    console = Console(record=True, width=200, color_system="truecolor")
    console.print(gantt_text(r, 60))
    console.print(summary_table(r, batch_size=32))
    out = console.export_text()
    assert "a +1" in out and "micro-batch" in out and "and n more doing the same work" in out
    for legend in ("> forward", "< backward", "w weight grad", "# all-reduce", "o optimizer step", "= transfer"):
        assert legend in out
    assert "iteration 18.000 ms" not in out and "iteration 15000.000 ms" in out
    assert "samples/s" in out and "NO" in out  # device c does not fit its 10-byte capacity
    assert lane_label(("x",)) == "x" and lane_label(("x", "y", "z")) == "x +2"


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


def test_big_run_plots_without_labels(tmp_path: Path) -> None:
    r = simulate_costs(uniform(16), "1f1b", 64)
    plot_simulation(r, tmp_path / "big.png")
    assert (tmp_path / "big.png").stat().st_size > 1000

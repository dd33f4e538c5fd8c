"""Terminal and picture output of the simulator: text Gantt, summary table, PNG."""

from __future__ import annotations

from rich.console import Console

from planner import ir
from planner.render.simulate import gantt_plain, gantt_rows, gantt_text, lane_label, summary_table
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

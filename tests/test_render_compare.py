"""planner compare's chart: speedup with configs, absolute time, memory against each GPU's capacity."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pytest

from planner import ir
from planner.compare import Comparison, compare
from planner.render.compare import comparison_figure, plot_comparison
from tests.conftest import make_cluster_dict, make_profile_dict


def _comparison(memory_bytes: int) -> Comparison:
    profile = ir.ModelProfile.from_dict(make_profile_dict(6, batch_size=8))
    cluster = ir.Cluster.from_dict(make_cluster_dict(2, 2, memory_bytes=memory_bytes))
    return compare(profile, cluster, strategies=["dp", "gpipe-uniform", "planner"], rerank=2)


def _texts(fig: Any, panel: int) -> list[str]:
    return [t.get_text() for t in fig.axes[panel].texts]


@pytest.fixture(scope="module")
def roomy() -> Comparison:
    return _comparison(10**10)


def test_three_panels_with_speedup_config_time_and_memory(roomy: Comparison) -> None:
    fig = comparison_figure(roomy)
    try:
        titles = [ax.get_title(loc="left") for ax in fig.axes]
        assert titles[0].startswith("speedup over dp") and titles[1] == "iteration time (ms)"
        assert "GPU capacity" in titles[2]
        planner = roomy.get("planner")
        assert planner.config and any(f"({planner.config}, M={planner.microbatches})" in t for t in _texts(fig, 0))
        assert f"{planner.iteration_s * 1e3:.1f}" in _texts(fig, 1)
        assert len(fig.axes[2].lines) == len(roomy.strategies)  # one capacity mark per strategy
        assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == [s.name for s in roomy.strategies]
    finally:
        plt.close(fig)


def test_without_dp_the_first_panel_shows_samples_per_second() -> None:
    tight = _comparison(7_000_000)  # 6 MB of weights and gradients: pure dp does not fit, pipelines do
    assert not tight.get("dp").fits and tight.get("planner").fits
    fig = comparison_figure(tight)
    try:
        assert fig.axes[0].get_title(loc="left").startswith("samples/s (dp does not fit)")
        assert "does not fit" in _texts(fig, 0)[0] and "does not fit" not in _texts(fig, 0)[-1]
    finally:
        plt.close(fig)


def test_plot_writes_a_png(roomy: Comparison, tmp_path: Path) -> None:
    plot_comparison(roomy, tmp_path / "c.png")
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


def test_the_table_names_a_rows_own_options_after_its_setting() -> None:
    """A Megatron row whose layout has uneven end stages shows the options that give it beside its setting."""
    import dataclasses

    from rich.console import Console

    from planner.compare import StrategyResult
    from planner.render.compare import comparison_table

    row = StrategyResult("megatron", True, 0.5, 16.0, "4-4", "1f1b", 8, 10**9, None, None,
                         setting="tp=1 in a server, pp, dp the rest",
                         flags="--decoder-first-pipeline-num-layers 4 --decoder-last-pipeline-num-layers 2")
    plain = dataclasses.replace(row, name="pipedream", setting="activations not counted (default)", flags="")
    console = Console(record=True, width=400)
    console.print(comparison_table(Comparison("m", 8, "c", "sgd", (row, plain))))
    out = console.export_text()
    assert ("tp=1 in a server, pp, dp the rest (--decoder-first-pipeline-num-layers 4 "
            "--decoder-last-pipeline-num-layers 2)") in out
    assert "activations not counted (default) " in out and "()" not in out


def test_the_printed_comparison_names_rows_whose_plan_no_engine_runs(
        roomy: Comparison, capsys: pytest.CaptureFixture[str]) -> None:
    """A row that fits but whose plan no engine here runs (a schedule only the simulator plays) gets a line saying so,
    with what the engines refuse; the rows the engines run get none."""
    import dataclasses

    from planner.render.compare import print_comparison

    row = roomy.get("planner")
    assert row.plan is not None and row.engines
    unrun = dataclasses.replace(row, name="odd", plan=dataclasses.replace(row.plan, schedule="pipedream"))
    assert unrun.engines == []
    print_comparison(dataclasses.replace(roomy, strategies=(row, unrun)))
    err = " ".join(capsys.readouterr().err.split())
    assert "no engine runs odd's plan: deepspeed: deepspeed runs the schedules 1f1b, not 'pipedream'; torch:" in err
    assert "planner's plan" not in err

"""The plan table of ``planner search``: per stage layers, devices, forms and costs; what its times mean; the
plan against plain data parallel, named exactly."""

from __future__ import annotations

import dataclasses

import pytest
from rich.console import Console

from planner import ir
from planner.explain import explain
from planner.render.search import _forms, dp_line, plan_table, print_plan
from tests.conftest import make_cluster_dict
from tests.test_validate import make_plan


def _text(table: object) -> str:
    console = Console(record=True, width=240)
    console.print(table)
    return console.export_text()


def test_forms_are_summarised_as_runs() -> None:
    assert _forms(["dp", "dp", "split_out", "split_in", "split_in", "dp"]) == "dp x2, split_out, split_in x2, dp"


def test_a_gpu_cluster_has_no_caption_and_shared_cores_say_what_the_times_mean() -> None:
    plan = make_plan()
    assert plan_table(plan, 0).caption is None
    nodes = tuple(dataclasses.replace(n, concurrent_devices=1.0, sharing_efficiency=0.8) for n in plan.cluster.nodes)
    shared = dataclasses.replace(plan, cluster=dataclasses.replace(plan.cluster, nodes=nodes))
    out = _text(plan_table(shared, 0))
    assert "fwd+bwd / mb: with all 2 processes of n0 computing at once; one computing alone runs up to 2.50x" in out


def _on(nodes: int, gpus: int, microbatches: int, recompute: str = "none", zero: int = 0,
        dp_s: float | None = None) -> ir.Plan:
    """One data-parallel stage of the 4-layer toy (batch 8) on every GPU of a ``nodes x gpus`` cluster."""
    cluster = ir.Cluster.from_dict(make_cluster_dict(nodes, gpus))
    plan = make_plan(microbatches=microbatches, stages=[((0, 4), tuple(g.name for g in cluster.gpus))])
    stage = dataclasses.replace(plan.stages[0], recompute=recompute, zero=zero)
    return dataclasses.replace(plan, cluster=cluster, stages=(stage,), dp_iteration_s=dp_s,
                               speedup_over_dp=None if dp_s is None else 2.0)


def _printed(plan: ir.Plan, capsys: pytest.CaptureFixture[str]) -> str:
    print_plan(plan, explain(plan))
    return " ".join(capsys.readouterr().err.split())


def test_a_data_parallel_plan_is_told_what_lets_it_fit_where_plain_data_parallel_does_not(
        capsys: pytest.CaptureFixture[str]) -> None:
    out = _printed(_on(2, 2, 2, recompute="full", zero=1), capsys)
    assert ("plain data parallel on all 4 GPUs (ZeRO-0, no recomputation, each GPU's 2 samples in one micro-batch) "
            "does not fit in memory; this plan is data parallel too and fits with ZeRO-1, full recomputation and "
            "2 micro-batches of 1 sample per GPU") in out
    assert "pure data parallel" not in out


def test_the_speedup_names_its_baseline_and_a_pipeline_gets_no_fitting_note() -> None:
    assert dp_line(_on(2, 2, 1, dp_s=2.0)) == ("plain data parallel on all 4 GPUs (ZeRO-0, no recomputation, each "
                                               "GPU's 2 samples in one micro-batch): 2000.00 ms -> speedup "
                                               "[bold]2.00x[/]")
    assert dp_line(make_plan()).endswith("in one micro-batch) does not fit in memory")  # two stages


def test_one_gpu_is_not_called_data_parallel(capsys: pytest.CaptureFixture[str]) -> None:
    out = _printed(_on(1, 1, 4), capsys)
    assert ("the whole batch of 8 in one micro-batch on the one GPU (no recomputation) does not fit in memory; this "
            "plan fits with 4 micro-batches of 2 samples per GPU") in out
    assert "data parallel" not in out


def test_a_batch_that_does_not_split_over_the_gpus_is_no_memory_matter() -> None:
    plan = _on(1, 3, 1)
    assert dp_line(plan) == ("plain data parallel on all 3 GPUs does not run: the batch of 8 does not split into "
                             "whole samples per GPU")

"""The plan table of ``planner search``: per stage layers, devices, forms and costs; what its times mean."""

from __future__ import annotations

import dataclasses

from rich.console import Console

from planner.render.search import _forms, plan_table
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

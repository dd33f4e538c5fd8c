"""The explanation's text: the bound, idle GPUs and what using them costs, runner-ups, headroom; tables."""

from __future__ import annotations

import dataclasses

from rich.console import Console

from planner.explain import Alternative, Explanation, StageExplanation
from planner.render import GIB
from planner.render.explain import print_explanation, short_lines

STAGES = (
    StageExplanation(0, ("s0.g0", "s0.g1"), 0.450, 0.0085, 0.047, 0.0013, 0.0, 3 * GIB, 11 * GIB, 8 * GIB),
    StageExplanation(1, ("s1.g0",), 0.002, 0.0085, 0.0, 0.0, 0.496, GIB // 4, 11 * GIB, 10 * GIB),
)
ALL8 = Alternative("6-2", 16, "1f1b", 8, 0.511, 0.026, 0, "transfers", (("transfers", 0.206), ("bubble", 0.188)))
RUNNER = Alternative("2", 1, "1f1b", 2, 0.499, 0.002, 0, "compute")


def _e(**kw: object) -> Explanation:
    base = Explanation(iteration_s=0.498, bubble_fraction=0.5, stages=STAGES, bottleneck=0, bound="compute", gpus=8,
                       idle_devices=("s1.g1", "s2.g0", "s2.g1", "s3.g0", "s3.g1"), all_gpus=ALL8,
                       runner_ups=(RUNNER, ALL8), judged=True, dp_iteration_s=3.877)
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def test_short_form_says_bound_idle_cost_runner_ups_and_headroom() -> None:
    lines = short_lines(_e())
    assert lines[0].startswith("bound by stage 0 (s0.g0, s0.g1): compute 450.00 ms = 90% of the 498.00 ms iteration")
    assert "idle: 5 of 8 GPUs (s1.g1 .. s3.g1)" in lines[1]
    assert ("the best judged plan on all 8 is 6-2 (M=16) 511.00 ms (+2.6%, stage 0: transfers 206.00 ms, "
            "bubble 188.00 ms)") in lines[1]
    assert "plain data parallel on all 8 (ZeRO-0, no recomputation, one micro-batch): 3877.00 ms" in lines[1]
    assert lines[2] == ("runner-ups: 2 (M=1) 499.00 ms (+0.2%, stage 0: compute); "
                        "6-2 (M=16) 511.00 ms (+2.6%, stage 0: transfers)")
    assert lines[3] == "memory headroom: stage 0 8.00 of 11.00 GiB, stage 1 10.00 of 11.00 GiB"


def test_idle_without_a_plan_on_all_gpus_or_without_candidates() -> None:
    assert "no plan on all 8 was simulated" in short_lines(_e(all_gpus=None))[1]
    unjudged = short_lines(_e(all_gpus=None, runner_ups=(), judged=False))
    assert "planner search shows what using them costs" in unjudged[1]
    assert not any(line.startswith("runner-ups") for line in unjudged)
    assert not any(line.startswith("idle") for line in short_lines(_e(idle_devices=(), all_gpus=None)))


def test_cpu_processes_are_not_called_gpus() -> None:
    stages = tuple(dataclasses.replace(s, devices=(f"cpu{s.stage}",)) for s in STAGES)
    line = short_lines(_e(stages=stages, gpus=3, idle_devices=("cpu2",), all_gpus=None))[1]
    assert "idle: 1 of 3 CPU processes (cpu2)" in line


def test_long_form_prints_the_tables() -> None:
    console = Console(record=True, width=200)
    print_explanation(_e(), console, long=True)
    out = console.export_text()
    assert "where the 498.00 ms iteration goes, per stage" in out and "other plans the search judged" in out
    assert "0 *" in out and "450.00 ms (90%)" in out and "stage 0: transfers 206.00 ms, bubble 188.00 ms" in out


def test_the_engine_column_shows_only_when_an_engine_adds_time() -> None:
    def table(e: Explanation) -> str:
        console = Console(record=True, width=240)
        print_explanation(e, console, long=True)
        return console.export_text()

    assert " engine " not in table(_e())
    charged = (dataclasses.replace(STAGES[0], engine_s=0.0249, engine_step_s=0.005), STAGES[1])
    out = table(_e(stages=charged))
    assert " engine " in out and "24.90 ms (5%)" in out

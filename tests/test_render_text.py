"""Units and plurals shared by every command's output."""

from __future__ import annotations

from planner.render.text import count, device_noun, ms, plural


def test_plurals() -> None:
    assert count(1, "micro-batch") == "1 micro-batch" and count(2, "micro-batch") == "2 micro-batches"
    assert count(1, "process") == "1 process" and count(2, "process") == "2 processes"
    assert count(8, "GPU") == "8 GPUs" and plural(0, "stage") == "stages"


def test_milliseconds() -> None:
    assert ms(0.49808) == "498.08 ms" and ms(None) == "-"


def test_calibrated_cpu_clusters_have_processes_not_gpus() -> None:
    assert device_noun(["cpu0", "cpu1"]) == "CPU process" and count(2, device_noun(["cpu0"])) == "2 CPU processes"
    assert device_noun(["s0.g0", "cpu1"]) == "GPU" and device_noun([]) == "GPU"

"""planner.cores: the cores this process may use, and the threads an option may ask for."""

from __future__ import annotations

import os

import pytest

from planner.cores import check_threads, usable_cores
from planner.errors import UsageError


def test_usable_cores_are_this_process_s_affinity() -> None:
    assert usable_cores() == len(os.sched_getaffinity(0)) >= 1


@pytest.mark.parametrize("threads", [0, -3, 10**6])
def test_threads_outside_one_to_the_cores_are_refused_with_the_fix(threads: int,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("planner.cores.usable_cores", lambda: 4)
    with pytest.raises(UsageError, match=f"1 to the 4 cores this process may run on, got {threads}") as err:
        check_threads(threads, "why not")
    assert err.value.hint == f"use --threads {1 if threads < 1 else 4} (why not)"


@pytest.mark.parametrize("threads", [1, 4])
def test_threads_from_one_to_the_cores_pass(threads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("planner.cores.usable_cores", lambda: 4)
    check_threads(threads, "")


def test_the_profilers_library_call_refuses_a_million_threads_before_timing() -> None:
    """torch.set_num_threads(10**6) then a matmul: a segmentation fault, not an error (profile, run and calibrate
    refuse it; the library call too)."""
    from planner.profiler import load_model, profile_model

    loaded = load_model("mlp", 2, None)
    with pytest.raises(UsageError, match="got 1000000"):
        profile_model(loaded, threads=10**6, repeats=1, warmup=0)

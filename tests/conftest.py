"""Shared test fixtures: small hand-made profiles and clusters, written as contract JSON."""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import settings

settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True)  # CI: the same examples every run
settings.register_profile("dev", max_examples=25, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
# The suite's workers share the cores on purpose: calibration and timed rounds must not wait for an idle
# machine (nor retry) -- inherited by the processes the tests start (planner.runner.machine.idle_timeout_s).
os.environ.setdefault("PLANNER_IDLE_TIMEOUT_S", "0")
# MKL's threads fixed, not chosen per call by the machine's load: the bit-for-bit checks of split models compare two
# runs of the same GEMMs (set before any test module imports torch).
os.environ.setdefault("MKL_DYNAMIC", "FALSE")


def make_profile_dict(n_layers: int = 4, batch_size: int = 8, **overrides: Any) -> dict[str, Any]:
    """A contract-only profile: n layers of equal cost, 1 MB of weights each."""
    layers = [
        {"name": f"l{i}", "type": "Linear", "forward_s": 0.01, "backward_s": 0.02,
         "forward_flops": 1e9, "backward_flops": 2e9, "param_count": 250_000,
         "param_bytes": 1_000_000, "output_bytes": 100_000, "saved_bytes": 200_000}
        for i in range(n_layers)
    ]
    doc: dict[str, Any] = {"kind": "profile", "version": 1, "model": "toy", "batch_size": batch_size,
                           "dtype": "float32", "mode": "analytic", "device": "test", "device_flops": 1e12,
                           "layers": layers}
    doc.update(overrides)
    return doc


def make_cluster_dict(nodes: int = 2, gpus_per_node: int = 2, memory_bytes: int = 10**10) -> dict[str, Any]:
    """A homogeneous contract cluster: ``nodes`` servers of ``gpus_per_node`` GPUs."""
    return {
        "kind": "cluster", "version": 1, "name": f"test-{nodes}x{gpus_per_node}",
        "nodes": [{"name": f"n{n}", "gpus": [{"name": f"n{n}.g{g}", "flops": 1e12, "memory_bytes": memory_bytes}
                                              for g in range(gpus_per_node)]} for n in range(nodes)],
        "links": {"intra_node": {"bandwidth_Bps": 1e10, "latency_s": 1e-5},
                  "inter_node": {"bandwidth_Bps": 1e9, "latency_s": 1e-4}},
    }


@pytest.fixture
def profile_dict() -> dict[str, Any]:
    return make_profile_dict()


@pytest.fixture
def cluster_dict() -> dict[str, Any]:
    return make_cluster_dict()


@pytest.fixture(autouse=True, scope="session")
def _torch_factories_cached_unpatched() -> None:
    """torch's device context (``with torch.device("meta")``) caches the set of factory functions it redirects at its
    first use; a test that patches ``torch.randn`` (an out-of-memory input, tests/test_profiler_zoo.py,
    tests/test_cmd_profile.py) and is the first to enter a device context caches the patch, and from then on every
    ``torch.randn`` in a device context makes a CPU tensor: three profiler tests failed so in the worker order of
    some runs. The set is computed here, before any test patches."""
    from torch.utils._device import _device_constructors

    _device_constructors()


def weights_agree(doc: dict[str, Any]) -> bool:
    """A ``planner run --check`` document's trained weights are one process's (planner.runner.fingerprint): every
    parameter compared, none missing, within the fp32 bound."""
    from planner.runner.reference import WEIGHT_RTOL

    diff = doc["max_rel_weight_diff"]
    return bool(doc["weights_compared"] > 0 and not doc["weights_missing"] and diff is not None
                and diff < WEIGHT_RTOL["fp32"])

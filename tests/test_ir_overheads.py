"""ir.overheads: an engine's measured overheads in a cluster file (``engine_overheads``)."""

from __future__ import annotations

from typing import Any

import pytest

from planner import ir
from planner.cluster import cluster_from_dict
from planner.errors import FormatError
from tests.conftest import make_cluster_dict


def test_engine_overheads_round_trip_and_old_files_load_without_them() -> None:
    d = make_cluster_dict()
    assert cluster_from_dict(d).engine_overheads == ()
    assert "engine_overheads" not in cluster_from_dict(d).to_dict()
    d["engine_overheads"] = {"torch": {"per_action_s": 1e-4, "per_step_s": 2e-3},
                             "deepspeed": {"per_action_s": 3e-4, "per_microbatch_s": 1e-4, "per_step_s": 5e-3}}
    c = cluster_from_dict(d)
    assert [name for name, _ in c.engine_overheads] == ["deepspeed", "torch"]
    assert c.engine_overhead("torch") == ir.EngineOverhead(1e-4, 0.0, 2e-3)
    assert c.engine_overhead("torchtitan") is None
    assert cluster_from_dict(c.to_dict()) == c
    from planner.schemas import validate

    validate(c.to_dict(), "cluster", 1, "x")


@pytest.mark.parametrize(("overheads", "word"), [
    ({"jax": {"per_action_s": 1.0}}, "unknown engine 'jax'"),
    ({"torch": {"per_action_s": -1.0}}, "per_action_s"),
    ({"torch": {"per_call_s": 1.0}}, "unknown field 'per_call_s'"),
    ({"torch": 3}, "must be an object"),
    ([1], "engine_overheads must be an object"),
])
def test_bad_engine_overheads_name_the_field(overheads: Any, word: str) -> None:
    d = make_cluster_dict()
    d["engine_overheads"] = overheads
    with pytest.raises(FormatError, match=word):
        ir.Cluster.from_dict(d)

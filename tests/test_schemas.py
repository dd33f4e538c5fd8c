"""schemas: the shipped JSON Schemas are current, accept planner's files, refuse by field path what is out of bounds."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner import schemas
from planner.errors import FormatError
from planner.schemas import build
from tests import hostile

ROOT = Path(__file__).resolve().parent.parent


def test_shipped_files_are_what_build_makes() -> None:
    made = build.schemas()
    assert sorted(made) == sorted(p.name for p in schemas.FOLDER.glob("*.schema.json"))
    for name, doc in made.items():
        assert (schemas.FOLDER / name).read_text(encoding="utf-8") == build.text(doc), f"run python -m {build.__name__}"


def test_planners_own_files_validate() -> None:
    profile, cluster, plan = hostile.base_docs()
    schemas.validate(profile, "profile", 1, "p")
    schemas.validate(cluster, "cluster", 1, "c")
    schemas.validate(plan, "plan", 2, "plan")
    for path in [*ROOT.glob("profiles/*.json"), *ROOT.glob("profiles/clusters/*.json")]:
        doc = json.loads(path.read_text())
        schemas.validate(doc, doc["kind"], doc["version"], str(path))


def _set(doc: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    return hostile.mutate(doc, path, value)


@pytest.mark.parametrize(("path", "value", "message"), [
    (("layers", 1, "param_bytes"), 1e308, "layers[1].param_bytes is 1e+308, above the maximum 1e+15 (bytes)"),
    (("layers", 0, "forward_s"), -0.5, "layers[0].forward_s is -0.5, below the minimum 0 (seconds)"),
    (("device_flops"), 0, "device_flops is 0, below the minimum 1000 (FLOP/s)"),
    (("batch_size",), 10**8, "batch_size is 100000000, above the maximum 1e+07"),
    (("batch_size",), 1.5, "batch_size is 1.5, expected an integer"),
    (("model",), "", "model is '', too short"),
    (("layers", 2, "block"), {"hidden": 8, "heads": 2, "kv_heads": 2, "ffn": 8, "seq_len": 4, "wide": 1},
     "layers[2].block.wide is not a known field"),
    (("layers", 2, "output_shape"), [3, 0], "layers[2].output_shape[1] is 0, below the minimum 1"),
    (("meta",), {"overrides": 5}, "meta.overrides is 5, expected an object or null"),  # export and run build with it
    (("meta",), {"overrides": {"n_layer": [2]}}, "meta.overrides.n_layer is a list of 1 items, expected a string"),
])
def test_profile_errors_name_the_field_and_value(path: Any, value: Any, message: str) -> None:
    profile, _, _ = hostile.base_docs()
    with pytest.raises(FormatError) as err:
        schemas.validate(_set(profile, path if isinstance(path, tuple) else (path,), value), "profile", 1, "p.json")
    assert err.value.cause.startswith(f"p.json: {message}")
    assert "planner/schemas/profile.v1.schema.json" in err.value.hint


def test_missing_unknown_and_closed() -> None:
    _, cluster, plan = hostile.base_docs()
    doc = copy.deepcopy(cluster)
    del doc["nodes"][0]["gpus"][1]["memory_bytes"]
    with pytest.raises(FormatError, match=r"c: nodes\[0\]\.gpus\[1\]: missing field 'memory_bytes'"):
        schemas.validate(doc, "cluster", 1, "c")
    with pytest.raises(FormatError, match="unknown schedule 'zigzag', expected one of \"gpipe\""):
        schemas.validate(_set(plan, ("schedule",), "zigzag"), "plan", 2, "plan")
    with pytest.raises(FormatError, match=r"unknown stages\[0\]\.zero 5"):
        schemas.validate(_set(plan, ("stages", 0, "zero"), 5), "plan", 2, "plan")
    with pytest.raises(FormatError, match=r"peak_flops\.fp8 is not a known field"):
        schemas.validate(_set(cluster, ("nodes", 0, "gpus", 0, "peak_flops"), {"fp8": 1e15}), "cluster", 1, "c")


def test_version_1_plans_take_a_boolean_recompute_and_version_2_does_not() -> None:
    _, _, plan = hostile.base_docs()
    old = _set(_set(plan, ("version",), 1), ("stages", 0, "recompute"), True)
    schemas.validate(old, "plan", 1, "plan")
    with pytest.raises(FormatError, match=r"unknown stages\[0\]\.recompute true"):
        schemas.validate(_set(plan, ("stages", 0, "recompute"), True), "plan", 2, "plan")


def test_true_is_not_a_number_or_an_enum_member() -> None:
    _, _, plan = hostile.base_docs()
    with pytest.raises(FormatError, match="expected an integer"):
        schemas.validate(_set(plan, ("microbatches",), True), "plan", 2, "plan")
    with pytest.raises(FormatError, match="unknown stages"):
        schemas.validate(_set(plan, ("stages", 0, "zero"), False), "plan", 2, "plan")


BOUNDED = [(("device_flops",), build.MAX_FLOPS), (("layers", 0, "saved_bytes"), build.MAX_BYTES),
           (("layers", 1, "backward_s"), build.MAX_TIME_S), (("batch_size",), build.MAX_BATCH),
           (("layers", 3, "forward_flops"), build.MAX_FLOP_COUNT)]


@given(which=st.sampled_from(BOUNDED), scale=st.floats(0.0, 2.0))
def test_a_value_is_refused_exactly_when_above_its_bound(which: tuple[tuple[str | int, ...], int],
                                                         scale: float) -> None:
    path, bound = which
    profile, _, _ = hostile.base_docs()
    value: float = round(bound * scale)
    value = max(value, build.MIN_RATE)  # every bounded field accepts the least device rate
    try:
        schemas.validate(_set(profile, path, value), "profile", 1, "p")
        refused = False
    except FormatError as exc:
        refused = True
        assert str(path[-1]) in exc.cause and "above the maximum" in exc.cause
    assert refused == (value > bound)


@pytest.mark.parametrize("path", [("nodes", 0, "gpus", 0, "flops"), ("links", "inter_node", "bandwidth_Bps"),
                                  ("links", "intra_node", "allgather_bandwidth_Bps"),
                                  ("nodes", 0, "gpus", 0, "memory_bandwidth_Bps")])
def test_a_rate_below_any_real_machines_is_refused(path: tuple[str | int, ...]) -> None:
    """1e-300 bytes/s would make an iteration of 1e300 s: a device's FLOP/s and a link's or memory's bytes/s are
    at least build.MIN_RATE; a link's latency at most build.MAX_LATENCY_S."""
    _, cluster, _ = hostile.base_docs()
    schemas.validate(_set(cluster, path, build.MIN_RATE), "cluster", 1, "c")
    with pytest.raises(FormatError, match="below the minimum 1000"):
        schemas.validate(_set(cluster, path, 1e-300), "cluster", 1, "c")
    with pytest.raises(FormatError, match="above the maximum 60"):
        schemas.validate(_set(cluster, ("links", "intra_node", "latency_s"), 1e6), "cluster", 1, "c")


def test_agrees_with_the_jsonschema_library() -> None:
    jsonschema = pytest.importorskip("jsonschema")  # not a dependency: where it is installed, it is the oracle
    for kind, versions in schemas.KINDS.items():
        for version in versions:
            jsonschema.Draft202012Validator.check_schema(schemas.load(kind, version))
    checked = 0
    for case in hostile.all_cases():
        for _, data in case.files:
            try:
                doc = json.loads(data, parse_constant=lambda name: None)
                kind, version = doc["kind"], doc["version"]
                schema = schemas.load(kind, version) if version in schemas.KINDS[kind] else {}
            except (ValueError, TypeError, KeyError, RecursionError):
                continue
            if not schema or isinstance(version, bool):
                continue
            ours = True
            try:
                schemas.validate(doc, kind, version, "x")
            except FormatError:
                ours = False
            assert ours == jsonschema.Draft202012Validator(schema).is_valid(doc), case.id
            checked += 1
    assert checked > 100


def test_closed_objects_list_every_field_the_ir_writes() -> None:
    from planner import ir

    block = schemas.load("profile", 1)["$defs"]["block"]
    assert set(block["properties"]) == set(ir.BlockShape(8, 2, 2, 32, 16, head_dim=8, shardable=False).to_dict())
    gpu = schemas.load("cluster", 1)["$defs"]["gpu"]
    assert set(gpu["properties"]["peak_flops"]["properties"]) == set(ir.NUMBER_FORMATS)

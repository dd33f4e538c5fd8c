"""The JSON Schemas of planner's files, built from the IR's own enums: the source of the shipped ``*.schema.json``.

``python -m planner.schemas.build`` rewrites the shipped files; ``tests/test_schemas.py`` checks that
they equal what this module builds, so the schemas never drift from the code. Every number has a
bound a real model or cluster can reach (:data:`BOUNDS`, documented in ``planner/schemas/README.md``),
every list and string a length limit. Objects admit extra keys (forward compatibility) except the
closed ones (``block``, ``peak_flops``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from planner import ir, runnable
from planner.ir.cluster import MAX_THREADS, MIN_SHARE
from planner.schedule import SCHEDULES

DRAFT = "https://json-schema.org/draft/2020-12/schema"
FOLDER = Path(__file__).resolve().parent

MAX_FLOPS = 10**18  # peak FLOP/s of one device (an H100 is ~1e15 dense bf16)
MAX_FLOP_COUNT = 10**21  # FLOPs of one layer over the whole batch
MAX_BYTES = 10**15  # device memory, bytes of one layer, bytes per second of a link or memory
MAX_COUNT = 10**15  # parameters of one layer or tie
MAX_BATCH = 10**7  # samples per batch, micro-batches
MAX_TIME_S = 10**6  # any time in seconds (11.6 days)
MAX_RATE = 10**12  # samples per second
MAX_DIM = 10**9  # a tensor dimension, features, sequence length
MAX_ITEMS = 10**5  # layers, stages, ties, nodes, GPUs per node, devices per stage
MAX_NAME = 1024  # characters of a name
MAX_VIRTUAL = 1024  # model chunks per device group

BOUNDS = {"FLOP/s": MAX_FLOPS, "FLOPs per layer": MAX_FLOP_COUNT, "bytes": MAX_BYTES, "parameters": MAX_COUNT,
          "batch and micro-batches": MAX_BATCH, "seconds": MAX_TIME_S, "samples/s": MAX_RATE,
          "dimension": MAX_DIM, "list items": MAX_ITEMS, "name characters": MAX_NAME,
          "virtual stages": MAX_VIRTUAL}
"""Every upper bound, by what it bounds (README and the report list them)."""

ENGINES = ("any", *runnable.ENGINES)


MIN_RATE = 1000
"""The least FLOP/s of a device and bytes/s of a link or memory: below it a plan's times overflow (a link of
1e-300 bytes/s makes an iteration of 1e300 s); the slowest real ones are millions of times faster."""
MAX_LATENCY_S = 60  # a link's latency (TCP across continents is a tenth of a second)


def number(hi: float, *, positive: bool = False, nullable: bool = False, what: str = "",
           lo: float | None = None) -> dict[str, Any]:
    """A finite number in [0, hi] (``positive``: (0, hi]; ``lo``: [lo, hi])."""
    s: dict[str, Any] = {"type": ["number", "null"] if nullable else "number", "maximum": hi}
    if lo is not None:
        s["minimum"] = lo
    else:
        s["exclusiveMinimum" if positive else "minimum"] = 0
    if what:
        s["description"] = what
    return s


def integer(hi: int, *, lo: int = 0, nullable: bool = False, what: str = "") -> dict[str, Any]:
    """An integer in [lo, hi]."""
    s: dict[str, Any] = {"type": ["integer", "null"] if nullable else "integer", "minimum": lo, "maximum": hi}
    if what:
        s["description"] = what
    return s


def string(max_len: int = MAX_NAME) -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "maxLength": max_len}


def array(items: dict[str, Any], lo: int = 1, hi: int = MAX_ITEMS) -> dict[str, Any]:
    return {"type": "array", "items": items, "minItems": lo, "maxItems": hi}


def obj(required: dict[str, Any], optional: dict[str, Any] | None = None, closed: bool = False) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "object", "required": list(required), "properties": {**required, **(optional or {})}}
    if closed:
        s["additionalProperties"] = False
    return s


def header(kind: str, versions: tuple[int, ...]) -> dict[str, Any]:
    version: dict[str, Any] = {"const": versions[0]} if len(versions) == 1 else {"enum": list(versions)}
    return {"kind": {"const": kind}, "version": {"type": "integer", **version}}


SECONDS = number(MAX_TIME_S, what="seconds")
BYTES = integer(MAX_BYTES, what="bytes")
DIMS = array(integer(MAX_DIM, lo=1), hi=64)


def _block() -> dict[str, Any]:
    return obj({"hidden": integer(MAX_DIM, lo=1), "heads": integer(MAX_ITEMS, lo=1),
                "kv_heads": integer(MAX_ITEMS, lo=1), "ffn": integer(MAX_DIM, lo=1),
                "seq_len": integer(MAX_DIM, lo=1)},
               {"gated": {"type": "boolean"}, "attention_saved": {"type": "boolean"},
                "head_dim": integer(MAX_DIM, lo=1), "shardable": {"type": "boolean"}}, closed=True)


def _layer() -> dict[str, Any]:
    flops = number(MAX_FLOP_COUNT, what="FLOPs of the layer over the whole batch")
    return obj({"name": string(), "type": string(), "forward_s": SECONDS, "backward_s": SECONDS,
                "forward_flops": flops, "backward_flops": flops, "param_count": integer(MAX_COUNT),
                "param_bytes": BYTES, "output_bytes": BYTES, "saved_bytes": BYTES},
               {"in_features": integer(MAX_DIM, lo=1, nullable=True),
                "out_features": integer(MAX_DIM, lo=1, nullable=True),
                "backward_weight_s": number(MAX_TIME_S, nullable=True), "output_shape": DIMS,
                "forward_fixed_s": number(MAX_TIME_S, nullable=True),
                "backward_fixed_s": number(MAX_TIME_S, nullable=True), "block": {"$ref": "#/$defs/block"},
                "forward_replicated_s": number(MAX_TIME_S, nullable=True),
                "backward_replicated_s": number(MAX_TIME_S, nullable=True),
                "trainable_count": integer(MAX_COUNT, nullable=True), "batch_stats": {"type": "boolean"},
                "batch_times": array(obj({"batch": integer(MAX_BATCH, lo=1), "forward_s": SECONDS,
                                          "backward_s": SECONDS}), lo=0, hi=64)})


OVERRIDES = {"type": ["object", "null"], "additionalProperties": {"type": ["string", "number", "boolean", "null"]}}
"""``meta.overrides``: the ``--set`` config fields of a zoo model, each a JSON scalar (run and export build with
them)."""


def profile_schema() -> dict[str, Any]:
    """profile.json, version 1."""
    tie = obj({"name": string(), "layers": array(integer(MAX_ITEMS), lo=2), "param_count": integer(MAX_COUNT),
               "param_bytes": BYTES})
    return obj({**header("profile", (1,)), "model": string(), "batch_size": integer(MAX_BATCH, lo=1),
                "dtype": string(64), "mode": string(64), "device": string(),
                "device_flops": number(MAX_FLOPS, lo=MIN_RATE, what="FLOP/s"),
                "layers": array({"$ref": "#/$defs/layer"})},
               {"input_shape": DIMS, "input_bytes": BYTES, "ties": array(tie, lo=0),
                "meta": {"type": ["object", "null"], "properties": {"overrides": OVERRIDES}},
                "loss_s": number(MAX_TIME_S, nullable=True),
                "loss_fixed_s": number(MAX_TIME_S, nullable=True), "min_batch": integer(MAX_BATCH, lo=1)})


def cluster_schema() -> dict[str, Any]:
    """cluster.json, version 1."""
    return obj({**header("cluster", (1,)), "name": string(), "nodes": array({"$ref": "#/$defs/node"}),
                "links": {"type": "object", "required": list(ir.LINK_LEVELS),
                          "additionalProperties": {"$ref": "#/$defs/link"}}},
               {"description": {"type": "string", "maxLength": 100_000},
                "engine_overheads": obj({}, {e: {"$ref": "#/$defs/engine_overhead"} for e in runnable.ENGINES},
                                        closed=True),
                "memory_kept_free": {"type": "number", "minimum": 0, "exclusiveMaximum": 1,
                                     "description": "share of every GPU's memory held back"}})


def _cluster_defs() -> dict[str, Any]:
    flops = number(MAX_FLOPS, lo=MIN_RATE, what="FLOP/s")
    gpu = obj({"name": string(), "flops": flops, "memory_bytes": integer(MAX_BYTES, lo=1, what="bytes")},
              {"memory_bandwidth_Bps": number(MAX_BYTES, lo=MIN_RATE, nullable=True, what="bytes/s"),
               "peak_flops": obj({}, {f: flops for f in ir.NUMBER_FORMATS}, closed=True)})
    overhead = obj({}, {f: number(MAX_TIME_S, what="seconds") for f in ir.EngineOverhead.FIELDS}, closed=True)
    node = obj({"name": string(), "gpus": array({"$ref": "#/$defs/gpu"})},
               {"concurrent_devices": number(MAX_ITEMS, lo=MIN_SHARE, what="devices"),
                "sharing_efficiency": number(1, lo=MIN_SHARE, what="share"),
                "handoff_s": number(MAX_TIME_S, what="seconds"),
                "threads": integer(MAX_THREADS, lo=1, what="torch threads per process")})
    return {"gpu": gpu, "node": node,
            "engine_overhead": overhead,
            "link": obj({"bandwidth_Bps": number(MAX_BYTES, lo=MIN_RATE, what="bytes/s"),
                         "latency_s": number(MAX_LATENCY_S, what="seconds")},
                        {**{f: number(MAX_BYTES, lo=MIN_RATE, nullable=True, what="bytes/s")
                            for f in ir.Link.BUS_FIELDS},
                         "collective_latency_s": number(MAX_LATENCY_S, what="seconds")})}


def _stage(version: int) -> dict[str, Any]:
    recompute: dict[str, Any] = {"enum": list(ir.RECOMPUTE)}
    if version == 1:
        recompute = {"enum": [True, False, *ir.RECOMPUTE]}
    return obj({"layers": array(integer(MAX_ITEMS), lo=2, hi=2), "devices": array(string()),
                "forms": array({"enum": list(ir.ALL_FORMS)}), "memory_bytes": BYTES},
               {"recompute": recompute, "tp": integer(MAX_ITEMS, lo=1), "dp": integer(MAX_ITEMS, lo=1),
                "zero": {"enum": list(ir.ZERO_STAGES)}, "sequence_parallel": {"type": "boolean"},
                "micro_batch_size": number(MAX_BATCH, positive=True)})


def plan_schema(version: int) -> dict[str, Any]:
    """plan.json, version 1 or 2 (self-contained: the embedded profile and cluster are ``$defs``)."""
    predicted = obj({"iteration_s": SECONDS, "samples_per_s": number(MAX_RATE), "bubble_fraction": number(1),
                     "peak_memory_bytes": BYTES})
    return obj({**header("plan", (version,)), "model": string(), "cluster": {"$ref": "#/$defs/cluster"},
                "profile": {"$ref": "#/$defs/profile"}, "schedule": {"enum": list(SCHEDULES)},
                "microbatches": integer(MAX_BATCH, lo=1), "batch_size": integer(MAX_BATCH, lo=1),
                "optimizer": {"enum": list(ir.OPTIMIZERS)}, "stages": array({"$ref": "#/$defs/stage"}),
                "predicted": predicted},
               {"precision": {"enum": list(ir.PRECISIONS)}, "config": string(MAX_NAME * 8),
                "virtual_stages": integer(MAX_VIRTUAL, lo=1), "engine": {"enum": list(ENGINES)},
                "solver": string(64), "dp_iteration_s": number(MAX_TIME_S, nullable=True),
                "speedup_over_dp": number(MAX_TIME_S, nullable=True)})


def _document(kind: str, version: int, body: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    return {"$schema": DRAFT, "$id": f"https://planner.invalid/schemas/{kind}.v{version}.schema.json",
            "title": f"planner {kind} file, version {version}", **body, "$defs": defs}


def schemas() -> dict[str, dict[str, Any]]:
    """File name -> schema document, for every file kind and version planner reads."""
    layer_defs = {"layer": _layer(), "block": _block()}
    out = {"profile.v1.schema.json": _document("profile", 1, profile_schema(), layer_defs),
           "cluster.v1.schema.json": _document("cluster", 1, cluster_schema(), _cluster_defs())}
    for version in (1, 2):
        defs = {"profile": profile_schema(), "cluster": cluster_schema(), **layer_defs, **_cluster_defs(),
                "stage": _stage(version)}
        out[f"plan.v{version}.schema.json"] = _document("plan", version, plan_schema(version), defs)
    return out


def text(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2) + "\n"


def main() -> None:
    """Rewrite the shipped schema files."""
    for name, doc in schemas().items():
        (FOLDER / name).write_text(text(doc), encoding="utf-8")
        print(f"wrote {FOLDER / name}")


if __name__ == "__main__":
    main()

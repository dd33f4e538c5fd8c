"""What a training engine adds to the cost model's times on a cluster, as ``planner calibrate`` measures it: the
cluster file's optional ``engine_overheads`` (:class:`EngineOverhead` per engine)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from planner.errors import FormatError
from planner.ir._fields import _num

__all__ = ["EngineOverhead", "engine_overheads"]


@dataclass(frozen=True)
class EngineOverhead:
    """What an engine adds to the cost model's times on a cluster, measured by ``planner calibrate``.

    ``per_action_s``: each forward or backward action of a stage (the engine's Python
    scheduling of it); ``per_microbatch_s``: each micro-batch a stage sends over a pipeline
    boundary, activation or gradient (the engine's point-to-point set-up);
    ``per_step_s``: each training step (its optimizer wrapper, loss and step bookkeeping);
    ``per_shard_s``: each all-gather or reduce-scatter of one ZeRO-2/3 (FSDP) unit, a layer with
    parameters, beyond its bytes over the link (its copies in and out, its hooks, the ranks meeting);
    for DeepSpeed, each layer's share of its ZeRO-1 reduction into partitions and of its parameters'
    all-gather, which run parameter by parameter in Python.
    ``per_collective_s``: each collective of a tensor group (a tensor-parallel or split layer's all-reduce or
    all-gather, forward or backward, and a change of layout between layers) beyond its bytes over the link: the
    engine's redistribution of its sharded tensors and the ranks meeting while they compute (on this 2-core VM a
    256 KB all-reduce took 0.5 ms back to back and about 2.4 ms inside a tensor-parallel step of torch).
    How the cost model charges them: :mod:`planner.costmodel.engine`, for ``per_shard_s``
    :mod:`planner.costmodel.variant`, for ``per_collective_s`` :mod:`planner.costmodel.layers`. A file without a
    field reads it as 0.
    """

    per_action_s: float = 0.0
    per_microbatch_s: float = 0.0
    per_step_s: float = 0.0
    per_shard_s: float = 0.0
    per_collective_s: float = 0.0

    FIELDS = ("per_action_s", "per_microbatch_s", "per_step_s", "per_shard_s", "per_collective_s")

    @property
    def is_zero(self) -> bool:
        return all(getattr(self, f) == 0 for f in self.FIELDS)

    def to_dict(self) -> dict[str, float]:
        return {f: float(getattr(self, f)) for f in self.FIELDS}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> EngineOverhead:
        if not isinstance(d, Mapping):
            raise FormatError(f"{where} must be an object of {', '.join(cls.FIELDS)}, got {d!r:.60}",
                              'e.g. {"per_action_s": 2e-4, "per_microbatch_s": 1e-4, "per_step_s": 3e-3}')
        bad = [k for k in d if k not in cls.FIELDS]
        if bad:
            raise FormatError(f"{where} has unknown field {bad[0]!r}", f"use {', '.join(cls.FIELDS)}")
        return cls(*(_num(d, k, where) if k in d else 0.0 for k in cls.FIELDS))


def engine_overheads(doc: Mapping[str, Any], source: str) -> tuple[tuple[str, EngineOverhead], ...]:
    """The optional ``engine_overheads`` object: engine name -> EngineOverhead (in ENGINES order)."""
    d = doc.get("engine_overheads")
    if d is None:
        return ()
    from planner.schedule.kinds import ENGINES  # here: `import planner` stays free of numpy

    where = f"{source}.engine_overheads"
    if not isinstance(d, Mapping):
        raise FormatError(f"{where} must be an object of engine -> overheads, got {d!r:.60}",
                          f"e.g. {{\"deepspeed\": {{\"per_action_s\": 2e-4}}}} with engines {', '.join(ENGINES)}")
    bad = [k for k in d if k not in ENGINES]
    if bad:
        raise FormatError(f"{where} has unknown engine {bad[0]!r}", f"use {', '.join(ENGINES)}")
    return tuple((e, EngineOverhead.from_dict(d[e], f"{where}.{e}")) for e in ENGINES if e in d)

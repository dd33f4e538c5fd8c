"""plan.json as values: stages as tensor x data grids, the prediction, the plan (version 2; version 1 loads)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from planner.errors import FormatError
from planner.ir._fields import _bool, _get, _int, _list, _need, _num, _opt_num, _opt_str, _str, _wholes
from planner.ir.cluster import Cluster
from planner.ir.profile import ModelProfile
from planner.jsonio import check_kind

FORMS = ("dp", "split_in", "split_out")
"""Per-layer parallel forms (paper forms 0, 1 and 2); see DESIGN.md section 2."""

OPTIMIZERS = ("sgd", "momentum", "adam", "rmsprop")

TENSOR_FORMS = ("tp",)
"""Forms open only to transformer blocks with a :class:`BlockShape`: ``tp`` is Megatron-LM's
block (attention heads and MLP sharded column- then row-parallel over the stage's tensor group)."""

ALL_FORMS = FORMS + TENSOR_FORMS

RECOMPUTE = ("none", "selective", "full")
"""Activation recomputation of a stage: none, selective (attention core, Korthikanti et al. 2022)
or full (keep each micro-batch's stage input only, GPipe re-materialisation)."""

ZERO_STAGES = (0, 1, 2, 3)
"""ZeRO stages (Rajbhandari et al. SC'20): 0 none, 1 optimizer state, 2 + gradients, 3 + parameters
sharded over a stage's data-parallel group."""

PRECISIONS = ("fp32", "bf16", "fp16")
"""Training precision: fp32, or mixed precision with 16-bit weights, gradients and activations and
fp32 master weights and optimizer state (Micikevicius et al. 2018; ZeRO section 3)."""

PLAN_VERSION = 2
"""Plan files are written at version 2 (tensor x data grids); version 1 files still load."""


@dataclass(frozen=True)
class Stage:
    """One pipeline stage: layers [first, end) on ``devices``, a ``tp`` x ``dp`` grid.

    The devices form ``dp`` tensor groups of ``tp`` consecutive devices each
    (``devices[i*tp:(i+1)*tp]``); each group holds a replica of the stage and the batch is
    split over the replicas. ``forms`` has one form per layer, relative to the tensor group:
    ``dp`` splits the replica's samples over the group's devices (weights replicated),
    ``split_in``/``split_out`` shard a layer's weight over the group, ``tp`` is Megatron's
    transformer block. With ``tp == 1`` every form is ``dp``, plain data parallelism.
    ``memory_bytes`` is the predicted peak memory of each of its devices.
    ``recompute``: ``none``, ``selective`` (attention core) or ``full`` (keep the stage
    input per micro-batch and redo the forward in backward); a bool (plan version 1)
    reads as ``full``/``none``. ``zero``: the ZeRO stage over the data-parallel group.
    ``sequence_parallel``: ``tp`` blocks also shard norms and dropout over the sequence.
    """

    layers: tuple[int, int]
    devices: tuple[str, ...]
    forms: tuple[str, ...]
    memory_bytes: int
    recompute: str = "none"
    tp: int = 1
    zero: int = 0
    sequence_parallel: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.recompute, bool):
            object.__setattr__(self, "recompute", "full" if self.recompute else "none")

    @property
    def width(self) -> int:
        return len(self.devices)

    @property
    def dp(self) -> int:
        """Data-parallel replicas: ``len(devices) // tp``."""
        return len(self.devices) // self.tp

    @property
    def recomputes(self) -> bool:
        """Whether the stage recomputes anything in backward."""
        return self.recompute != "none"

    def tensor_groups(self) -> tuple[tuple[str, ...], ...]:
        """The ``dp`` tensor groups, ``tp`` consecutive devices each."""
        return tuple(self.devices[i * self.tp:(i + 1) * self.tp] for i in range(self.dp))

    def to_dict(self) -> dict[str, Any]:
        return {"layers": list(self.layers), "devices": list(self.devices), "forms": list(self.forms),
                "memory_bytes": self.memory_bytes, "recompute": self.recompute, "tp": self.tp, "dp": self.dp,
                "zero": self.zero, "sequence_parallel": self.sequence_parallel}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> Stage:
        layers = _wholes(_list(d, "layers", where))
        ok = len(layers) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in layers)
        if not ok or not 0 <= layers[0] < layers[1]:
            raise FormatError(f"{where}.layers must be [first, end), whole numbers with 0 <= first < end, got "
                              f"{layers!r:.80}",
                              "fix the stage's layer range")
        devices = _list(d, "devices", where)
        forms = _list(d, "forms", where)
        if not all(isinstance(x, str) for x in devices):
            raise FormatError(f"{where}.devices must be device names, got {devices!r:.80}", "fix 'devices'")
        bad = [f for f in forms if f not in ALL_FORMS]
        if bad:
            raise FormatError(f"{where}.forms has unknown form {bad[0]!r:.40}", f"forms are {', '.join(ALL_FORMS)}")
        if len(forms) != layers[1] - layers[0]:
            raise FormatError(f"{where}: {len(forms)} forms for {layers[1] - layers[0]} layers {layers}",
                              "give one form per layer")
        tp = _int(d, "tp", where, positive=True) if "tp" in d else _v1_tp(forms, len(devices))
        return cls((layers[0], layers[1]), tuple(devices), tuple(forms), _int(d, "memory_bytes", where),
                   _recompute(d, where), tp, _zero(d, where), _bool(d, "sequence_parallel", where, False))

    def grid_problem(self) -> tuple[str, str] | None:
        """Why the grid is inconsistent, as (cause, fix), or None: ``tp`` must divide the devices,
        and split or ``tp`` forms need a tensor group of two or more (``tp`` is never inferred:
        with ``tp == 1`` a weight split over one device is meaningless)."""
        if self.tp < 1 or self.width % self.tp:
            return (f"tp {self.tp} does not divide the stage's {self.width} devices",
                    "tp * dp must equal the number of devices")
        split = sorted({f for f in self.forms if f != "dp"})
        if self.tp == 1 and split:
            fix = (f"give tp (the tensor group's size, e.g. tp={self.width}) or use 'dp' forms" if self.width > 1
                   else "use 'dp' forms: a stage of one device has no tensor group to split over")
            return (f"tp is 1 but the stage has {', '.join(split)} forms, which split a layer over its tensor "
                    f"group", fix)
        return None

    def check(self, where: str) -> None:
        """The grid's own consistency (:meth:`grid_problem`), and ZeRO over two or more replicas."""
        problem = self.grid_problem()
        if problem is not None:
            raise FormatError(f"{where}: {problem[0]}", problem[1])
        if self.zero and self.dp == 1:
            raise FormatError(f"{where}: zero {self.zero} on a stage with dp 1 shards over one device",
                              "use zero 0 for a stage without data parallelism")


def _v1_tp(forms: Sequence[str], width: int) -> int:
    """Version 1 plans had no grid: split forms ran over all the stage's devices (tp = width)."""
    return width if any(f != "dp" for f in forms) else 1


def _recompute(d: Mapping[str, Any], where: str) -> str:
    value = _get(d, "recompute", where, "none")
    if isinstance(value, bool):
        return "full" if value else "none"
    if value not in RECOMPUTE:
        raise FormatError(f"{where}.recompute is {value!r:.40}", f"use one of {', '.join(RECOMPUTE)}")
    return str(value)


def _zero(d: Mapping[str, Any], where: str) -> int:
    value = _int(d, "zero", where) if "zero" in d else 0
    if value not in ZERO_STAGES:
        raise FormatError(f"{where}.zero is {value!r}", "ZeRO stages are 0, 1, 2 and 3")
    return value


@dataclass(frozen=True)
class Prediction:
    """What the cost model and simulator predict for one iteration of a plan."""

    iteration_s: float
    samples_per_s: float
    bubble_fraction: float
    peak_memory_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"iteration_s": self.iteration_s, "samples_per_s": self.samples_per_s,
                "bubble_fraction": self.bubble_fraction, "peak_memory_bytes": self.peak_memory_bytes}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> Prediction:
        return cls(_num(d, "iteration_s", where), _num(d, "samples_per_s", where),
                   _num(d, "bubble_fraction", where), _int(d, "peak_memory_bytes", where))

    @classmethod
    def of(cls, iteration_s: float, batch_size: int, bubble_fraction: float, peak_memory_bytes: int) -> Prediction:
        """The prediction of an iteration of ``iteration_s`` over ``batch_size`` samples."""
        rate = batch_size / iteration_s if iteration_s > 0 else 0.0
        return cls(iteration_s, rate, bubble_fraction, peak_memory_bytes)


@dataclass(frozen=True)
class Plan:
    """A training plan: stages over a cluster, a schedule and M micro-batches.

    Self-contained: it embeds the profile and cluster it was made from. For the
    ``interleaved`` schedule, ``stages`` lists the K*v model chunks in model order and
    chunk c runs on the devices of chunk c mod K (``virtual_stages`` = v).
    ``dp_iteration_s``/``speedup_over_dp`` are None when pure data parallel does not fit.
    ``precision``: ``fp32``, or mixed ``bf16``/``fp16`` (16-bit weights, gradients and
    activations, fp32 master weights and optimizer state).
    """

    profile: ModelProfile
    cluster: Cluster
    schedule: str
    microbatches: int
    optimizer: str
    stages: tuple[Stage, ...]
    predicted: Prediction
    dp_iteration_s: float | None = None
    speedup_over_dp: float | None = None
    virtual_stages: int = 1
    engine: str = "any"
    solver: str = "dp"
    precision: str = "fp32"

    @property
    def model(self) -> str:
        return self.profile.model

    @property
    def batch_size(self) -> int:
        return self.profile.batch_size

    @property
    def config(self) -> str:
        """Devices per stage in PipeDream notation, e.g. ``2-1-1``: per device group, one entry for the ``v``
        chunks an interleaved group runs (``--config`` takes the same), so it adds up to the devices used."""
        return config_string([s.width for s in self.stages[:self.pipeline_stages]])

    @property
    def world_size(self) -> int:
        return len({d for s in self.stages for d in s.devices})

    @property
    def process_threads(self) -> int | None:
        """The torch threads per process its devices were measured with (:meth:`Cluster.threads_for`: CPU processes
        of ``planner calibrate``), which ``planner run`` and an exported launch script start; None: not known."""
        return self.cluster.threads_for(d for s in self.stages for d in s.devices)

    @property
    def pipeline_stages(self) -> int:
        """K, the pipeline's device groups (``len(stages) / virtual_stages`` for interleaved chunks)."""
        return max(len(self.stages) // max(self.virtual_stages, 1), 1)

    def micro_batch_size(self, stage: Stage) -> float:
        """Samples per micro-batch on each data-parallel rank of ``stage``: batch / (M * dp).

        Whole and >= 1 in a runnable plan (planner.runnable); a float so that an
        unrunnable plan read from a file can still be shown and checked.
        """
        return self.batch_size / (self.microbatches * stage.dp)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "plan", "version": PLAN_VERSION, "model": self.model,
            "cluster": self.cluster.to_dict(), "profile": self.profile.to_dict(),
            "schedule": self.schedule, "microbatches": self.microbatches, "batch_size": self.batch_size,
            "optimizer": self.optimizer, "precision": self.precision, "config": self.config,
            "virtual_stages": self.virtual_stages, "engine": self.engine, "solver": self.solver,
            "stages": [self._stage_dict(s) for s in self.stages], "predicted": self.predicted.to_dict(),
            "dp_iteration_s": self.dp_iteration_s, "speedup_over_dp": self.speedup_over_dp,
        }

    def _stage_dict(self, stage: Stage) -> dict[str, Any]:
        d = stage.to_dict()
        mbs = self.micro_batch_size(stage)
        d["micro_batch_size"] = int(mbs) if float(mbs).is_integer() else mbs
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "plan") -> Plan:
        doc = check_kind(d, "plan", source, versions=(1, PLAN_VERSION))
        profile = ModelProfile.from_dict(_need(doc, "profile", source), f"{source}.profile")
        cluster = Cluster.from_dict(_need(doc, "cluster", source), f"{source}.cluster")
        stages = tuple(Stage.from_dict(s, f"{source}: stages[{i}]") for i, s in enumerate(_list(doc, "stages", source)))
        for i, stage in enumerate(stages):
            stage.check(f"{source}: stages[{i}]")
        optimizer = _str(doc, "optimizer", source)
        if optimizer not in OPTIMIZERS:
            raise FormatError(f"{source}.optimizer is {optimizer!r:.40}", f"use one of {', '.join(OPTIMIZERS)}")
        precision = _opt_str(doc, "precision", source, "fp32")
        if precision not in PRECISIONS:
            raise FormatError(f"{source}.precision is {precision!r:.40}", f"use one of {', '.join(PRECISIONS)}")
        return cls(
            profile=profile, cluster=cluster, schedule=_str(doc, "schedule", source),
            microbatches=_int(doc, "microbatches", source, positive=True), optimizer=optimizer, stages=stages,
            predicted=Prediction.from_dict(_need(doc, "predicted", source), f"{source}.predicted"),
            dp_iteration_s=_opt_num(doc, "dp_iteration_s", source),
            speedup_over_dp=_opt_num(doc, "speedup_over_dp", source),
            virtual_stages=_int(doc, "virtual_stages", source, positive=True) if "virtual_stages" in doc else 1,
            engine=_opt_str(doc, "engine", source, "any"), solver=_opt_str(doc, "solver", source, "dp"),
            precision=precision,
        )


def config_string(widths: Sequence[int]) -> str:
    """PipeDream notation for devices per stage: ``[2, 1, 1]`` -> ``2-1-1``."""
    return "-".join(str(w) for w in widths)

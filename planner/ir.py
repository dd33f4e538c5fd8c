"""The values that move between planner's steps, and their versioned JSON forms.

profile.json -> ModelProfile, cluster.json -> Cluster, plan.json -> Plan. Every value is a
frozen dataclass; ``to_dict`` writes the contract form of ``../shared/DESIGN.md`` section 4
(with ``kind`` and ``version``), ``from_dict`` reads it back and names the field and value
of anything malformed. Contract fields are required; the others are optional and default,
so a hand-written profile with only the contract fields loads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from planner.errors import FormatError
from planner.jsonio import SUPPORTED_VERSION, check_kind, is_finite_number

FORMS = ("dp", "split_in", "split_out")
"""Per-layer parallel forms (paper forms 0, 1 and 2); see DESIGN.md section 2."""

OPTIMIZERS = ("sgd", "momentum", "adam", "rmsprop")


# ----------------------------------------------------------------------------- field readers


def _need(d: Mapping[str, Any], key: str, where: str) -> Any:
    if not isinstance(d, Mapping):
        raise FormatError(f"{where}: expected an object, got {type(d).__name__}", "check the JSON structure")
    if key not in d:
        raise FormatError(f"{where}: missing field '{key}'", f"add '{key}' (see DESIGN.md section 4)")
    return d[key]


def _str(d: Mapping[str, Any], key: str, where: str) -> str:
    value = _need(d, key, where)
    if not isinstance(value, str) or not value:
        raise FormatError(f"{where}.{key} must be a non-empty string, got {value!r}", f"fix '{key}'")
    return value


def _num(d: Mapping[str, Any], key: str, where: str, *, positive: bool = False) -> float:
    value = _need(d, key, where)
    if not is_finite_number(value) or value < 0 or (positive and value == 0):
        want = "a positive" if positive else "a non-negative"
        raise FormatError(f"{where}.{key} must be {want} finite number, got {value!r}", f"fix '{key}'")
    return float(value)


def _int(d: Mapping[str, Any], key: str, where: str, *, positive: bool = False) -> int:
    value = _need(d, key, where)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0 or (positive and value == 0):
        want = "a positive" if positive else "a non-negative"
        raise FormatError(f"{where}.{key} must be {want} integer, got {value!r}", f"fix '{key}'")
    return value


def _opt_int(d: Mapping[str, Any], key: str, where: str) -> int | None:
    return None if d.get(key) is None else _int(d, key, where, positive=True)


def _opt_num(d: Mapping[str, Any], key: str, where: str) -> float | None:
    return None if d.get(key) is None else _num(d, key, where)


def _list(d: Mapping[str, Any], key: str, where: str, *, nonempty: bool = True) -> list[Any]:
    value = _need(d, key, where)
    if not isinstance(value, list) or (nonempty and not value):
        raise FormatError(f"{where}.{key} must be a non-empty list, got {value!r:.60}", f"fix '{key}'")
    return value


def _shape(value: Any, where: str) -> tuple[int, ...]:
    ok = isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    if not ok:
        raise FormatError(f"{where} must be a list of positive integers, got {value!r}", "fix the shape")
    return tuple(value)


def _optional(obj: Any, keys: Sequence[str]) -> dict[str, Any]:
    """The optional fields of ``obj`` among ``keys`` that are set (None fields are left out)."""
    return {key: getattr(obj, key) for key in keys if getattr(obj, key) is not None}


def _check_part(where: str, part_key: str, part: float | None, whole_key: str, whole: float) -> None:
    """A time that is a part of another (fixed part, weight-gradient part) lies in [0, whole]."""
    if part is not None and not 0 <= part <= whole:
        raise FormatError(f"{where}.{part_key} ({part}) must lie in [0, {whole_key}={whole}]",
                          f"{part_key} is a part of {whole_key}")


# ----------------------------------------------------------------------------- profile


@dataclass(frozen=True)
class LayerProfile:
    """Costs of one layer for the whole ``batch_size`` of its profile.

    ``in_features``/``out_features`` are the input and output features (channels for a
    convolution) of the layer's dominant weight; the split forms need them, and a layer
    without them runs ``dp`` only. ``backward_weight_s`` is the weight-gradient share of
    ``backward_s`` (zero-bubble schedules split it off); None means unknown.

    ``forward_fixed_s``/``backward_fixed_s``: the part of ``forward_s``/``backward_s`` that
    does not shrink with the batch (per-call costs, reading the weights), from the fit
    ``t(b) = fixed + b * per_sample`` of times measured at two batch sizes; a micro-batch
    of ``b`` samples then costs ``fixed + b / batch_size * (t - fixed)``. None means unknown
    (treated as 0: time proportional to the batch, as analytic profiles assume).
    """

    name: str
    type: str
    forward_s: float
    backward_s: float
    forward_flops: float
    backward_flops: float
    param_count: int
    param_bytes: int
    output_bytes: int
    saved_bytes: int
    in_features: int | None = None
    out_features: int | None = None
    backward_weight_s: float | None = None
    output_shape: tuple[int, ...] | None = None
    forward_fixed_s: float | None = None
    backward_fixed_s: float | None = None

    @property
    def splittable(self) -> bool:
        """Whether the split forms are available (weight shape known)."""
        return self.in_features is not None and self.out_features is not None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "name": self.name,
            "type": self.type,
            "forward_s": self.forward_s,
            "backward_s": self.backward_s,
            "forward_flops": self.forward_flops,
            "backward_flops": self.backward_flops,
            "param_count": self.param_count,
            "param_bytes": self.param_bytes,
            "output_bytes": self.output_bytes,
            "saved_bytes": self.saved_bytes,
        }
        d.update(_optional(self, ("in_features", "out_features", "backward_weight_s", "forward_fixed_s",
                                  "backward_fixed_s")))
        if self.output_shape is not None:
            d["output_shape"] = list(self.output_shape)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "layer") -> LayerProfile:
        shape = d.get("output_shape") if isinstance(d, Mapping) else None
        layer = cls(
            name=_str(d, "name", where),
            type=_str(d, "type", where),
            forward_s=_num(d, "forward_s", where),
            backward_s=_num(d, "backward_s", where),
            forward_flops=_num(d, "forward_flops", where),
            backward_flops=_num(d, "backward_flops", where),
            param_count=_int(d, "param_count", where),
            param_bytes=_int(d, "param_bytes", where),
            output_bytes=_int(d, "output_bytes", where),
            saved_bytes=_int(d, "saved_bytes", where),
            in_features=_opt_int(d, "in_features", where),
            out_features=_opt_int(d, "out_features", where),
            backward_weight_s=_opt_num(d, "backward_weight_s", where),
            output_shape=None if shape is None else _shape(shape, f"{where}.output_shape"),
            forward_fixed_s=_opt_num(d, "forward_fixed_s", where),
            backward_fixed_s=_opt_num(d, "backward_fixed_s", where),
        )
        _check_part(where, "forward_fixed_s", layer.forward_fixed_s, "forward_s", layer.forward_s)
        _check_part(where, "backward_fixed_s", layer.backward_fixed_s, "backward_s", layer.backward_s)
        _check_part(where, "backward_weight_s", layer.backward_weight_s, "backward_s", layer.backward_s)
        return layer


@dataclass(frozen=True)
class Tie:
    """A parameter shared by several layers (e.g. GPT-2 ``wte``/``lm_head``).

    It is counted once, in the first layer of ``layers``; the others use it too.
    """

    name: str
    layers: tuple[int, ...]
    param_count: int
    param_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "layers": list(self.layers), "param_count": self.param_count,
                "param_bytes": self.param_bytes}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "tie") -> Tie:
        layers = _list(d, "layers", where)
        if len(layers) < 2 or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in layers):
            raise FormatError(f"{where}.layers must list two or more layer indices, got {layers!r}", "fix 'layers'")
        return cls(_str(d, "name", where), tuple(layers), _int(d, "param_count", where),
                   _int(d, "param_bytes", where))


@dataclass(frozen=True)
class ModelProfile:
    """Per-layer costs of a model at one batch size, measured or analytic (``mode``).

    Times hold for a device of ``device_flops`` peak FLOP/s. ``input_shape`` is the model
    input without the batch dimension; ``input_bytes`` the whole batch's input size.
    ``meta`` holds facts about how the profile was made (not used by the algorithms).
    ``loss_s``: forward+backward of the training loss (cross-entropy over the last
    dimension) on the last layer's output for the whole batch, with ``loss_fixed_s`` its
    part that does not shrink with the batch; the last stage pays it per micro-batch. None
    means unknown (treated as 0).
    """

    model: str
    batch_size: int
    dtype: str
    mode: str
    device: str
    device_flops: float
    layers: tuple[LayerProfile, ...]
    input_shape: tuple[int, ...] | None = None
    input_bytes: int = 0
    ties: tuple[Tie, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False)
    loss_s: float | None = None
    loss_fixed_s: float | None = None

    @property
    def param_count(self) -> int:
        return sum(layer.param_count for layer in self.layers)

    @property
    def param_bytes(self) -> int:
        return sum(layer.param_bytes for layer in self.layers)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "kind": "profile",
            "version": SUPPORTED_VERSION,
            "model": self.model,
            "batch_size": self.batch_size,
            "dtype": self.dtype,
            "mode": self.mode,
            "device": self.device,
            "device_flops": self.device_flops,
            "input_bytes": self.input_bytes,
            "layers": [layer.to_dict() for layer in self.layers],
            "ties": [tie.to_dict() for tie in self.ties],
            "meta": dict(self.meta),
        }
        if self.input_shape is not None:
            d["input_shape"] = list(self.input_shape)
        d.update(_optional(self, ("loss_s", "loss_fixed_s")))
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "profile") -> ModelProfile:
        doc = check_kind(d, "profile", source)
        layers = tuple(
            LayerProfile.from_dict(item, f"{source}: layers[{i}]")
            for i, item in enumerate(_list(doc, "layers", source))
        )
        ties = tuple(Tie.from_dict(t, f"{source}: ties[{i}]") for i, t in enumerate(doc.get("ties") or []))
        for i, tie in enumerate(ties):
            if max(tie.layers) >= len(layers):
                raise FormatError(f"{source}: ties[{i}] names layer {max(tie.layers)}, the model has "
                                  f"{len(layers)} layers", "fix the tie's layer indices")
        shape = doc.get("input_shape")
        meta = doc.get("meta") or {}
        profile = cls(
            model=_str(doc, "model", source),
            batch_size=_int(doc, "batch_size", source, positive=True),
            dtype=_str(doc, "dtype", source),
            mode=_str(doc, "mode", source),
            device=_str(doc, "device", source),
            device_flops=_num(doc, "device_flops", source, positive=True),
            layers=layers,
            input_shape=None if shape is None else _shape(shape, f"{source}.input_shape"),
            input_bytes=_int(doc, "input_bytes", source) if "input_bytes" in doc else 0,
            ties=ties,
            meta=dict(meta) if isinstance(meta, Mapping) else {},
            loss_s=_opt_num(doc, "loss_s", source),
            loss_fixed_s=_opt_num(doc, "loss_fixed_s", source),
        )
        if profile.loss_fixed_s is not None:
            _check_part(source, "loss_fixed_s", profile.loss_fixed_s, "loss_s", profile.loss_s or 0.0)
        return profile


# ----------------------------------------------------------------------------- cluster


@dataclass(frozen=True)
class GPU:
    """One device: its name (unique in the cluster), peak FLOP/s and memory.

    ``memory_bandwidth_Bps``: the device memory bandwidth (optional); the cost model's
    optimizer-step term (parameter and optimizer-state bytes read and written / this
    bandwidth) is 0 when it is None.
    """

    name: str
    flops: float
    memory_bytes: int
    memory_bandwidth_Bps: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "flops": self.flops, "memory_bytes": self.memory_bytes}
        if self.memory_bandwidth_Bps is not None:
            d["memory_bandwidth_Bps"] = self.memory_bandwidth_Bps
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> GPU:
        bw = _opt_num(d, "memory_bandwidth_Bps", where)
        if bw is not None and bw <= 0:
            raise FormatError(f"{where}.memory_bandwidth_Bps must be positive, got {bw!r}",
                              "e.g. 9e11, or leave it out")
        return cls(_str(d, "name", where), _num(d, "flops", where, positive=True),
                   _int(d, "memory_bytes", where, positive=True), bw)


@dataclass(frozen=True)
class Node:
    """One server: GPUs joined by the ``intra_node`` link."""

    name: str
    gpus: tuple[GPU, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "gpus": [g.to_dict() for g in self.gpus]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> Node:
        gpus = _list(d, "gpus", where)
        return cls(_str(d, "name", where), tuple(GPU.from_dict(g, f"{where}.gpus[{i}]") for i, g in enumerate(gpus)))


@dataclass(frozen=True)
class Link:
    """An alpha-beta link: ``latency_s`` per message plus bytes / ``bandwidth_Bps``."""

    bandwidth_Bps: float
    latency_s: float

    def transfer_s(self, nbytes: float) -> float:
        """Time to move ``nbytes`` over this link (alpha + n/beta); 0 bytes cost nothing."""
        return 0.0 if nbytes <= 0 else self.latency_s + nbytes / self.bandwidth_Bps

    def to_dict(self) -> dict[str, Any]:
        return {"bandwidth_Bps": self.bandwidth_Bps, "latency_s": self.latency_s}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> Link:
        return cls(_num(d, "bandwidth_Bps", where, positive=True), _num(d, "latency_s", where))


LINK_LEVELS = ("intra_node", "inter_node")
"""Link levels from the innermost out; a cluster file must define both."""


@dataclass(frozen=True)
class Cluster:
    """Servers of GPUs and the links at each level of the hierarchy (inner level first)."""

    name: str
    nodes: tuple[Node, ...]
    links: tuple[tuple[str, Link], ...]

    def link(self, level: str) -> Link:
        for name, link in self.links:
            if name == level:
                return link
        raise KeyError(level)

    @property
    def gpus(self) -> tuple[GPU, ...]:
        return tuple(g for node in self.nodes for g in node.gpus)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "cluster", "version": SUPPORTED_VERSION, "name": self.name,
                "nodes": [n.to_dict() for n in self.nodes],
                "links": {name: link.to_dict() for name, link in self.links}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "cluster") -> Cluster:
        doc = check_kind(d, "cluster", source)
        nodes = tuple(Node.from_dict(n, f"{source}: nodes[{i}]") for i, n in enumerate(_list(doc, "nodes", source)))
        links_doc = _need(doc, "links", source)
        if not isinstance(links_doc, Mapping):
            raise FormatError(f"{source}.links must be an object, got {links_doc!r:.60}", "see DESIGN.md section 4")
        for level in LINK_LEVELS:
            _need(links_doc, level, f"{source}.links")
        links = tuple((str(k), Link.from_dict(v, f"{source}.links.{k}")) for k, v in links_doc.items())
        names = [g.name for n in nodes for g in n.gpus]
        dupes = sorted({x for x in names if names.count(x) > 1})
        if dupes:
            raise FormatError(f"{source}: GPU names must be unique in the cluster, repeated: {dupes[:5]}",
                              "name GPUs like 'n0.g0'")
        return cls(_str(doc, "name", source), nodes, links)


# ----------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class Stage:
    """One pipeline stage: layers [first, end) on ``devices``, one form per layer.

    ``memory_bytes`` is the predicted peak memory of each of its devices.
    ``recompute``: keep only the stage input per micro-batch and redo the forward in backward.
    """

    layers: tuple[int, int]
    devices: tuple[str, ...]
    forms: tuple[str, ...]
    memory_bytes: int
    recompute: bool = False

    @property
    def width(self) -> int:
        return len(self.devices)

    def to_dict(self) -> dict[str, Any]:
        return {"layers": list(self.layers), "devices": list(self.devices), "forms": list(self.forms),
                "memory_bytes": self.memory_bytes, "recompute": self.recompute}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> Stage:
        layers = _list(d, "layers", where)
        ok = len(layers) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in layers)
        if not ok or not 0 <= layers[0] < layers[1]:
            raise FormatError(f"{where}.layers must be [first, end) with first < end, got {layers!r}",
                              "fix the stage's layer range")
        devices = _list(d, "devices", where)
        forms = _list(d, "forms", where)
        if not all(isinstance(x, str) for x in devices):
            raise FormatError(f"{where}.devices must be device names, got {devices!r:.80}", "fix 'devices'")
        bad = [f for f in forms if f not in FORMS]
        if bad:
            raise FormatError(f"{where}.forms has unknown form {bad[0]!r}", f"forms are {', '.join(FORMS)}")
        if len(forms) != layers[1] - layers[0]:
            raise FormatError(f"{where}: {len(forms)} forms for {layers[1] - layers[0]} layers {layers}",
                              "give one form per layer")
        recompute = d.get("recompute", False)
        return cls((layers[0], layers[1]), tuple(devices), tuple(forms), _int(d, "memory_bytes", where),
                   bool(recompute))


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


@dataclass(frozen=True)
class Plan:
    """A training plan: stages over a cluster, a schedule and M micro-batches.

    Self-contained: it embeds the profile and cluster it was made from. For the
    ``interleaved`` schedule, ``stages`` lists the K*v model chunks in model order and
    chunk c runs on the devices of chunk c mod K (``virtual_stages`` = v).
    ``dp_iteration_s``/``speedup_over_dp`` are None when pure data parallel does not fit.
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

    @property
    def model(self) -> str:
        return self.profile.model

    @property
    def batch_size(self) -> int:
        return self.profile.batch_size

    @property
    def config(self) -> str:
        """Devices per stage in PipeDream notation, e.g. ``2-1-1``."""
        return config_string([s.width for s in self.stages])

    @property
    def world_size(self) -> int:
        return len({d for s in self.stages for d in s.devices})

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "plan", "version": SUPPORTED_VERSION, "model": self.model,
            "cluster": self.cluster.to_dict(), "profile": self.profile.to_dict(),
            "schedule": self.schedule, "microbatches": self.microbatches, "batch_size": self.batch_size,
            "optimizer": self.optimizer, "config": self.config, "virtual_stages": self.virtual_stages,
            "engine": self.engine, "solver": self.solver,
            "stages": [s.to_dict() for s in self.stages], "predicted": self.predicted.to_dict(),
            "dp_iteration_s": self.dp_iteration_s, "speedup_over_dp": self.speedup_over_dp,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "plan") -> Plan:
        doc = check_kind(d, "plan", source)
        profile = ModelProfile.from_dict(_need(doc, "profile", source), f"{source}.profile")
        cluster = Cluster.from_dict(_need(doc, "cluster", source), f"{source}.cluster")
        stages = tuple(Stage.from_dict(s, f"{source}: stages[{i}]") for i, s in enumerate(_list(doc, "stages", source)))
        optimizer = _str(doc, "optimizer", source)
        if optimizer not in OPTIMIZERS:
            raise FormatError(f"{source}.optimizer is {optimizer!r}", f"use one of {', '.join(OPTIMIZERS)}")
        return cls(
            profile=profile, cluster=cluster, schedule=_str(doc, "schedule", source),
            microbatches=_int(doc, "microbatches", source, positive=True), optimizer=optimizer, stages=stages,
            predicted=Prediction.from_dict(_need(doc, "predicted", source), f"{source}.predicted"),
            dp_iteration_s=_opt_num(doc, "dp_iteration_s", source),
            speedup_over_dp=_opt_num(doc, "speedup_over_dp", source),
            virtual_stages=_int(doc, "virtual_stages", source, positive=True) if "virtual_stages" in doc else 1,
            engine=str(doc.get("engine", "any")), solver=str(doc.get("solver", "dp")),
        )


def config_string(widths: Sequence[int]) -> str:
    """PipeDream notation for devices per stage: ``[2, 1, 1]`` -> ``2-1-1``."""
    return "-".join(str(w) for w in widths)


# ----------------------------------------------------------------------------- stage costs


@dataclass(frozen=True)
class StageCost:
    """What one stage costs per micro-batch, per device of its group (cost model -> simulator).

    Times are for one micro-batch on the stage's slowest device, collectives of the split
    forms included. ``backward_weight_s`` is the weight-gradient part of ``backward_s``
    (the ``W`` of zero-bubble schedules). ``send_bytes`` cross to the next stage per
    micro-batch over ``send_link`` (the same bytes come back as gradients in backward);
    transfers on one ``send_link_id`` share its bandwidth. ``allreduce_s`` is the
    gradient synchronisation of the stage's data-parallel weights after its last backward.
    Memory per device: ``static_bytes`` (weights, gradients, optimizer state),
    ``weight_bytes`` (one weight version, for stashing), ``activation_bytes`` kept per
    micro-batch in flight, ``workspace_bytes`` transient during one backward,
    ``capacity_bytes`` the smallest memory in the group. ``optimizer_step_s`` is the
    optimizer step of the stage's parameters, run once per iteration after its all-reduce
    (0 when the devices' memory bandwidth is unknown).
    """

    devices: tuple[str, ...]
    forward_s: float
    backward_s: float
    backward_weight_s: float
    send_bytes: float
    send_link: Link | None
    send_link_id: str | None
    allreduce_s: float
    allreduce_bytes: float
    static_bytes: int
    weight_bytes: int
    activation_bytes: int
    workspace_bytes: int
    capacity_bytes: int
    optimizer_step_s: float = 0.0

    @property
    def send_s(self) -> float:
        """Unshared time to send one micro-batch's activations to the next stage."""
        return 0.0 if self.send_link is None else self.send_link.transfer_s(self.send_bytes)

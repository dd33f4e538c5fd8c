"""profile.json as values: a model's per-layer costs (LayerProfile, ModelProfile; their parts in planner.ir.parts)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from planner.errors import FormatError, is_whole
from planner.ir._fields import (
    _bool,
    _check_part,
    _get,
    _int,
    _list,
    _num,
    _opt_int,
    _opt_list,
    _opt_num,
    _optional,
    _shape,
    _str,
)
from planner.ir.parts import BatchTimes, BlockShape, Tie
from planner.jsonio import SUPPORTED_VERSION, check_kind

DTYPE_BYTES = {"float32": 4, "fp32": 4, "float": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
               "float64": 8, "double": 8}
"""Bytes per element of the dtype names a profile may carry (``torch.`` prefix and case ignored)."""

PROFILE_MODES = ("measured", "analytic")
"""How a profile's times were taken: on this machine, or by the roofline of a named GPU."""


def dtype_key(dtype: str) -> str:
    """A profile's ``dtype`` as :data:`DTYPE_BYTES` names it: ``torch.`` prefix and case dropped."""
    return dtype.strip().lower().removeprefix("torch.")


def _profile_dtype(doc: Mapping[str, Any], source: str) -> str:
    dtype = _str(doc, "dtype", source)
    if dtype_key(dtype) not in DTYPE_BYTES:
        raise FormatError(f"{source}: dtype {dtype!r:.40} is not a floating-point dtype a profile is made in",
                          f"use one of {', '.join(DTYPE_BYTES)} (planner profile --dtype)")
    return dtype


def _profile_mode(doc: Mapping[str, Any], source: str) -> str:
    mode = _str(doc, "mode", source)
    if mode not in PROFILE_MODES:
        raise FormatError(f"{source}: mode {mode!r:.40} is neither of {', '.join(PROFILE_MODES)}",
                          "profile the model again (planner profile --mode measured or analytic)")
    return mode


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

    ``batch_times``: the layer's times measured at smaller batches as well (measured profiles:
    a half, a quarter, an eighth and a sixteenth of the batch), largest first. A layer's time is
    not one straight line in the batch: on a CPU a convolution ran 18% faster per sample at half
    the batch than at the whole (caches), and a small transformer 24% slower per sample at an
    eighth (fixed costs). Where they are given, a micro-batch's time is read off the line
    through them (``planner.costmodel.batch``); ``forward_fixed_s`` stays the two-point summary.

    ``trainable_count``: how many of ``param_count`` parameters train (``requires_grad``); the others
    are frozen (fine-tuning) and have no gradients, optimizer state or gradient synchronisation.
    None means all of them (profiles before the field). ``batch_stats``: the layer takes statistics over
    the samples it sees (batch norm), so splitting them over a tensor group changes its result (false in
    profiles before the field). ``tensor_counts``: the elements of each trainable parameter tensor counted in the
    layer, largest first, adding up to its trainable parameters; an engine whose ZeRO-1 gives each rank whole
    tensors charges the rank that gets most (planner.costmodel.stage); empty where unknown (profiles before the
    field).

    ``forward_replicated_s``/``backward_replicated_s``: the part of ``forward_s``/``backward_s`` that Megatron-LM's
    tensor parallelism without sequence parallelism runs whole on every rank of a tensor group (Korthikanti et al.
    2022, section 4.2.2: the norms, dropouts and residual adds on the ``s b h`` stream between the column- and
    row-parallel halves); sequence parallelism splits it over the sequence. None means unknown (treated as 0:
    the whole layer divides; measured profiles), set by the analytic roofline (``planner.profiler.roofline``).
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
    block: BlockShape | None = None
    batch_times: tuple[BatchTimes, ...] = ()
    trainable_count: int | None = None
    batch_stats: bool = False
    tensor_counts: tuple[int, ...] = ()
    forward_replicated_s: float | None = None
    backward_replicated_s: float | None = None

    @property
    def replicated_shares(self) -> tuple[float, float]:
        """The replicated parts' shares of the forward's and the backward's part that shrinks with the batch (that
        above ``forward_fixed_s``/``backward_fixed_s``), each in [0, 1]; 0 where unknown."""
        return (_share(self.forward_replicated_s, self.forward_s - (self.forward_fixed_s or 0.0)),
                _share(self.backward_replicated_s, self.backward_s - (self.backward_fixed_s or 0.0)))

    @property
    def trainable_params(self) -> int:
        """How many of its parameters train (all of them where ``trainable_count`` is None)."""
        return self.param_count if self.trainable_count is None else self.trainable_count

    @property
    def trainable_share(self) -> float:
        """The share of the layer's parameters that train (1 when all do, or it has none)."""
        if self.trainable_count is None or self.param_count == 0:
            return 1.0
        return self.trainable_count / self.param_count

    @property
    def splittable(self) -> bool:
        """Whether the split forms are available (weight shape known)."""
        return self.in_features is not None and self.out_features is not None

    def splits_evenly(self, form: str, tp: int) -> bool:
        """Whether ``form`` (``split_out`` or ``split_in``) gives each of ``tp`` ranks an equal shard of this layer: one
        without weights runs on the split activations; one with weights needs its shape known and the features the
        form shards (its outputs, or its inputs) a multiple of ``tp``."""
        if self.param_count == 0:
            return True
        if self.in_features is None or self.out_features is None:
            return False
        return (self.out_features if form == "split_out" else self.in_features) % tp == 0

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
                                  "backward_fixed_s", "trainable_count",
                                  "forward_replicated_s", "backward_replicated_s")))
        if self.output_shape is not None:
            d["output_shape"] = list(self.output_shape)
        if self.block is not None:
            d["block"] = self.block.to_dict()
        if self.batch_times:
            d["batch_times"] = [point.to_dict() for point in self.batch_times]
        if self.batch_stats:
            d["batch_stats"] = True
        if self.tensor_counts:
            d["tensor_counts"] = list(self.tensor_counts)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "layer") -> LayerProfile:
        shape = _get(d, "output_shape", where)
        block = _get(d, "block", where)
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
            block=None if block is None else BlockShape.from_dict(block, f"{where}.block"),
            batch_times=tuple(BatchTimes.from_dict(item, f"{where}.batch_times[{i}]")
                              for i, item in enumerate(_opt_list(d, "batch_times", where))),
            trainable_count=None if _get(d, "trainable_count", where) is None else _int(d, "trainable_count", where),
            batch_stats=_bool(d, "batch_stats", where, False),
            tensor_counts=_tensor_counts(d, where),
            forward_replicated_s=_opt_num(d, "forward_replicated_s", where),
            backward_replicated_s=_opt_num(d, "backward_replicated_s", where),
        )
        if layer.trainable_count is not None and layer.trainable_count > layer.param_count:
            raise FormatError(f"{where}.trainable_count ({layer.trainable_count}) must lie in [0, param_count="
                              f"{layer.param_count}]", "trainable_count counts the layer's parameters that train")
        if layer.tensor_counts and sum(layer.tensor_counts) != layer.trainable_params:
            raise FormatError(f"{where}.tensor_counts add up to {sum(layer.tensor_counts)}, not the layer's "
                              f"{layer.trainable_params} trainable parameters",
                              "list every trainable tensor's elements, or drop tensor_counts")
        _check_part(where, "forward_fixed_s", layer.forward_fixed_s, "forward_s", layer.forward_s)
        _check_part(where, "backward_fixed_s", layer.backward_fixed_s, "backward_s", layer.backward_s)
        _check_part(where, "backward_weight_s", layer.backward_weight_s, "backward_s", layer.backward_s)
        _check_part(where, "forward_replicated_s", layer.forward_replicated_s, "forward_s", layer.forward_s)
        _check_part(where, "backward_replicated_s", layer.backward_replicated_s, "backward_s", layer.backward_s)
        return layer


def _share(part: float | None, whole: float) -> float:
    return 0.0 if part is None or whole <= 0 else min(part / whole, 1.0)


def _tensor_counts(d: Mapping[str, Any], where: str) -> tuple[int, ...]:
    """A layer's ``tensor_counts``: positive whole numbers, largest first (absent: none known)."""
    counts = _opt_list(d, "tensor_counts", where)
    if not all(is_whole(c, 1) for c in counts) or list(counts) != sorted(counts, reverse=True):
        raise FormatError(f"{where}.tensor_counts must list positive whole numbers, largest first, got "
                          f"{counts!r:.80}", "fix 'tensor_counts', or drop it")
    return tuple(counts)


@dataclass(frozen=True)
class ModelProfile:
    """Per-layer costs of a model at one batch size, measured or analytic (``mode``).

    Times hold for a device of ``device_flops`` peak FLOP/s. ``input_shape`` is the model
    input without the batch dimension; ``input_bytes`` the whole batch's input size.
    ``meta`` holds facts about how the profile was made (not used by the algorithms).
    ``loss_s``: forward+backward of the training loss (cross-entropy over the last
    dimension) on the last layer's output for the whole batch, with ``loss_fixed_s`` its
    part that does not shrink with the batch; the last stage pays it per micro-batch. None
    means unknown (treated as 0). ``min_batch``: the fewest samples the model trains on at a time (a
    batch norm over ``(N, C)`` needs 2, a shape fixed to the batch all of it): every data-parallel rank's
    micro-batch holds at least as many (planner.runnable); 1 where the profile does not say.
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
    min_batch: int = 1

    def __post_init__(self) -> None:
        _check_batch_times(self, f"profile of {self.model!r}")
        if not 1 <= self.min_batch <= self.batch_size:
            raise FormatError(f"profile of {self.model!r}: min_batch {self.min_batch} is not a batch from 1 to the "
                              f"profile's batch_size {self.batch_size}", "profile the model again (planner profile)")

    @property
    def param_count(self) -> int:
        return sum(layer.param_count for layer in self.layers)

    @property
    def param_bytes(self) -> int:
        return sum(layer.param_bytes for layer in self.layers)

    @property
    def head_start(self) -> int:
        """Index of the first layer after the last transformer block (the final norm and the logits
        head, which full recomputation leaves out: ``recomputed_layers``); ``len(layers)`` when no
        layer is a block."""
        blocks = [i for i, layer in enumerate(self.layers) if layer.block is not None]
        return blocks[-1] + 1 if blocks else len(self.layers)

    @property
    def has_blocks(self) -> bool:
        """Whether any layer is a transformer block (it carries a ``BlockShape``)."""
        return any(layer.block is not None for layer in self.layers)

    def splits_sequence(self, tp: int) -> bool:
        """Whether sequence parallelism over a tensor group of ``tp`` cuts every transformer block's sequence into
        whole, equal shares (Megatron-LM's scatter along the sequence asserts it, the torch export refuses an uneven
        one, and torchtitan's ``SequenceParallel`` assumes it): 7 tokens do not split over tp 2."""
        return self.uneven_sequence(tp) is None

    def uneven_sequence(self, tp: int) -> int | None:
        """The first transformer block's sequence length (tokens) that ``tp`` does not divide; None where all split."""
        return next((layer.block.seq_len for layer in self.layers
                     if layer.block is not None and layer.block.seq_len % tp), None)

    @property
    def blockwise_recompute(self) -> bool:
        """Whether full recomputation checkpoints each layer on its own, keeping every layer's input and
        redoing one layer at a time in backward (a model with transformer blocks: Megatron-LM's
        ``--recompute-granularity full --recompute-method uniform --recompute-num-layers 1``, torchtitan's
        full activation checkpointing, Korthikanti et al. 2022's ``2 s b h`` per layer), rather than the stage
        as one region that keeps only its input and redoes all its layers at once (GPipe's
        re-materialisation, Huang et al. 2019: a model of many small layers, whose inputs add up to most of
        what they save)."""
        return self.has_blocks

    def recomputed_layers(self, first: int, end: int) -> int:
        """How many of stage ``[first, end)``'s layers, from its first, full recomputation checkpoints:
        all of them, but for the layers after the model's last transformer block, whose forward is
        not redone (Megatron-LM's and torchtitan's full activation checkpointing wrap the transformer
        layers only; the logits head would be recomputed for little memory)."""
        return max(0, min(end, self.head_start) - first)

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
        if self.min_batch > 1:
            d["min_batch"] = self.min_batch
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "profile") -> ModelProfile:
        doc = check_kind(d, "profile", source)
        layers = tuple(
            LayerProfile.from_dict(item, f"{source}: layers[{i}]")
            for i, item in enumerate(_list(doc, "layers", source))
        )
        ties = tuple(Tie.from_dict(t, f"{source}: ties[{i}]") for i, t in enumerate(_opt_list(doc, "ties", source)))
        for i, tie in enumerate(ties):
            if max(tie.layers) >= len(layers):
                raise FormatError(f"{source}: ties[{i}] names layer {max(tie.layers)}, the model has "
                                  f"{len(layers)} layers", "fix the tie's layer indices")
        shape = doc.get("input_shape")
        meta = doc.get("meta") or {}
        profile = cls(
            model=_str(doc, "model", source),
            batch_size=_int(doc, "batch_size", source, positive=True),
            dtype=_profile_dtype(doc, source),
            mode=_profile_mode(doc, source),
            device=_str(doc, "device", source),
            device_flops=_num(doc, "device_flops", source, positive=True),
            layers=layers,
            input_shape=None if shape is None else _shape(shape, f"{source}.input_shape"),
            input_bytes=_int(doc, "input_bytes", source) if "input_bytes" in doc else 0,
            ties=ties,
            meta=dict(meta) if isinstance(meta, Mapping) else {},
            loss_s=_opt_num(doc, "loss_s", source),
            loss_fixed_s=_opt_num(doc, "loss_fixed_s", source),
            min_batch=_int(doc, "min_batch", source, positive=True) if "min_batch" in doc else 1,
        )
        if profile.loss_fixed_s is not None:
            _check_part(source, "loss_fixed_s", profile.loss_fixed_s, "loss_s", profile.loss_s or 0.0)
        if not any(layer.forward_s > 0 or layer.backward_s > 0 for layer in layers):
            raise FormatError(f"{source}: every one of the {len(layers)} layers takes 0 s forward and backward: "
                              "there is no work to place", "profile the model again (planner profile)")
        return profile


def _check_batch_times(profile: ModelProfile, source: str) -> None:
    """Every layer's ``batch_times`` at the same batches, each below the profile's, largest first, or none."""
    batches = [tuple(p.batch for p in layer.batch_times) for layer in profile.layers]
    if not any(batches):
        return
    first = batches[0]
    for i, got in enumerate(batches):
        if got != first:
            raise FormatError(f"{source}: layers[{i}].batch_times are at batches {list(got)}, layers[0]'s at "
                              f"{list(first)}", "measure every layer at the same batches, or drop batch_times")
    if any(b >= profile.batch_size for b in first) or list(first) != sorted(set(first), reverse=True):
        raise FormatError(f"{source}: batch_times at batches {list(first)}: each must be below the batch size "
                          f"{profile.batch_size}, distinct, largest first", "fix or drop batch_times")

"""One layer of profile.json as a value: its costs for the whole batch (LayerProfile; its parts in planner.ir.parts)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from planner.errors import FormatError, is_whole
from planner.ir._fields import (
    _bool,
    _check_part,
    _get,
    _int,
    _num,
    _opt_int,
    _opt_list,
    _opt_num,
    _optional,
    _shape,
    _str,
    _wholes,
)
from planner.ir.parts import BatchTimes, BlockShape


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
        _check_counts(layer, where)
        _check_part(where, "forward_fixed_s", layer.forward_fixed_s, "forward_s", layer.forward_s)
        _check_part(where, "backward_fixed_s", layer.backward_fixed_s, "backward_s", layer.backward_s)
        _check_part(where, "backward_weight_s", layer.backward_weight_s, "backward_s", layer.backward_s)
        _check_part(where, "forward_replicated_s", layer.forward_replicated_s, "forward_s", layer.forward_s)
        _check_part(where, "backward_replicated_s", layer.backward_replicated_s, "backward_s", layer.backward_s)
        return layer


def _share(part: float | None, whole: float) -> float:
    return 0.0 if part is None or whole <= 0 else min(part / whole, 1.0)


def _check_counts(layer: LayerProfile, where: str) -> None:
    """The layer's parameter counts agree: bytes for its parameters, trainable ones among them, tensors adding up."""
    if layer.param_count and not layer.param_bytes:
        raise FormatError(f"{where}.param_bytes is 0 but param_count is {layer.param_count}: its weights would take "
                          "no memory", "give the weights' bytes (param_count x bytes per element), or profile the "
                          "model again")
    if layer.trainable_count is not None and layer.trainable_count > layer.param_count:
        raise FormatError(f"{where}.trainable_count ({layer.trainable_count}) must lie in [0, param_count="
                          f"{layer.param_count}]", "trainable_count counts the layer's parameters that train")
    if layer.tensor_counts and sum(layer.tensor_counts) != layer.trainable_params:
        raise FormatError(f"{where}.tensor_counts add up to {sum(layer.tensor_counts)}, not the layer's "
                          f"{layer.trainable_params} trainable parameters",
                          "list every trainable tensor's elements, or drop tensor_counts")


def _tensor_counts(d: Mapping[str, Any], where: str) -> tuple[int, ...]:
    """A layer's ``tensor_counts``: positive whole numbers, largest first (absent: none known)."""
    counts = _wholes(_opt_list(d, "tensor_counts", where))
    if not all(is_whole(c, 1) for c in counts) or list(counts) != sorted(counts, reverse=True):
        raise FormatError(f"{where}.tensor_counts must list positive whole numbers, largest first, got "
                          f"{counts!r:.80}", "fix 'tensor_counts', or drop it")
    return tuple(counts)

"""profile.json as values: a model's per-layer costs (ModelProfile; a layer's in planner.ir.layer, their parts in
planner.ir.parts)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from planner.errors import FormatError
from planner.ir._fields import (
    _check_part,
    _int,
    _list,
    _num,
    _opt_list,
    _opt_num,
    _optional,
    _shape,
    _str,
)
from planner.ir.layer import LayerProfile
from planner.ir.parts import Tie
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
        _check_ties(self.ties, self.layers, f"profile of {self.model!r}")
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
        ties = _ties(doc, source)
        shape = doc.get("input_shape")
        meta = doc.get("meta") or {}
        fields: dict[str, Any] = dict(
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
        try:
            profile = cls(**fields)
        except FormatError as exc:  # the checks across fields (min_batch, batch_times) know no file
            raise FormatError(f"{source}: {exc.cause}", exc.hint) from None
        if profile.loss_fixed_s is not None:
            _check_part(source, "loss_fixed_s", profile.loss_fixed_s, "loss_s", profile.loss_s or 0.0)
        if not any(layer.forward_s > 0 or layer.backward_s > 0 for layer in layers):
            raise FormatError(f"{source}: every one of the {len(layers)} layers takes 0 s forward and backward: "
                              "there is no work to place", "profile the model again (planner profile)")
        return profile


def _ties(doc: Mapping[str, Any], source: str) -> tuple[Tie, ...]:
    """The profile's ties as read; :func:`_check_ties` judges them against the layers."""
    return tuple(Tie.from_dict(t, f"{source}: ties[{i}]") for i, t in enumerate(_opt_list(doc, "ties", source)))


def _check_ties(ties: tuple[Tie, ...], layers: tuple[LayerProfile, ...], source: str) -> None:
    """Each tie names layers of the model and is no larger than the layer it is counted in (its first): the cost
    model charges its copies as that layer's share (planner.costmodel.stage.tie_shares). The one home of the
    rule, for a file's profile and one built in Python alike."""
    for i, tie in enumerate(ties):
        if max(tie.layers) >= len(layers):
            raise FormatError(f"{source}: ties[{i}] names layer {max(tie.layers)}, the model has "
                              f"{len(layers)} layers", "fix the tie's layer indices")
        owner = layers[tie.layers[0]]
        if tie.param_count > owner.param_count or tie.param_bytes > owner.param_bytes:
            raise FormatError(f"{source}: ties[{i}] ({tie.param_count} parameters, {tie.param_bytes} bytes) is "
                              f"larger than layer {tie.layers[0]} it is counted in ({owner.param_count}, "
                              f"{owner.param_bytes})", "a tie's parameters are counted in its first layer: fix "
                              "the tie's param_count and param_bytes, or that layer's")


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

"""The parts of a profile's layers: a transformer block's shape, times at smaller batches, a tied weight."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from planner.errors import FormatError
from planner.ir._fields import _bool, _int, _list, _num, _str, _wholes

UNSHARDABLE = ("fused projections, q/k norms over all heads, q/k/v clipped in place, a mixture of experts' routed "
               "experts, or attention and MLP code other than a Llama-family decoder's")
"""Why a block may not be shardable (``BlockShape.shardable``), for messages."""


@dataclass(frozen=True)
class BlockShape:
    """What tensor parallelism needs to know of a transformer block (Megatron-LM; Korthikanti et al. 2022).

    ``hidden`` h, attention ``heads`` a, ``kv_heads`` (grouped-query attention: fewer than
    ``heads``), ``ffn`` the MLP's inner size, ``seq_len`` s the tokens per sample, ``gated``
    whether the MLP has three matrices (SwiGLU, Llama) rather than two (GPT-2, BERT).
    ``attention_saved``: whether the layer's profiled ``saved_bytes`` hold the attention weights
    (Korthikanti et al.'s ``5 a s^2 b``): attention computed with matmuls and softmax keeps them, a
    fused kernel (SDPA's FlashAttention or memory-efficient kernels, which the profiler runs) does not
    (``planner.profiler.fused``); absent from a file: True, as profiles written before it counted.
    ``head_dim``: each head's width where it is not ``hidden / heads`` (Qwen3, a Llama config's own
    ``head_dim``); absent: ``hidden / heads``, which the heads must then divide. ``shardable``: whether the
    planner's tensor parallelism can shard the block as Megatron-LM does (separate q/k/v and gate/up projections,
    norms per head at most); False for fused projections (Phi-3's ``qkv_proj`` and ``gate_up_proj``, GLM's
    ``gate_up_proj``) or q/k norms over all heads (OLMo 2), and the others :data:`UNSHARDABLE` names: such blocks
    run data and pipeline parallel only; absent from a file: True.
    """

    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    seq_len: int
    gated: bool = False
    attention_saved: bool = True
    head_dim: int | None = None
    shardable: bool = True

    def splits_over(self, tp: int) -> bool:
        """Whether a tensor group of ``tp`` can run the block in the ``tp`` form: 1, or a shardable block whose heads
        and KV heads ``tp`` divides (Megatron shards whole heads)."""
        return tp == 1 or (self.shardable and self.heads % tp == 0 and self.kv_heads % tp == 0)

    @property
    def attention_width(self) -> int:
        """The query heads' width together, ``heads x head_dim`` (``hidden`` unless ``head_dim`` says otherwise)."""
        return self.hidden if self.head_dim is None else self.heads * self.head_dim

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"hidden": self.hidden, "heads": self.heads, "kv_heads": self.kv_heads, "ffn": self.ffn,
                             "seq_len": self.seq_len, "gated": self.gated, "attention_saved": self.attention_saved}
        if self.head_dim is not None:
            d["head_dim"] = self.head_dim
        if not self.shardable:
            d["shardable"] = False
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "block") -> BlockShape:
        shape = cls(_int(d, "hidden", where, positive=True), _int(d, "heads", where, positive=True),
                    _int(d, "kv_heads", where, positive=True), _int(d, "ffn", where, positive=True),
                    _int(d, "seq_len", where, positive=True), _bool(d, "gated", where, False),
                    _bool(d, "attention_saved", where, True),
                    _int(d, "head_dim", where, positive=True) if d.get("head_dim") is not None else None,
                    _bool(d, "shardable", where, True))
        if shape.heads % shape.kv_heads or (shape.head_dim is None and shape.hidden % shape.heads):
            raise FormatError(f"{where}: heads {shape.heads} must be a multiple of kv_heads {shape.kv_heads} and "
                              f"divide hidden {shape.hidden} (or give head_dim)", "fix the block's shape")
        return shape


@dataclass(frozen=True)
class BatchTimes:
    """A layer's forward and backward seconds measured at ``batch`` samples, fewer than its profile's."""

    batch: int
    forward_s: float
    backward_s: float

    def to_dict(self) -> dict[str, Any]:
        return {"batch": self.batch, "forward_s": self.forward_s, "backward_s": self.backward_s}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "batch_times") -> BatchTimes:
        return cls(_int(d, "batch", where, positive=True), _num(d, "forward_s", where), _num(d, "backward_s", where))


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
        layers = _wholes(_list(d, "layers", where))
        if len(layers) < 2 or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in layers):
            raise FormatError(f"{where}.layers must list two or more layer indices, got {layers!r}", "fix 'layers'")
        if len(set(layers)) != len(layers):
            raise FormatError(f"{where}.layers lists a layer twice: {layers!r:.80}",
                              "list each layer that shares the parameter once")
        return cls(_str(d, "name", where), tuple(layers), _int(d, "param_count", where),
                   _int(d, "param_bytes", where))

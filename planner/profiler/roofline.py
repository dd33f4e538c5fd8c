"""The analytic roofline: a layer's time from its kernels' shapes, FLOPs and bytes on a named GPU.

Every aten op a layer runs (forward, and backward in a second walk) is one kernel, seen on the
meta device by a ``TorchDispatchMode``; views (``op.is_view``, ``_unsafe_view``) and
allocations (``empty*``) launch none. Each kernel costs (Williams, Waterman and Patterson,
"Roofline", CACM 2009, plus a launch cost)::

    time = max(flops / (peak * eff(tiles)), bytes / bandwidth) + launch_s

- ``flops``: torch's own formulas (``torch.utils.flop_counter``) for matrix multiplies,
  convolutions (forward and backward) and attention; every other op has 0 and is memory-bound.
- ``bytes``: every tensor the kernel reads and writes, each counted at most at its storage's
  size (an expanded view is read once); an embedding lookup reads only the rows it gathers.
- ``eff(tiles) = share * tiles / (tiles + sm_count / 2)``: ``share`` is the GPU's measured
  large-GEMM share of peak for the number format (``planner.gpus``); the second factor is the
  wave-quantisation efficiency of NVIDIA's "Matrix Multiplication Background User's Guide"
  (section 3.2: a GEMM's output tiles run in waves of one tile per SM, the last wave part
  full), averaged over where the last wave ends, so half a wave is lost on average; ``tiles``
  is the op's largest tensor in 128 x 128 tiles (the guide's typical cuBLAS tile, section 2.3;
  the largest tensor rather than the output so that split-K kernels for small outputs count
  their parallel work). Small GEMMs thus reach a smaller share of peak, large ones saturate at
  ``share``; equivalently each GEMM pays ``sm_count/2`` tiles' worth of extra time.
- ``F.scaled_dot_product_attention`` runs fused on a GPU (FlashAttention or memory-efficient
  attention), so the roofline replaces it by one kernel each way: FLOPs ``2 b h s_q s_k (d +
  d_v)`` forward and ``2 b h s_q s_k (3 d + 2 d_v)`` backward (QK^T recomputed: Dao,
  FlashAttention-2, 2023; torch's ``sdpa_flop_count``/``sdpa_backward_flop_count``), halved
  for ``is_causal`` (blocks above the diagonal are skipped), at the GPU's fused-attention share
  of peak (``planner.gpus``: FlashAttention-2's published figures) on the same wave curve,
  bytes Q, K, V, O (and their gradients and dO backward) plus the mask; the S x S scores are
  never materialised. Attention written with matmuls and softmax is counted op by op: its
  scores are memory-bound.

- A matrix product (``mm``, ``bmm``, ``addmm``, ``baddbmm``) with M, K or N not a multiple of 16
  bytes computes at ``unaligned_share`` of that rate (``planner.gpus``: measured on an H200).

A layer's walk (forward, or backward) takes the sum over its kernels, or its kernels times the
host's ``host_s`` where that is longer: eagerly run, a layer of many small kernels is bound by
the host that issues them (``planner.gpus``). The loss (:func:`loss_roofline`) is timed the same
way. Gradients are zeroed around each walk, so no
gradient-accumulation kernel is counted (the cost model charges accumulation itself). The
FLOPs a profile records stay those of the instrumented pass (``planner.profiler.measure``);
the roofline only times.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from planner.export.losses import cross_entropy_loss
from planner.gpus import TILE_ELEMENTS, Roofline
from planner.profiler.flops import attention_flops as count_attention_flops
from planner.profiler.flops import op_flops
from planner.profiler.fused import AttentionMode
from planner.profiler.measure import _backward_walk, _forward_walk, _zero_grads, fit_fixed, small_batch_of
from planner.profiler.passes import has_logits
from planner.profiler.repeats import fact_sources

_aten = torch.ops.aten
_NO_KERNEL = {_aten._unsafe_view.default, _aten.empty.memory_format, _aten.empty_like.default,
              _aten.empty_strided.default, _aten.new_empty.default, _aten.new_empty_strided.default,
              _aten.lift_fresh.default, _aten.detach.default}


Stream = tuple[int, frozenset[int]]
"""What a kernel without FLOPs touches: its largest tensor's elements, and the last sizes of its tensors."""


@dataclass
class KernelTally:
    """What one layer's kernels cost: seconds, of which memory-bound seconds, and launches; ``streams``: each kernel
    without FLOPs as (seconds, :data:`Stream`), for :meth:`replicated_s`."""

    time_s: float = 0.0
    memory_s: float = 0.0
    launches: int = 0
    streams: list[tuple[float, Stream]] = field(default_factory=list)

    def add(self, roofline: Roofline, flops: float, bytes_moved: float, tiles: float, attention: bool = False,
            aligned: bool = True, stream: Stream | None = None) -> None:
        seconds, memory_bound = roofline.kernel(flops, bytes_moved, tiles, attention, aligned)
        self.time_s += seconds
        self.memory_s += seconds if memory_bound else 0.0
        self.launches += 1
        if stream is not None and flops == 0:
            self.streams.append((seconds, stream))

    def seconds(self, roofline: Roofline) -> float:
        """The walk's time: its kernels' on the GPU, or the host's per kernel if that is longer (host-bound)."""
        return max(self.time_s, self.launches * roofline.host_s)

    def replicated_s(self, roofline: Roofline, elements: int, width: int) -> float:
        """The seconds Megatron's tensor parallelism without sequence parallelism runs whole on every rank: the
        kernels without FLOPs on the layer's ``elements``-element output stream of last size ``width`` (norms,
        residual adds, dropouts: every tensor's last size ``width`` or 1); all of it where the host binds (a rank
        issues every kernel whatever its share)."""
        if self.launches * roofline.host_s >= self.time_s:
            return self.seconds(roofline)
        return sum(s for s, (largest, lasts) in self.streams if largest == elements and lasts <= {width, 1})


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _bytes(t: torch.Tensor) -> int:
    """Bytes a kernel touches in ``t``: its logical size, at most its storage (expanded views)."""
    logical = t.numel() * t.element_size()
    try:
        return min(logical, int(t.untyped_storage().nbytes()))
    except (RuntimeError, NotImplementedError):
        return logical


def _stream(tensors: Sequence[torch.Tensor]) -> Stream:
    return (max((t.numel() for t in tensors), default=0),
            frozenset(int(t.shape[-1]) for t in tensors if t.dim() > 0 and t.numel() > 1))


def _tiles(tensors: Sequence[torch.Tensor]) -> float:
    return max((t.numel() for t in tensors), default=0) / TILE_ELEMENTS


_PRODUCTS = {_aten.mm.default: 0, _aten.bmm.default: 0, _aten.addmm.default: 1, _aten.baddbmm.default: 1}
"""Matrix products, by the position of their first factor (``addmm``/``baddbmm`` take the added term first)."""


def aligned(func: Any, args: Sequence[Any]) -> bool:
    """Whether a matrix product's M, K and N are multiples of 16 bytes (other ops: True; module docstring)."""
    first = _PRODUCTS.get(func)
    if first is None:
        return True
    a, b = args[first], args[first + 1]
    grid = max(1, 16 // a.element_size())
    return all(int(n) % grid == 0 for n in (*a.shape[-2:], b.shape[-1]))


class _Kernels(TorchDispatchMode):
    """Adds every kernel an op runs to ``tally`` (set per layer by the walk)."""

    def __init__(self, roofline: Roofline) -> None:
        super().__init__()
        self.roofline = roofline
        self.tally = KernelTally()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.is_view or func in _NO_KERNEL:
            return out
        inputs, outputs = _tensors((args, kwargs)), _tensors(out)
        if func is _aten.embedding.default:  # a gather reads the rows it returns, not the table
            inputs = inputs[1:] + outputs
        moved = sum(_bytes(t) for t in inputs) + sum(_bytes(t) for t in outputs)
        self.tally.add(self.roofline, op_flops(func, args, kwargs, out), moved, _tiles(inputs + outputs),
                       aligned=aligned(func, args), stream=_stream(inputs + outputs))
        return out


class _FusedAttention(torch.autograd.Function):
    """SDPA as one fused kernel each way, costed by the roofline (module docstring); no compute."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                causal: bool, kernels: _Kernels) -> torch.Tensor:
        out = q.new_empty((*q.shape[:-1], v.shape[-1]))
        ctx.kernels, ctx.causal = kernels, causal
        ctx.shapes = (q, k, v, out, mask)
        _attention_kernel(kernels, [q, k, v, out, mask], causal, backward=False)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        q, k, v, out, mask = ctx.shapes
        grads = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
        _attention_kernel(ctx.kernels, [q, k, v, out, mask, grad, *grads], ctx.causal, backward=True)
        return (*grads, None, None, None)


def attention_flops(q_shape: Sequence[int], k_shape: Sequence[int], v_shape: Sequence[int], causal: bool,
                    backward: bool) -> float:
    """FLOPs of fused attention (planner.profiler.flops.attention_flops); causal halves them (the blocks above
    the diagonal are skipped)."""
    flops = float(count_attention_flops(q_shape, k_shape, v_shape, backward))
    return flops / 2 if causal else flops


def _attention_kernel(kernels: _Kernels, tensors: list[torch.Tensor | None], causal: bool, backward: bool) -> None:
    present = [t for t in tensors if t is not None]
    q, k, v = present[:3]
    flops = attention_flops(q.shape, k.shape, v.shape, causal, backward)
    kernels.tally.add(kernels.roofline, flops, sum(_bytes(t) for t in present), _tiles(present), attention=True)


class _AttentionAsKernel(AttentionMode):
    """Routes ``F.scaled_dot_product_attention`` (nested in another torch function too) to :class:`_FusedAttention`."""

    def __init__(self, kernels: _Kernels) -> None:
        super().__init__()
        self.kernels = kernels

    def route(self, given: dict[str, Any], sdpa: Callable[..., Any]) -> Any:
        return _FusedAttention.apply(given["query"], given["key"], given["value"], given.get("attn_mask"),
                                     bool(given.get("is_causal", False)), self.kernels)


@dataclass(frozen=True)
class LayerRoofline:
    """Per layer: forward and backward seconds, the memory-bound seconds among them, the kernels, and the seconds
    tensor parallelism without sequence parallelism runs whole on every rank (:meth:`KernelTally.replicated_s`)."""

    forward_s: list[float]
    backward_s: list[float]
    memory_s: list[float] = field(default_factory=list)
    launches: list[int] = field(default_factory=list)
    forward_replicated_s: list[float] = field(default_factory=list)
    backward_replicated_s: list[float] = field(default_factory=list)


class _Meter:
    """Runs one layer's walk (forward, or backward) under ``kernels`` and keeps its tallies' facts per layer."""

    def __init__(self, kernels: _Kernels, n: int) -> None:
        self.kernels, self.launches = kernels, [0] * n
        self.memory_s = {"forward": [0.0] * n, "backward": [0.0] * n}
        self.replicated_s = {"forward": [0.0] * n, "backward": [0.0] * n}
        self.streams: list[tuple[int, int]] = [(0, 0)] * n

    def walk(self, direction: str) -> Callable[[int, Callable[[], Any]], tuple[Any, float]]:
        def run_layer(i: int, run: Callable[[], Any]) -> tuple[Any, float]:
            kernels, roofline = self.kernels, self.kernels.roofline
            kernels.tally = KernelTally()
            with _AttentionAsKernel(kernels), kernels:
                result = run()
            if isinstance(result, torch.Tensor) and result.dim() > 0:  # forward: the layer's output stream
                self.streams[i] = (result.numel(), int(result.shape[-1]))
            self.memory_s[direction][i] = kernels.tally.memory_s
            self.replicated_s[direction][i] = kernels.tally.replicated_s(roofline, *self.streams[i])
            self.launches[i] += kernels.tally.launches
            return result, kernels.tally.seconds(roofline)
        return run_layer


def roofline_pass(layers: Sequence[nn.Module], x: torch.Tensor, roofline: Roofline,
                  once_per_kind: bool = True) -> LayerRoofline:
    """Each layer's forward and backward seconds under ``roofline`` (layers on the meta device).

    With ``once_per_kind``, identical consecutive layers are walked once (``planner.profiler.repeats``),
    unless a walked layer of such a run changes its input's shape (then every layer is walked)."""
    source = fact_sources(layers) if once_per_kind else list(range(len(layers)))
    walked = [i for i, s in enumerate(source) if s == i]
    meter = _Meter(_Kernels(roofline), len(walked))
    params = [p for layer in layers for p in layer.parameters()]
    _zero_grads(params)  # no gradient accumulation kernels: the cost model charges those itself
    with torch.enable_grad():
        fwd, inputs, outputs = _forward_walk([layers[i] for i in walked], x, meter.walk("forward"))
        bwd = _backward_walk(inputs, outputs, meter.walk("backward"))
    _zero_grads(params)
    slot = {layer: j for j, layer in enumerate(walked)}
    reused = {slot[s] for i, s in enumerate(source) if s != i}
    if any(j == 0 or outputs[j].shape != outputs[j - 1].shape for j in reused):
        return roofline_pass(layers, x, roofline, once_per_kind=False)
    pick = [slot[s] for s in source]
    memory, replicated = meter.memory_s, meter.replicated_s
    return LayerRoofline([fwd[j] for j in pick], [bwd[j] for j in pick],
                         [memory["forward"][j] + memory["backward"][j] for j in pick],
                         [meter.launches[j] for j in pick],
                         [replicated["forward"][j] for j in pick], [replicated["backward"][j] for j in pick])


@dataclass(frozen=True)
class RooflineProfile:
    """Roofline times at the profile's batch, and the fixed parts fitted through a smaller batch."""

    full: LayerRoofline
    small_batch: int | None
    forward_fixed_s: list[float | None]
    backward_fixed_s: list[float | None]


def profile_roofline(layers: Sequence[nn.Module], x: torch.Tensor, roofline: Roofline) -> RooflineProfile:
    """The roofline at ``x``'s batch B and at B/4 (``measure.small_batch_of``), and per layer the fixed
    part of ``t(b) = fixed + (b/B)(t(B) - fixed)`` through both (``measure.fit_fixed``; None where
    B is 1 or the layers refuse the smaller batch), the law the cost model scales by."""
    full = roofline_pass(layers, x, roofline)
    batch = int(x.shape[0])
    small = small_batch_of(batch)
    part = None
    if small is not None:
        try:
            part = roofline_pass(layers, x[:small], roofline)
        except (RuntimeError, ValueError, IndexError, TypeError):  # a traced shape fixed to the batch
            part = None
    if part is None or small is None:
        nones: list[float | None] = [None] * len(layers)
        return RooflineProfile(full, None, nones, list(nones))
    return RooflineProfile(
        full, small,
        [fit_fixed(t, p, batch, small) for t, p in zip(full.forward_s, part.forward_s, strict=True)],
        [fit_fixed(t, p, batch, small) for t, p in zip(full.backward_s, part.backward_s, strict=True)])


def roofline_meta(roofline: Roofline, prof: RooflineProfile, gpu: str, number_format: str) -> dict[str, Any]:
    """What a profile's ``meta`` records about its roofline: the constants and the memory-bound shares."""
    full = prof.full
    totals = [f + b for f, b in zip(full.forward_s, full.backward_s, strict=True)]
    return {
        "efficiency": None,
        "time_formula": "per walk, max(sum over kernels of max(flops / (peak * eff(tiles) * unaligned), "
                        "bytes / bandwidth) + launch_s, kernels * host_s)",
        "roofline": {
            "gpu": gpu, "number_format": number_format, "peak_flops": roofline.peak_flops,
            "gemm_share": roofline.gemm_share, "attention_share": roofline.attention_share,
            "sm_count": roofline.sm_count,
            "bandwidth_Bps": roofline.bandwidth_Bps, "launch_s": roofline.launch_s, "host_s": roofline.host_s,
            "unaligned_share": roofline.unaligned_share,
            "memory_bound_share": sum(full.memory_s) / sum(totals) if sum(totals) > 0 else 0.0,
            "layer_memory_bound_share": [m / t if t > 0 else 0.0 for m, t in zip(full.memory_s, totals, strict=True)],
            "layer_launches": list(full.launches),
        },
        "fixed_cost_fit_batch": prof.small_batch,
    }


def _loss_walk(shape: Sequence[int], dtype: torch.dtype, roofline: Roofline) -> float:
    """Seconds of cross-entropy forward and backward over meta logits of ``shape``: the engines' loss
    (planner.export.losses.cross_entropy_loss, fp32 over the last dimension), as the measured pass times it."""
    logits = torch.empty(tuple(shape), dtype=dtype, device="meta", requires_grad=True)
    target = torch.zeros(tuple(shape[:-1]), dtype=torch.long, device="meta")
    kernels = _Kernels(roofline)
    with torch.enable_grad(), kernels:
        cross_entropy_loss(logits, target).backward()
    return kernels.tally.seconds(roofline)


def loss_roofline(shape: Sequence[int], dtype: torch.dtype, roofline: Roofline) -> tuple[float | None, float | None]:
    """(loss_s, loss_fixed_s) of the training loss on an output of ``shape`` by the roofline, the fixed part fitted
    through a quarter of the batch as for layers; (None, None) where the output is no float logits."""
    if not has_logits(shape, dtype):
        return None, None
    whole = _loss_walk(shape, dtype, roofline)
    small = small_batch_of(int(shape[0]))
    if small is None:
        return whole, None
    return whole, fit_fixed(whole, _loss_walk((small, *shape[1:]), dtype, roofline), int(shape[0]), small)

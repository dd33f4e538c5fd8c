"""A Megatron-LM GPT layer timed kernel by kernel by the roofline, per tensor-parallel rank (no torch).

``planner profile --mode analytic`` times the kernels a torch model runs on the meta device
(``planner.profiler.roofline``). Published runs used Megatron-LM's own kernels, so this module
writes them down in closed form for one transformer layer on one rank of a tensor group of ``t``
(Shoeybi et al. 2019, section 3: attention heads and the MLP split column- then row-parallel;
without sequence parallelism norms, dropouts and residual adds run whole on every rank, with it
on ``s/t`` of the sequence: Korthikanti et al. 2022, section 4.2.2), micro-
batch ``b`` of ``s`` tokens, hidden ``h``, ``a`` heads, MLP width ``f``, 16-bit values:

- GEMMs: QKV ``(sb, h) x (h, 3h/t)``, output projection ``(sb, h/t) x (h/t, h)``, MLP
  ``(sb, h) x (h, f/t)`` and ``(sb, f/t) x (f/t, h)``; the attention core as batched GEMMs over
  ``b a/t`` heads of ``(s, h/a) x (h/a, s)`` and ``(s, s) x (s, h/a)``: the scores are
  materialised (no FlashAttention in 2021-22).
- Memory-bound kernels, at the GPU's bandwidth: the two LayerNorms (read and write ``sbh``), the
  fused scale+mask+softmax over the scores (read and write), dropout on the probabilities (read,
  write and a one-byte mask), fused bias+GeLU on the MLP's ``sb f/t`` (read and write) and two
  fused bias+dropout+add (read two, write one, a one-byte mask); Megatron's fused kernels are
  those of SC'21 (Narayanan et al. 2021, section 4.2). Without dropout (``dropout=False``, as
  BLOOM trained) the dropout kernels are not run and the adds move two reads and a write.
- The logits head: ``(sb, h) x (h, V/t)`` and the vocabulary-parallel cross-entropy as three
  passes over the ``sb V/t`` logits in fp32 (maximum, exponentials and sum, gradient).

Each kernel costs ``max(FLOPs / (peak x share x wave(tiles)), bytes / bandwidth) + launch``
(``planner.gpus.Roofline``, the analytic profiler's law). Backward is twice forward: each GEMM
becomes two (input and weight gradients) and each memory-bound kernel reads its saved input and
the incoming gradient and writes one. The GEMM share is an argument: the catalogue's large-GEMM
share (Bekman's MAMF, a best case over shapes) or a share sustained in training, fitted to
published runs (``bench_published.py --fit``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from planner import gpus, ir

Kernel = tuple[float, float, float]
"""(FLOPs, bytes moved, the largest operand in 128 x 128 tiles)."""


@dataclass(frozen=True)
class Layout:
    """One tensor-parallel rank's share of a layer: micro-batch, sequence, widths, tensor degree."""

    b: int
    s: int
    h: int
    a: int
    f: int
    t: int
    dropout: bool = True
    sequence_parallel: bool = False


def gemm(m: float, k: float, n: float, batch: float = 1.0) -> Kernel:
    """A (batched) 16-bit GEMM ``(m, k) x (k, n)``."""
    largest = max(m * k, k * n, m * n)
    return 2.0 * batch * m * k * n, 2.0 * batch * (m * k + k * n + m * n), batch * largest / gpus.TILE_ELEMENTS


def memory(nbytes: float) -> Kernel:
    return 0.0, nbytes, 0.0


def block_kernels(x: Layout) -> list[Kernel]:
    """One rank's forward kernels of a transformer layer (module docstring)."""
    tok, d, heads = x.s * x.b, x.h // x.a, x.b * x.a // x.t
    act = 2.0 * tok * x.h  # one whole activation, bytes
    norm = act / x.t if x.sequence_parallel else act  # what a norm or a bias+dropout+add touches on this rank
    scores = 2.0 * heads * x.s * x.s
    mask = 0.5 if x.dropout else 0.0  # one byte per value against two
    out = [memory(2 * norm), gemm(tok, x.h, 3 * x.h / x.t), gemm(x.s, d, x.s, heads), memory(2 * scores)]
    if x.dropout:
        out.append(memory(scores * (2 + mask)))
    out += [gemm(x.s, x.s, d, heads), gemm(tok, x.h / x.t, x.h), memory(norm * (3 + mask)), memory(2 * norm),
            gemm(tok, x.h, x.f / x.t), memory(2 * 2.0 * tok * x.f / x.t), gemm(tok, x.f / x.t, x.h),
            memory(norm * (3 + mask))]
    return out


def head_kernels(x: Layout, vocab: int) -> list[Kernel]:
    """One rank's forward kernels of the logits head and the vocabulary-parallel cross-entropy."""
    tok = x.s * x.b
    return [gemm(tok, x.h, vocab / x.t), *[memory(2 * 4.0 * tok * vocab / x.t)] * 3]


def forward_s(roofline: gpus.Roofline, kernels: list[Kernel]) -> float:
    return sum(roofline.kernel(flops, nbytes, tiles)[0] for flops, nbytes, tiles in kernels)


def timed(profile: ir.ModelProfile, x: Layout, vocab: int, roofline: gpus.Roofline) -> ir.ModelProfile:
    """``profile`` (scripts/synthetic.gpt_profile) with its blocks and head timed by the roofline at
    layout ``x``. The cost model takes a micro-batch's share of a layer's time and divides a sharded
    layer's by ``t``, so each time is one rank's micro-batch time x ``t`` x micro-batches per batch:
    the profile holds at this tensor degree and micro-batch size."""
    scale = x.t * profile.batch_size / x.b
    block_f = forward_s(roofline, block_kernels(x)) * scale
    head_f = forward_s(roofline, head_kernels(x, vocab)) * scale

    def retime(i: int, layer: ir.LayerProfile) -> ir.LayerProfile:
        f = block_f if layer.block is not None else head_f if i >= profile.head_start else None
        return layer if f is None else dataclasses.replace(layer, forward_s=f, backward_s=2 * f)

    return dataclasses.replace(profile, layers=tuple(retime(i, layer) for i, layer in enumerate(profile.layers)))

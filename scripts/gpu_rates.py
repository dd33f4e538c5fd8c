#!/usr/bin/env python
"""Rates of the kernels a training step runs beside its layers, measured on this machine's GPU
(prints a Markdown report; needs CUDA).

What ``scripts/gpu_checks.py`` found unexplained on an H200 is measured here, each by CUDA-synchronised
wall time, the mean of ``--repeats`` runs after three warm-ups:

1. matrix products whose sizes are or are not multiples of 8 (GPT-2's vocabulary, 50257, against
   50264 and 50304; a square 8192 against 8191): the share of the aligned rate an unaligned size
   keeps, forward (``x @ W``) and both backward products;
2. the host's cost per eager kernel: a chain of small element-wise ops issued without
   synchronising (the rate the CPU issues kernels, which bounds a step of many small kernels);
3. the Adam step on GPT-2 small's parameter tensors (148 of them, 124M values, fp32), as torch's
   default (multi-tensor ``foreach``) and ``fused=True`` run it, against its bytes at the memory
   bandwidth (28 bytes per value: parameter, gradient and two moments read, three written);
4. the loss: the engines' cross-entropy (``planner.export.losses.cross_entropy_loss``, fp32 over bf16
   logits) over ``8 x 1024`` tokens, forward and backward, for the two vocabularies (GPT-2 50257, Llama 32000).

Usage::

    python scripts/gpu_rates.py [--repeats 20]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.export.losses import cross_entropy_loss  # noqa: E402


def timed(step: Callable[[], Any], repeats: int) -> float:
    """Mean seconds of ``step`` over ``repeats`` runs after three warm-ups, synchronised at both ends."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def gemm_rows(repeats: int) -> list[str]:
    """Forward and backward products of a ``tokens x hidden`` input and a ``hidden x n`` weight, per ``n``."""
    rows, tokens, hidden = [], 8192, 768
    for n in (50304, 50264, 50257):
        x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(hidden, n, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(tokens, n, device="cuda", dtype=torch.bfloat16)
        flops = 2 * tokens * hidden * n
        for name, step in (("x @ W", partial(torch.matmul, x, w)), ("dY @ W^T", partial(torch.matmul, dy, w.t())),
                           ("X^T @ dY", partial(torch.matmul, x.t(), dy))):
            rows.append(f"| {tokens} x {hidden} x {n} | {name} | {flops / timed(step, repeats) / 1e12:.1f} |")
    for n in (8192, 8191):
        a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        rows.append(f"| {n}^3 | A @ B | {2 * n**3 / timed(partial(torch.matmul, a, b), repeats) / 1e12:.1f} |")
    return ["| sizes (M x K x N) | product | TFLOP/s |", "|---|---|---|", *rows]


def launch_rows() -> list[str]:
    """Seconds per eager kernel issued back to back: small (host-bound) and 16M-value (device-bound) tensors."""
    rows = []
    for numel in (1024, 16 * 2**20):
        x = torch.zeros(numel, device="cuda")

        def chain(x: torch.Tensor = x) -> None:
            for _ in range(1000):
                x.add_(1.0)

        per_kernel = timed(chain, 5) / 1000
        rows.append(f"| {numel} | {per_kernel * 1e6:.2f} |")
    return ["| values per tensor | microseconds per kernel |", "|---|---|", *rows]


def gpt2_shapes() -> list[tuple[int, ...]]:
    """GPT-2 small's parameter shapes (12 blocks of 12 tensors, embeddings and the final norm)."""
    h, blocks = 768, 12
    block = [(h,), (h,), (h, 3 * h), (3 * h,), (h, h), (h,), (h,), (h,), (h, 4 * h), (4 * h,), (4 * h, h), (h,)]
    return [(50257, h), (1024, h), *block * blocks, (h,), (h,)]


def adam_rows(repeats: int, bandwidth_Bps: float) -> list[str]:
    """Adam on GPT-2 small's tensors: default and fused, beside the bytes at the measured bandwidth."""
    params = [torch.nn.Parameter(torch.randn(s, device="cuda")) for s in gpt2_shapes()]
    for p in params:
        p.grad = torch.randn_like(p)
    values = sum(p.numel() for p in params)
    rows = [f"| bytes at {bandwidth_Bps / 1e12:.2f} TB/s | {28 * values / bandwidth_Bps * 1e3:.3f} |"]
    for name, options in (("default (foreach)", {}), ("fused", {"fused": True})):
        opt = torch.optim.Adam(params, lr=1e-4, **options)
        rows.append(f"| {name} | {timed(opt.step, repeats) * 1e3:.3f} |")
    return [f"{len(params)} tensors, {values / 1e6:.1f}M values", "", "| Adam step | milliseconds |", "|---|---|",
            *rows]


def loss_rows(repeats: int) -> list[str]:
    """Cross-entropy forward and backward over 8 x 1024 tokens' bf16 logits, per vocabulary."""
    rows, tokens = [], 8 * 1024
    for vocab in (50257, 32000):
        logits = torch.randn(tokens, vocab, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        target = torch.randint(0, vocab, (tokens,), device="cuda")

        def step(logits: torch.Tensor = logits, target: torch.Tensor = target) -> None:
            cross_entropy_loss(logits, target).backward()

        rows.append(f"| {vocab} | {timed(step, repeats) * 1e3:.3f} |")
    return ["| vocabulary | cross-entropy forward + backward, ms |", "|---|---|", *rows]


def bandwidth(repeats: int) -> float:
    """Device-to-device copy bandwidth, bytes read and written, of a 1 GiB tensor."""
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / timed(lambda: dst.copy_(src), repeats)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_rates: no CUDA device here (this script measures a GPU)", file=sys.stderr)
        return 2
    copy_Bps = bandwidth(args.repeats)
    sections = [(f"# Kernel rates on {torch.cuda.get_device_name()} (torch {torch.__version__})", []),
                ("## Matrix products by alignment", gemm_rows(args.repeats)),
                ("## Host cost per eager kernel", launch_rows()),
                ("## Optimizer", adam_rows(args.repeats, copy_Bps)),
                ("## Loss", loss_rows(args.repeats))]
    print("\n\n".join("\n".join([title, "", *lines]) if lines else title for title, lines in sections))
    return 0


if __name__ == "__main__":
    sys.exit(main())

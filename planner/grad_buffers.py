"""How each engine holds its data-parallel gradients while it reduces them (pure): the buckets' sizes, and
the flat copies that memory must count (:class:`GradCopy`, read by :data:`planner.engines.ENGINES`, the
cost model and the exports that write those sizes)."""

from __future__ import annotations

from dataclasses import dataclass

GRAD_BUCKET_BYTES = 25 * 2**20
"""The torch export's data-parallel gradients are summed in flat buckets of at most this many bytes
(one all-reduce each; a larger gradient is reduced in place), as PyTorch DDP does by default
(``bucket_cap_mb=25``; planner.export.sharding)."""

DEEPSPEED_ALLREDUCE_PARAMS = 500_000_000
"""DeepSpeed's pipeline engine all-reduces ZeRO-0 gradients in flat buckets of this many elements
(``MEMORY_OPT_ALLREDUCE_SIZE``, deepspeed/runtime/engine.py: ``allreduce_gradients``,
``allreduce_no_retain``)."""


DEEPSPEED_ZERO1_BUCKET_PARAMS = 50_000_000
"""The most elements the DeepSpeed export lets its ZeRO-1 reduce at a time (``reduce_bucket_size``).
DeepSpeed's ZeRO-1 allocates two fp32 buffers of ``reduce_bucket_size`` elements whole, for the
step's reduction (deepspeed/runtime/zero/stage_1_and_2.py: ``setup_buckets``, ``reduce_gradients``
with a pipeline): 3.8 GB on every rank at its default of 5e8, whatever the model (measured on CPU,
``scripts/bench_zero.py --engine deepspeed``). The export writes :func:`deepspeed_bucket_params`."""


def deepspeed_bucket_params(param_count: int) -> int:
    """``reduce_bucket_size`` for a model of ``param_count`` parameters: no more than the model, at most
    :data:`DEEPSPEED_ZERO1_BUCKET_PARAMS` (200 MB of fp32 gradients per all-reduce keeps a link's
    bandwidth)."""
    return max(1, min(DEEPSPEED_ZERO1_BUCKET_PARAMS, param_count))


GRAD_COPY_PASSES = 3
"""Passes a flat-buffer all-reduce makes over the gradients it copies, each reading and writing them: flatten
into the buffer, scale by the group's size, copy back (DeepSpeed's ``allreduce_no_retain``: ``flatten``,
``mul_``, ``copy_`` of the unflattened views; the torch export's ``sum_grads``: ``cat``, ``/=``, ``copy_``).
Timed in DeepSpeed's data-parallel step of the README's mlp (11.5 MB of gradients, this project's CPU): ``cat``
0.95 ms, ``mul_`` 0.44, ``copy_`` 1.08 a step, 2.4 ms, where 3 x 2 x 11.5 MB over the calibrated memory
bandwidth (23-28 GB/s) is 2.5-3.0 ms."""

ALONE_COPY_PASSES = 2
"""The passes where the data-parallel group is one process (DeepSpeed's ``copy_alone``): flatten and copy back;
nothing is scaled (``allreduce_bucket`` multiplies by ``predivide / dp_world_size`` only where they differ)."""


@dataclass(frozen=True)
class GradCopy:
    """How an engine's data-parallel gradient all-reduce copies the gradients into flat buffers (under
    the ZeRO stages ``zero``): at most ``cap_bytes``, or ``cap_params`` elements, at a time, while the
    gradients themselves are still held: a transient on top of the static memory after the last
    backward (planner.costmodel.variant). The gradients reduced are fp32 (the torch export keeps
    fp32 parameters and computes in bf16 casts of them; DeepSpeed's bf16 optimizer reduces its fp32 gradients), fp16
    ones under fp16. No copy: the empty default.

    ``held``: the buffers cover every gradient and live as long as the model, allocated once (PyTorch
    DDP's buckets with its default ``gradient_as_bucket_view=False``, which torchtitan's ``replicate``
    keeps: torch/nn/parallel/distributed.py; DDP's documentation puts the memory that setting saves at
    "the total gradients size"): static memory, not a transient, and no cap.

    ``alone``: it copies even where the data-parallel group is one process (DeepSpeed's pipeline engine
    reduces at every step's end, flattening the gradients with no look at the group's size:
    runtime/pipe/engine.py ``_exec_reduce_grads``, runtime/engine.py ``buffered_allreduce_fallback``;
    measured here, a one-process stage of a 2-stage MLP held its 8 MiB of gradients twice for a moment)."""

    zero: tuple[int, ...] = ()
    cap_bytes: float = 0.0
    cap_params: float = 0.0
    held: bool = False
    alone: bool = False


NO_COPY = GradCopy()
"""An engine that reduces its gradients where they lie (no flat copy)."""

"""Megatron-LM's layouts, the ``megatron`` baseline of ``planner compare`` (pure: no torch, click or rich).

Megatron-LM (Narayanan et al., SC'21, section 3.3) runs tensor parallelism inside a server, a pipeline
across the rest, data parallelism over what is left; ranks in its order (tensor innermost, then data,
then pipeline). Which transformer blocks each pipeline rank holds follows its own rules
(NVIDIA/Megatron-LM d98e8a6, ``megatron/core/transformer/transformer_config.py``, read 2026-11-28):

* ``--num-layers`` divisible by the pipeline size: every rank the same count (its default);
* ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``: the first and last ranks
  their own counts, each above 0, the ranks between an equal share of the rest; under the interleaved
  schedule every rank's count divisible by the chunks per rank;
* ``--pipeline-model-parallel-layout``: any layout written out (``E`` the embedding, ``t`` a block, ``L``
  the output layer and loss, ``|`` between chunks).

:func:`block_counts` lists the counts a user would give for a pipeline depth (:func:`megatron_layouts`);
each layout carries the options that give it (``Layout.flags``), so ``planner compare``'s row says what
to run.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

from planner import ir
from planner.search.layout import Layout, NotFitting, divisors
from planner.search.partitioners import partition_uniform

__all__ = ["block_counts", "megatron_form", "megatron_layouts", "megatron_parts", "megatron_tp", "megatron_tps",
           "virtual_stage_counts"]


def megatron_tps(profile: ir.ModelProfile, cluster: ir.Cluster) -> tuple[int, ...]:
    """Every ``--tensor-model-parallel-size`` Megatron-LM runs here inside a server, largest first: the divisors
    of a server's GPUs (its smallest) that divide every transformer block's attention heads (Megatron-Core's
    ``TransformerConfig``: "num_attention_heads must be a multiple of tensor_model_parallel_size") and KV heads
    (Megatron also replicates KV heads where tp is a multiple of them, which the planner's engines do not run); 1
    alone for blocks the planner's engines do not shard (``BlockShape.shardable``)."""
    per_server = min(len(node.gpus) for node in cluster.nodes)
    blocks = [layer.block for layer in profile.layers if layer.block is not None]
    return tuple(t for t in reversed(divisors(per_server)) if all(b.splits_over(t) for b in blocks))


def megatron_tp(profile: ir.ModelProfile, cluster: ir.Cluster) -> int:
    """Megatron-LM's tensor degree in its SC'21 recipe: the GPUs of a server (its smallest), lowered to the
    largest divisor that divides every transformer block's attention heads and KV heads (Megatron shards whole
    heads): the first of :func:`megatron_tps`."""
    return megatron_tps(profile, cluster)[0]


def megatron_form(layer: ir.LayerProfile) -> str:
    """A layer's form in Megatron-LM's tensor group (Shoeybi et al. 2019, section 3): a transformer
    block ``tp``; the input embedding sharded over the vocabulary, its partial outputs all-reduced
    (``split_in``); the output layer, and any other layer, column-parallel (``split_out``): every rank
    takes the whole micro-batch, so a micro-batch of one sample runs. ``dp`` where the weight's shape
    is unknown (the split forms are closed to it)."""
    if layer.block is not None:
        return "tp"
    if layer.param_count and not layer.splittable:
        return "dp"
    return "split_in" if layer.type == "Embedding" else "split_out"


def block_counts(blocks: int, pp: int, v: int = 1) -> list[tuple[int, ...]]:
    """The transformer blocks of each of ``pp`` pipeline ranks, ``v`` chunks a rank, that Megatron-LM runs by its
    first/last-stage rules (module doc) and that a user evening the stages would give: the ranks between the ends
    hold ``m`` blocks each, the first and last at most ``m`` (they also hold the embedding, and the output layer
    with the loss), every count a positive multiple of ``v``; ``m`` the least such share, and under 1F1B
    (``v`` = 1) also one block more, which frees the ends further (under interleaving a rank's count moves v
    blocks at a time). Equal counts first (Megatron's default), where they divide; none where no such counts
    exist (80 blocks on 32 ranks: the ends would need 10 each beside 2)."""
    if pp < 1 or v < 1 or blocks % v or blocks < pp * v or (pp == 1 and v > 1):
        return []
    if pp == 1:
        return [(blocks,)]
    least = -(-blocks // (pp * v)) * v
    found: list[tuple[int, ...]] = []
    for m in (least, least + 1) if v == 1 else (least,):
        rest = blocks - (pp - 2) * m
        for first in range(max(v, rest - m), min(m, rest - v) + 1, v):
            counts = (first, *(m,) * (pp - 2), rest - first)
            if counts not in found:
                found.append(counts)
    return sorted(found, key=lambda c: len(set(c)) > 1)  # stable: equal counts first


def virtual_stage_counts(profile: ir.ModelProfile, pp: int) -> list[int]:
    """The chunks per rank Megatron's interleaved schedule can run on ``pp`` ranks: v >= 2 for which
    :func:`block_counts` has counts, on 2 ranks or more. Megatron-LM (d98e8a6, ``megatron/training/arguments.py``)
    asks for pp > 2 only with ``--no-overlap-p2p-communication``; with its default p2p overlap, pp > 1 ("Enable
    virtual pipelining and P2P communication overlap at PP=2", 3ee489d, 2024-05-31), as Megatron-Core's
    ``parallel_state`` ("pipeline-model-parallel size should be greater than 1 with interleaved schedule")."""
    blocks = _contiguous_blocks(profile)
    if pp < 2 or blocks is None:
        return []
    return [v for v in range(2, len(blocks) // pp + 1) if block_counts(len(blocks), pp, v)]


def _contiguous_blocks(profile: ir.ModelProfile) -> range | None:
    """The transformer blocks' layer indices where they are one run of layers (Megatron's model), else None."""
    idx = [i for i, layer in enumerate(profile.layers) if layer.block is not None]
    return range(idx[0], idx[-1] + 1) if idx and idx[-1] - idx[0] + 1 == len(idx) else None


def megatron_parts(profile: ir.ModelProfile, counts: Sequence[int], v: int = 1) -> list[int]:
    """Layer boundaries of Megatron's ``len(counts) x v`` chunks: pipeline rank r holds ``counts[r]`` blocks in
    ``v`` equal chunks, chunk c on rank c mod pp (SC'21 section 2.2); the layers before the blocks (the
    embedding) with chunk 0, those after them (the final norm, the output layer) with the last."""
    blocks = _contiguous_blocks(profile)
    if blocks is None or sum(counts) != len(blocks):
        raise ValueError(f"block counts {list(counts)} do not cover the profile's transformer blocks")
    pp, at, parts = len(counts), blocks.start, [0]
    for c in range(pp * v - 1):
        at += counts[c % pp] // v
        parts.append(at)
    return [*parts, len(profile.layers)]


def _flags(counts: tuple[int, ...], v: int) -> str:
    """Megatron's options for uneven ``counts`` ('' for equal ones)."""
    if len(set(counts)) == 1:
        return ""
    middle = counts[1] if len(counts) > 2 else None
    given = [f"--decoder-first-pipeline-num-layers {counts[0]}" if counts[0] != middle else "",
             f"--decoder-last-pipeline-num-layers {counts[-1]}" if counts[-1] != middle else "",
             f"--num-virtual-stages-per-pipeline-rank {v}" if v > 1 else ""]
    return " ".join(g for g in given if g)


def _layout_string(profile: ir.ModelProfile, parts: Sequence[int]) -> str:
    """``--pipeline-model-parallel-layout`` for chunks ending at ``parts`` ('' where the blocks are not one run)."""
    blocks = _contiguous_blocks(profile)
    if blocks is None:
        return ""
    chunks = []
    for first, end in pairwise(parts):
        n = len(range(max(first, blocks.start), min(end, blocks.stop)))
        chunks.append(("E" if first == 0 else "") + (f"t*{n}" if n > 1 else "t" * n)
                      + ("L" if end == parts[-1] else ""))
    return "--pipeline-model-parallel-layout " + "|".join(chunks)


def _cuts(profile: ir.ModelProfile, pp: int, v: int) -> list[tuple[list[int], str]]:
    """Each cut of the model into ``pp x v`` chunks Megatron runs for this depth, with its options: the counts
    of :func:`block_counts`; without any (1F1B only), equal layer counts with the embedding and the head counted
    as layers, written out as a layout."""
    blocks = _contiguous_blocks(profile)
    counts = block_counts(len(blocks), pp, v) if blocks is not None else []
    if counts:
        return [(megatron_parts(profile, c, v), _flags(c, v)) for c in counts]
    if v > 1:
        return []
    parts = partition_uniform(len(profile.layers), pp)
    return [(parts, _layout_string(profile, parts))]


def megatron_layouts(profile: ir.ModelProfile, cluster: ir.Cluster, microbatches: tuple[int, ...],
                     interleaved: bool = False, tp: int | None = None, uneven: bool = True
                     ) -> list[Layout] | NotFitting:
    """``megatron``: Megatron-LM's 3-D layouts (module doc), 1F1B.

    Tensor parallel inside a server (``tp``, one of :func:`megatron_tps`; None: :func:`megatron_tp`, the
    server's GPUs; 1: data and pipeline parallel only), every layer in its :func:`megatron_form`; a pipeline of
    every depth pp that divides the GPUs left by tp (at most the layer count), each cut of :func:`_cuts`; data
    parallel for the rest; a stage holds consecutive GPUs. The judge keeps the fastest that fits and gives
    overflowing stages full recomputation, as Megatron's users turn it on when memory runs out.

    ``interleaved``: Megatron's interleaved schedule instead (SC'21 section 2.2): every v >= 2 chunks a rank of
    :func:`virtual_stage_counts`, at the micro-batch counts that are multiples of pp (its schedule's rule at its
    default ``--microbatch-group-size-per-virtual-pipeline-stage``, pp); none where no pp and v qualify.
    ``uneven`` False: each depth's first cut only (equal counts where they divide).
    """
    if not profile.has_blocks:
        return NotFitting("megatron", "Megatron-LM's tensor parallelism shards transformer blocks; the model has none")
    gpus = [g.name for g in cluster.gpus]
    tp, n = tp or megatron_tp(profile, cluster), len(profile.layers)
    forms = tuple(megatron_form(layer) if tp > 1 else "dp" for layer in profile.layers)
    layouts = []
    for pp in (d for d in divisors(len(gpus) // tp) if d <= n):
        width = len(gpus) // pp
        choices = tuple(m for m in microbatches if m % pp == 0) if interleaved else microbatches
        if not choices:
            continue
        for v in virtual_stage_counts(profile, pp) if interleaved else (1,):
            cuts = _cuts(profile, pp, v)
            for parts, flags in cuts if uneven else cuts[:1]:
                stages = tuple(((parts[c], parts[c + 1]), tuple(gpus[c % pp * width:(c % pp + 1) * width]),
                                forms[parts[c]:parts[c + 1]]) for c in range(pp * v))
                layouts.append(Layout("megatron", stages, "interleaved" if interleaved else "1f1b", choices, tp,
                                      virtual_stages=v, flags=flags))
    return layouts

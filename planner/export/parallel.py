"""Tensor and sequence parallelism of one stage's layers over its tensor group (DTensor).

The forms of a stage's layers are relative to its tensor group of ``tp`` devices
(``planner.ir.Stage``):

* ``split_out`` / ``split_in``: planner.export.splits (column/row-parallel Linears and embeddings).
* ``tp`` (a transformer block, Megatron-LM; Shoeybi et al. 2019): attention q/k/v column-
  parallel and the output projection row-parallel, MLP up (and gate) column-parallel and down
  row-parallel: one all-reduce after attention and one after the MLP in forward (and in
  backward). Heads are sharded whole: ``tp`` must divide the heads and the KV heads. GPT-2's
  ``Conv1D`` layers (weights stored ``[in, out]``) are converted to ``nn.Linear`` with the same
  values, and its fused ``c_attn`` (rows ``[q; k; v]``) is permuted so that each rank's
  contiguous column shard holds ``[q; k; v]`` of its own heads; its ``split_size`` becomes
  ``hidden / tp``. Llama-style blocks (``q_proj``/``k_proj``/``v_proj``/``o_proj``,
  ``gate_proj``/``up_proj``/``down_proj``; grouped KV heads) shard as they are; both infer
  their local head count from the sharded width (``view(..., -1, head_dim)``). BERT's layer (post-norm):
  ``attention.self``'s query/key/value and ``intermediate.dense`` column-parallel, ``attention.output.dense``
  and ``output.dense`` row-parallel, its self-attention's head count and ``all_head_size`` divided by ``tp``;
  its LayerNorms (after each row layer, on the residual sum) and dropouts replicated. A ``Conv1D`` or
  other weight keeps its ``requires_grad`` (a frozen block stays frozen).
* sequence parallelism (Korthikanti et al. 2022), where the stage asks: the decoder block's
  input is cut along the sequence, its norms run ``SequenceParallel``, attention and the MLP
  all-gather the sequence at their input (a pre-hook; BERT's: its self-attention and intermediate layer)
  and their row layers reduce-scatter it (BERT's residual sums and norms run on the sequence shard);
  the block's output is gathered again, so the layers around it (Llama's rotary wrapper) and
  the pipeline see whole activations.
* ``dp`` layers in a tensor group (PipePar's form 0, as planner.costmodel.layers prices it): each
  device computes its share of the replica's samples, ``b / tp`` of a micro-batch of ``b``, with the
  weights replicated. The activation moves between the layouts as a DTensor redistribution over the
  tensor group (:class:`Relayout`): entering a run of ``dp`` layers keeps the rank's own samples
  (``Replicate -> Shard(0)``, no traffic; its backward all-gathers the gradient), leaving it (before a
  sharded form, or at the end of a stage but the last) all-gathers the samples (``Shard(0) ->
  Replicate``; its backward keeps the rank's share). Each rank's gradient of those weights is then
  its samples' part: planner.export.torch sums it over the tensor group (with the data-parallel
  average: the whole stage). ``tp`` must divide ``b``, and a layer that mixes samples (batch norm)
  is refused. The last stage ends on the rank's share (its loss is computed per share, as the cost
  model prices it: no all-gather of the logits); the other stages' ends stay replicated in the
  tensor group (the pipeline sends every rank the whole activation; the cost model's stage ends are
  batch-sharded, so a stage but the last that ends in ``dp`` layers pays one all-gather more here).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from planner.errors import ExportError
from planner.export.splits import parallelize, shard_splits
from planner.profiler.layered import batch_stats

CONV1D_ROWS = "_planner_conv1d_rows"
"""The attribute :func:`_conv1d_to_linear` leaves on the ``nn.Linear`` it makes of a GPT-2 ``Conv1D``: the
permutation of output features it applied, by which ``planner run --check`` reads the weights back in the model's
layout (planner.runner.fingerprint)."""

_FIX = "search with `planner search --engine torch` (dp forms on this layer), or use another tp"


# ----------------------------------------------------------------------------- transformer blocks


def _find(layer: nn.Module, attrs: Sequence[str]) -> tuple[str, nn.Module] | None:
    """The first submodule (dotted name, module) that has every attribute in ``attrs``."""
    for name, m in layer.named_modules():
        if all(isinstance(getattr(m, a, None), nn.Module) for a in attrs):
            return name, m
    return None


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


@dataclass(frozen=True)
class BlockParts:
    """Where a transformer block's parts are, as dotted paths relative to the layer: ``block`` the block
    itself (the parent of attention and MLP), ``attn`` the module that splits the heads (sequence
    parallelism gathers the sequence at its input), ``mlp`` the MLP's input module (likewise)."""

    arch: str
    block: str
    attn: str
    mlp: str


def _bert_parts(layer: nn.Module) -> BlockParts | None:
    """BERT's layer (post-norm): ``attention.self`` (query/key/value), ``attention.output.dense``,
    ``intermediate.dense``, ``output.dense``; None if ``layer`` holds none."""
    found = _find(layer, ("attention", "intermediate", "output"))
    if found is None:
        return None
    path, block = found
    needs = ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
             "intermediate.dense", "output.dense")
    try:
        if not all(isinstance(block.get_submodule(n), nn.Linear) for n in needs):
            return None
    except AttributeError:
        return None
    return BlockParts("bert", path, _join(path, "attention.self"), _join(path, "intermediate"))


def block_parts(layer: nn.Module, stage: int, index: int) -> BlockParts:
    """The parts of a transformer block (GPT-2, Llama-style or BERT); ExportError if none is found."""
    gpt2_attn, gpt2_mlp = _find(layer, ("c_attn", "c_proj")), _find(layer, ("c_fc", "c_proj"))
    if gpt2_attn and gpt2_mlp:
        return BlockParts("gpt2", gpt2_attn[0].rpartition(".")[0], gpt2_attn[0], gpt2_mlp[0])
    llama_attn = _find(layer, ("q_proj", "k_proj", "v_proj", "o_proj"))
    llama_mlp = _find(layer, ("up_proj", "down_proj"))
    if llama_attn and llama_mlp:
        return BlockParts("llama", llama_attn[0].rpartition(".")[0], llama_attn[0], llama_mlp[0])
    bert = _bert_parts(layer)
    if bert is not None:
        return bert
    raise ExportError(f"stage {stage}: layer {index} ({type(layer).__name__}) runs the tp form but has no "
                      "attention (c_attn/c_proj, q/k/v/o_proj or BERT's attention.self.query/key/value) and MLP "
                      "(c_fc/c_proj, up/down_proj or BERT's intermediate/output) the torch export knows", _FIX)


def _heads(attn: nn.Module) -> tuple[int, int]:
    """(heads, KV heads) of an attention module (HF attributes, else its config)."""
    cfg = getattr(attn, "config", None)
    heads: Any = (getattr(attn, "num_heads", None) or getattr(attn, "num_attention_heads", None)
                  or getattr(cfg, "num_attention_heads", None))
    kv: Any = getattr(attn, "num_key_value_heads", None) or getattr(cfg, "num_key_value_heads", None) or heads
    if not heads:
        raise ExportError(f"cannot read the head count of {type(attn).__name__}", _FIX)
    return int(heads), int(kv)


def check_block(layer: nn.Module, tp: int, seq_len: int | None, sequence_parallel: bool, stage: int,
                index: int) -> None:
    """Heads, KV heads (and the sequence, for sequence parallelism) must split whole over ``tp``."""
    heads, kv = _heads(layer.get_submodule(block_parts(layer, stage, index).attn))
    if heads % tp or kv % tp:
        raise ExportError(f"stage {stage}: layer {index} has {heads} heads and {kv} KV heads, which tp {tp} does "
                          "not divide (heads are sharded whole)", _FIX)
    if sequence_parallel and seq_len is not None and seq_len % tp:
        raise ExportError(f"stage {stage}: sequence parallelism cuts the sequence of {seq_len} tokens over tp {tp}",
                          "use a sequence length that tp divides, or a plan without sequence_parallel")


def _conv1d_to_linear(parent: nn.Module, name: str, rows: torch.Tensor | None = None) -> None:
    """Replace GPT-2's ``Conv1D`` ``parent.name`` (weight ``[in, out]``) by an equal ``nn.Linear``.

    ``rows``: a permutation of the output features (the fused q/k/v reordering).
    """
    conv = getattr(parent, name)
    if isinstance(conv, nn.Linear):
        return
    weight, bias = conv.weight.detach().t(), conv.bias.detach()
    if rows is not None:
        weight, bias = weight[rows], bias[rows]
    lin = nn.Linear(weight.shape[1], weight.shape[0], device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        lin.weight.copy_(weight)
        lin.bias.copy_(bias)
    lin.weight.requires_grad_(conv.weight.requires_grad)  # a frozen Conv1D stays frozen
    lin.bias.requires_grad_(conv.bias.requires_grad)
    # how to read the weights back in the model's layout (planner run --check: planner.runner.fingerprint)
    setattr(lin, CONV1D_ROWS, torch.arange(weight.shape[0]) if rows is None else rows.clone())
    setattr(parent, name, lin)


def fused_qkv_rows(hidden: int, tp: int) -> torch.Tensor:
    """Output rows of a fused ``[q; k; v]`` projection reordered so that shard r is ``[q_r; k_r; v_r]``.

    Rank r's heads are the contiguous rows ``[r*h/tp, (r+1)*h/tp)`` of each of q, k and v.
    """
    local = hidden // tp
    return torch.cat([torch.arange(p * hidden + r * local, p * hidden + (r + 1) * local)
                      for r in range(tp) for p in range(3)])


def _prepare_gpt2(layer: nn.Module, attn_path: str, mlp_path: str, tp: int) -> None:
    attn, mlp = layer.get_submodule(attn_path), layer.get_submodule(mlp_path)
    hidden = int(attn.split_size)
    _conv1d_to_linear(attn, "c_attn", fused_qkv_rows(hidden, tp))
    _conv1d_to_linear(attn, "c_proj")
    _conv1d_to_linear(mlp, "c_fc")
    _conv1d_to_linear(mlp, "c_proj")
    attn.split_size = hidden // tp
    attn.num_heads = int(attn.num_heads) // tp


def _prepare_bert(layer: nn.Module, attn_path: str, tp: int) -> None:
    attn = layer.get_submodule(attn_path)
    attn.num_attention_heads = int(attn.num_attention_heads) // tp
    attn.all_head_size = int(attn.all_head_size) // tp


def _block_linears(layer: nn.Module, parts: BlockParts, tp: int) -> tuple[list[str], list[str]]:
    """(column-parallel, row-parallel) Linears of a block, relative to the layer (GPT-2's converted first)."""
    attn, mlp = parts.attn, parts.mlp
    if parts.arch == "gpt2":
        _prepare_gpt2(layer, attn, mlp, tp)
        return [_join(attn, "c_attn"), _join(mlp, "c_fc")], [_join(attn, "c_proj"), _join(mlp, "c_proj")]
    if parts.arch == "bert":
        _prepare_bert(layer, attn, tp)
        return ([_join(attn, c) for c in ("query", "key", "value")] + [_join(mlp, "dense")],
                [_join(parts.block, "attention.output.dense"), _join(parts.block, "output.dense")])
    gated = isinstance(getattr(layer.get_submodule(mlp), "gate_proj", None), nn.Module)
    cols = [_join(attn, c) for c in ("q_proj", "k_proj", "v_proj")]
    cols += [_join(mlp, c) for c in (("gate_proj", "up_proj") if gated else ("up_proj",))]
    return cols, [_join(attn, "o_proj"), _join(mlp, "down_proj")]


def _block_styles(layer: nn.Module, tp: int, sequence_parallel: bool, stage: int, index: int) -> dict[str, Any]:
    """The DTensor parallel plan of one transformer block, relative to the layer."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    cols, rows = _block_linears(layer, block_parts(layer, stage, index), tp)
    seq = Shard(1) if sequence_parallel else Replicate()
    styles: dict[str, Any] = {p: ColwiseParallel() for p in cols}
    styles.update({p: RowwiseParallel(output_layouts=seq) for p in rows})
    return styles


class Relayout:
    """Move an activation between two layouts over the tensor group ``mesh`` (a DTensor redistribution
    of its local tensor: ``src`` -> ``dst``), as a forward pre-hook on the first positional argument (or
    ``hidden_states``) or, with :meth:`output`, a forward hook on the output. Sequence parallelism
    gathers the sequence before attention and the MLP with it (HF Llama's attention reads the sequence
    length from its input, so the whole sequence must arrive there, not at each projection); ``dp``
    forms in a tensor group split and gather the samples with it."""

    def __init__(self, mesh: Any, src: Any, dst: Any) -> None:
        self.mesh, self.src, self.dst = mesh, src, dst

    def move(self, x: torch.Tensor) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(x, self.mesh, [self.src], run_check=False).redistribute(
            self.mesh, [self.dst]).to_local()

    def __call__(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if args:
            return (self.move(args[0]), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": self.move(kwargs["hidden_states"])}

    def output(self, module: nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> torch.Tensor:
        return self.move(out)

    @property
    def splits_samples(self) -> bool:
        """Whether this move enters the batch-sharded layout of ``dp`` forms."""
        return getattr(self.dst, "dim", None) == 0


def _norm_paths(layer: nn.Module) -> list[str]:
    """Every norm module in a decoder block (LayerNorm, RMSNorm): SequenceParallel under sequence parallelism."""
    return [name for name, m in layer.named_modules() if name and "norm" in type(m).__name__.lower()]


def shard_block(layer: nn.Module, mesh: Any, sequence_parallel: bool, stage: int, index: int) -> None:
    """Make ``layer`` (a transformer block) Megatron tensor parallel over the 1-D ``mesh``."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput, PrepareModuleOutput, SequenceParallel

    styles = _block_styles(layer, mesh.size(), sequence_parallel, stage, index)
    if sequence_parallel:
        # The sequence is cut at the decoder block itself (the parent of attention and MLP), so that
        # a wrapper around it (Llama's rotary positions) still sees the whole sequence.
        parts = block_parts(layer, stage, index)
        block = layer.get_submodule(parts.block)
        styles.update({_join(parts.block, p): SequenceParallel(use_local_output=True) for p in _norm_paths(block)})
        for path in (parts.attn, parts.mlp):  # attention and MLP see the whole sequence
            gather = Relayout(mesh, Shard(1), Replicate())
            layer.get_submodule(path).register_forward_pre_hook(gather, with_kwargs=True)
        parallelize(block, mesh, PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),),
                                                    use_local_output=True))
        parallelize(block, mesh, PrepareModuleOutput(output_layouts=(Shard(1),), desired_output_layouts=(Replicate(),)))
    parallelize(layer, mesh, styles)


# ----------------------------------------------------------------------------- dp forms in a tensor group


def check_sample_independent(layer: nn.Module, tp: int, stage: int, index: int) -> None:
    """A ``dp`` layer in a tensor group must treat samples independently (no batch norm): the module's own answer,
    for profiles that predate ``LayerProfile.batch_stats`` (planner.runnable refuses the others before)."""
    if batch_stats(layer):
        raise ExportError(f"stage {stage}: layer {index} runs the dp form in a tensor group of {tp}, which splits "
                          "its samples over the group, but its batch norm takes statistics over the samples it sees "
                          "(the result would change)", "search with --tp 1 for this model, or keep the layer on a "
                          "stage without tensor parallelism")


def split_samples(module: nn.Sequential, forms: Sequence[str], mesh: Any, shard_output: bool = False) -> None:
    """The ``dp`` layers of a stage compute their share of the samples (see the module doc): a
    :class:`Relayout` where a run of them starts (to ``Shard(0)``) and where it ends (to ``Replicate``).
    ``shard_output``: the stage's output is the rank's share of the samples (the last stage, whose
    loss each rank computes on its share), else replicated."""
    from torch.distributed.tensor import Replicate, Shard

    prev = "tp"  # the stage's input arrives replicated in the tensor group
    for j, form in enumerate(forms):
        if (form == "dp") != (prev == "dp"):
            src, dst = (Replicate(), Shard(0)) if form == "dp" else (Shard(0), Replicate())
            module[j].register_forward_pre_hook(Relayout(mesh, src, dst), with_kwargs=True)
        prev = form
    if (prev == "dp") != shard_output:
        src, dst = (Shard(0), Replicate()) if prev == "dp" else (Replicate(), Shard(0))
        module[len(forms) - 1].register_forward_hook(Relayout(mesh, src, dst).output)


def sample_split(layers: Sequence[nn.Module]) -> list[bool]:
    """Per layer (in order), whether it runs on the rank's share of the samples: read back from the
    :class:`Relayout` hooks :func:`split_samples` registered."""
    out, split = [], False
    for layer in layers:
        for hook in layer._forward_pre_hooks.values():
            if isinstance(hook, Relayout):
                split = hook.splits_samples
        out.append(split)
        for hook in layer._forward_hooks.values():
            if isinstance(getattr(hook, "__self__", None), Relayout):
                split = hook.__self__.splits_samples
    return out


def shard_stage(module: nn.Sequential, forms: Sequence[str], mesh: Any, sequence_parallel: bool, stage: int,
                first: int, shard_output: bool = False,
                kinds: Sequence[tuple[str, tuple[int | None, int | None]]] = ()) -> None:
    """Apply every layer's form of one stage over its tensor group ``mesh`` (1-D); ``shard_output``: the
    stage's output is the rank's share of the samples (:func:`split_samples`); ``kinds``: the profile's layer
    types and weight shapes (:func:`shard_splits`)."""
    shard_splits(module, forms, mesh, stage, first, kinds)
    for j, form in enumerate(forms):
        if form == "tp":
            shard_block(module[j], mesh, sequence_parallel, stage, first + j)
    split_samples(module, forms, mesh, shard_output)

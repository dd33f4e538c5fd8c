"""Plan -> torch-native training: ``torch.distributed.pipelining`` stages on a (pp, dp, tp) DeviceMesh.

Ranks form a ``(pp, dp, tp)`` DeviceMesh (every stage the same ``tp x dp`` grid; planner.runnable):
rank = pipeline rank x (dp x tp) + replica x tp + tensor rank, which is the plan's device order
(stage by stage; in a stage, ``dp`` tensor groups of ``tp`` consecutive devices). Each stage is a
``PipelineStage`` over ``nn.Sequential(layers[first:end])`` (exactly the profiled layers; stages
may hold different layer counts), driven by the schedule class that matches ``plan.schedule``:

=============  ================================================================
plan           torch.distributed.pipelining
=============  ================================================================
gpipe          ScheduleGPipe
1f1b           Schedule1F1B
interleaved    ScheduleInterleaved1F1B (chunk c on pipeline rank c mod K)
zb-h1          ScheduleInterleavedZeroBubble (backward split into input and weight grads)
pipedream      refused: asynchronous weight stashing has no torch equivalent
=============  ================================================================

Inside a stage, in this order: the layers' forms over the ``tp`` group (planner.export.parallel:
Megatron blocks, column/row-parallel Linears, sequence parallelism), recomputation and bf16
compute over fp32 parameters (planner.export.sharding), then ZeRO over the ``dp`` group (FSDP2 for 2 and 3 on the
``dp`` mesh dimension, composed with the tensor-parallel DTensors as 2-D sharding; ZeRO-1 through
ZeroRedundancyOptimizer). Replica ``d`` trains its share of every micro-batch; the ranks of a
tensor group receive the same samples, and its ``dp``-form layers split them over the group (each
rank's gradient of their weights, its samples' part, is summed over the tensor group before the
data-parallel average). fp16 is refused (no loss scale in the schedule's loss).

Tied weights (a parameter several layers hold, GPT-2's wte/lm_head; planner.export.ties) are found
before sharding and kept in sync: the same seed builds them equal on every rank, and their gradients (local
shards under FSDP) are summed over the stages holding them each step (a group per tie and (dp, tp) coordinate), and
over a rank's own copies where FSDP gave each of its interleaved chunks one.

Gradient scaling: each micro-batch's loss is its mean; the trainer divides each parameter's gradient by M once
(not the schedule's ``scale_grads``, per chunk: twice for a tie two chunks of one rank share), the replicas' average
(all-reduce, or FSDP's reduce-scatter) divides by dp: a step equals one step of the unsplit model on the batch's mean.
:meth:`Trainer.describe` reads back what a rank built (its coordinates, layers, tensor-sharded
layers, ZeRO stage, wrappers); the multi-process tests hold it to the plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from planner import ir, runnable
from planner.errors import ExportError, PlanError
from planner.export import parallel, sharding, splits
from planner.export.building import released_layers
from planner.export.data import sub_batch
from planner.export.layers import check_layers_match
from planner.export.losses import make_loss
from planner.export.optim import DEFAULT_LR
from planner.export.outputs import sent_output
from planner.export.partition import ranges
from planner.export.quoting import docstring_fields
from planner.export.ties import align_ties, find_ties, sum_tie_grads, tie_sync
from planner.schedule import SCHEDULE_KINDS, schedule_kind

SCHEDULES = {name: kind.torch_class for name, kind in SCHEDULE_KINDS.items() if kind.torch_class is not None}
"""plan.schedule -> its torch.distributed.pipelining class (planner.schedule's ``torch_class``)."""

MESH_DIMS = ("pp", "dp", "tp")


def tensor_parallel(plan: ir.Plan) -> bool:
    """Whether the plan's stages have tensor groups of more than one device."""
    return any(st.tp > 1 for st in plan.stages)


def check_plan(plan: ir.Plan, layers: Sequence[nn.Module] | None = None) -> int:
    """Refuse what the torch export cannot run; return the data-parallel degree ``dp``.

    Plan-level rules (schedules, precisions, one grid for every stage, batch shapes, heads that
    ``tp`` divides, samples a tensor group splits) are planner.runnable's; the layers' own checks
    (a Linear to split, attention and MLP modules to shard) need the model.
    """
    try:
        runnable.check_runnable(plan, "torch")
    except PlanError as exc:
        raise ExportError(exc.cause, exc.hint) from None
    for i, st in enumerate(plan.stages):
        if layers is not None:
            _check_stage_layers(layers, plan, st, i)
    return plan.stages[0].dp


def _check_stage_layers(layers: Sequence[nn.Module], plan: ir.Plan, st: ir.Stage, i: int) -> None:
    seq = plan.profile.input_shape[0] if plan.profile.input_shape else None
    for j, form in enumerate(st.forms):
        index = st.layers[0] + j
        if form in ("split_out", "split_in"):
            prof = plan.profile.layers[index]
            splits.check_split(layers[index], st.tp, i, index, form, prof.type, (prof.in_features, prof.out_features))
        elif form == "tp":
            parallel.check_block(layers[index], st.tp, seq, st.sequence_parallel, i, index)
        elif st.tp > 1:
            parallel.check_sample_independent(layers[index], st.tp, i, index)


def device() -> torch.device:
    """This rank's device: its GPU (``LOCAL_RANK``) where there are GPUs, else the CPU; where its stages, its
    data and its collectives' tensors live (nccl takes no CPU tensors)."""
    import os

    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def make_mesh(plan: ir.Plan, world: int) -> Any:
    """The (pp, dp, tp) DeviceMesh: rank = pipeline rank x (dp x tp) + replica x tp + tensor rank. The plan lists
    each stage's devices as ``dp`` tensor groups of ``tp`` consecutive devices: rank r is the plan's r-th device."""
    from torch.distributed.device_mesh import init_device_mesh

    first = plan.stages[0]
    k = plan.pipeline_stages
    if world != k * first.width:
        raise ExportError(f"the plan needs {k * first.width} processes, {world} were started",
                          "start plan.world_size processes")
    return init_device_mesh(device().type, (k, first.dp, first.tp), mesh_dim_names=MESH_DIMS)


def loss_parts(plan: ir.Plan) -> int:
    """In how many parts the last stage's tensor group computes each micro-batch's loss: each rank on its
    share of the samples (the cost model's loss time is divided by tp) when tp divides them, else whole."""
    last = plan.stages[-1]
    return last.tp if last.tp > 1 and plan.micro_batch_size(last) % last.tp == 0 else 1


def _stage_module(layers: Sequence[nn.Module], plan: ir.Plan, c: int, mesh: Any) -> nn.Module:
    """Chunk ``c``'s layers with its tensor parallelism, recomputation, precision and ZeRO; a chunk but the
    last sends its output contiguous (planner.export.outputs)."""
    st = plan.stages[c]
    sub = nn.Sequential(*layers[st.layers[0]:st.layers[1]]).to(device())
    if st.tp > 1:
        shard_output = c == len(plan.stages) - 1 and loss_parts(plan) > 1
        kinds = [(x.type, (x.in_features, x.out_features)) for x in plan.profile.layers[st.layers[0]:st.layers[1]]]
        parallel.shard_stage(sub, st.forms, mesh["tp"], st.sequence_parallel, c, st.layers[0], shard_output, kinds)
    recomputed = plan.profile.recomputed_layers(*st.layers)
    recompute = sharding.with_recompute(sub, st.recompute, recomputed, plan.profile.blockwise_recompute)
    if st.zero in (2, 3):  # FSDP's mixed precision computes in bf16
        sharding.fully_shard_stage(recompute, list(sub), mesh["dp"], st.zero, plan.precision)
        module = recompute
    else:
        module = sharding.with_precision(recompute, plan.precision)
    if c < len(plan.stages) - 1:  # its output is sent: contiguous and differentiable (planner.export.outputs)
        module.register_forward_hook(sent_output)
    return module


def build_stages(layers: Sequence[nn.Module], plan: ir.Plan, rank: int, world: int) -> tuple[list[Any], Any]:
    """This rank's PipelineStages (one, or v for interleaved) and the (pp, dp, tp) DeviceMesh."""
    from torch.distributed.pipelining import PipelineStage

    mesh = make_mesh(plan, world)
    pp_rank = mesh.get_coordinate()[0]
    k = plan.pipeline_stages
    stages = []
    for c in range(len(plan.stages)):
        if c % k == pp_rank:
            stages.append(PipelineStage(_stage_module(layers, plan, c, mesh), c, len(plan.stages), device(),
                                        group=mesh["pp"].get_group()))
    return stages, mesh


class _PartLoss:
    """The loss of one of ``parts`` equal shares of a micro-batch, over ``parts``: the shares' sum is the
    micro-batch's mean loss, and so are the gradients that reach the shared layers."""

    def __init__(self, loss: str, parts: int) -> None:
        self.fn, self.parts = make_loss(loss), parts

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.fn(output, target) / self.parts


def _make_schedule(stages: list[Any], plan: ir.Plan, loss: str) -> Any:
    """The torch pipelining schedule for ``plan.schedule`` over this rank's stages."""
    from torch.distributed import pipelining

    kind = schedule_kind(plan.schedule)
    cls = getattr(pipelining, SCHEDULES[plan.schedule])
    return cls(stages if plan.virtual_stages > 1 or kind.torch_stage_list else stages[0],
               plan.microbatches, loss_fn=_PartLoss(loss, loss_parts(plan)), **sharding.unscaled(cls))


def _run_schedule(schedule: Any, first: bool, last: bool, xs: torch.Tensor, ys: torch.Tensor) -> list[torch.Tensor]:
    """One pipelined step: the first stage feeds inputs, the last targets; the last stage's micro-batch losses.
    ``return_outputs=False``: the last stage would otherwise keep every micro-batch's output (GPT-2's logits:
    51.5 MB each at 2 x 128 tokens) through the optimizer step, which nothing reads and the cost model does not
    count."""
    losses: list[torch.Tensor] = []
    if first and last:
        schedule.step(xs, target=ys, losses=losses, return_outputs=False)
    elif first:
        schedule.step(xs, return_outputs=False)
    elif last:
        schedule.step(target=ys, losses=losses, return_outputs=False)
    else:
        schedule.step(return_outputs=False)
    return losses


def _global_mean_loss(losses: list[torch.Tensor], dev: torch.device, width: int) -> float:
    """The step's mean loss on the global batch: the last stage's means summed over all ranks, over the
    number of whole copies of the batch they hold (``width``: dp x tp, or dp when each tensor rank's
    loss is its part of the micro-batch's)."""
    import torch.distributed as dist

    mean = torch.stack([t.detach().float() for t in losses]).mean() if losses else torch.zeros(())
    total = mean.reshape(1).to(dev)
    dist.all_reduce(total)
    return float(total) / width


class Trainer:
    """This rank's part of the plan: its stages, schedule and optimizer; ``trainer(x, y)`` is one step.

    Every rank passes the same global batch; its data-parallel replica takes its share of
    every micro-batch, and its tensor group sees the same samples.
    """

    def __init__(self, layers: Sequence[nn.Module], plan: ir.Plan, loss: str, lr: float | None = None) -> None:
        import torch.distributed as dist

        check_plan(plan, layers)
        check_layers_match(layers, plan.profile, ExportError)
        self.plan, self.layers = plan, list(layers)
        ties = find_ties(layers)
        self.stages, self.mesh = build_stages(layers, plan, dist.get_rank(), dist.get_world_size())
        self.ties = tie_sync(layers, ties, plan, self.mesh)
        align_ties(self.ties)  # the same seed built them equal; a broadcast guards against drift
        self.schedule = _make_schedule(self.stages, plan, loss)
        self.params = list({id(p): p for s in self.stages for p in s.submod.parameters()}.values())
        self.split_params = list({id(p): p for i in self._sample_split_layers()
                                  for p in layers[i].parameters()}.values())
        self.zero = _rank_zero(plan, [s.stage_index for s in self.stages])
        rate = DEFAULT_LR[plan.optimizer] if lr is None else lr
        self.opt = sharding.optimizer(plan.optimizer, self.params, rate, self.zero, self.mesh["dp"].get_group())

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> float:
        m, dp, parts = self.plan.microbatches, self.mesh["dp"].size(), loss_parts(self.plan)
        _, replica, tensor_rank = self.mesh.get_coordinate()
        dev = device()
        xs = torch.cat([sub_batch(x, i, replica, m, dp) for i in range(m)]).to(dev)
        ys = torch.cat([sub_batch(sub_batch(y, i, replica, m, dp), 0, tensor_rank % parts, 1, parts)
                        for i in range(m)]).to(dev)  # the last stage's loss: this rank's share of the samples
        for p in self.params:  # the parameters' own gradients (ZeRO-1 steps local proxies of them)
            p.grad = None
        with sharding.casts_per_step([s.submod for s in self.stages]):  # bf16: one cast of each weight a step
            losses = _run_schedule(self.schedule, any(s.is_first for s in self.stages),
                                   any(s.is_last for s in self.stages), xs, ys)
        sharding.mean_over_microbatches(self.params, m)  # once per parameter, not per chunk holding it
        sum_tie_grads(self.ties)
        if self.split_params:  # each tensor rank's gradient is its share of the samples' part
            sharding.sum_grads(self.split_params, self.mesh["tp"].get_group())
        if self.zero < 2 and dp > 1:
            sharding.average_grads(self.params, self.mesh["dp"].get_group(), dp)
        sharding.zero1_grads(self.opt)
        self.opt.step()
        return _global_mean_loss(losses, dev, dp * self.mesh["tp"].size() // parts)

    def _sample_split_layers(self) -> list[int]:
        """This rank's layers that compute their share of the samples (dp forms in a tensor group), read
        back from the layout hooks planner.export.parallel registered."""
        out = []
        for s in self.stages:
            first, end = self.plan.stages[s.stage_index].layers
            out += [first + j for j, split in enumerate(parallel.sample_split(self.layers[first:end])) if split]
        return out

    def describe(self) -> dict[str, Any]:
        """What this rank actually built (read back from its modules): mesh coordinates, layers, the
        layers sharded over the tensor group, those computing its share of the samples, ZeRO stage,
        recomputation wrappers, bf16 compute, the layers whose weights it freed (planner.export.building)."""
        index = {id(m): i for i, m in enumerate(self.layers)}
        mods = [m for s in self.stages for m in s.submod.modules()]
        return {"rank": torch.distributed.get_rank(),
                "coords": dict(zip(MESH_DIMS, self.mesh.get_coordinate(), strict=True)),
                "stages": [s.stage_index for s in self.stages],
                "layers": sorted({index[id(m)] for m in mods if id(m) in index}),
                "tp_layers": sorted({index[id(m)] for m in mods if id(m) in index and _tensor_sharded(m)}),
                "sample_split_layers": self._sample_split_layers(),
                "zero": sharding.zero_stage_of([s.submod for s in self.stages], self.opt),
                "recompute": sorted({m.mode for m in mods if isinstance(m, sharding.Checkpointed)}),
                "bf16": sharding.computes_in_bf16(mods), "released_layers": released_layers(self.layers)}


def _rank_zero(plan: ir.Plan, chunks: Sequence[int]) -> int:
    """The ZeRO stage of this rank's chunks (stages may differ; the chunks of one rank may not)."""
    zeros = sorted({plan.stages[c].zero for c in chunks})
    if len(zeros) > 1:
        raise ExportError(f"chunks {', '.join(map(str, chunks))} on one device use ZeRO stages "
                          f"{', '.join(map(str, zeros))}", "give the chunks of one device group one ZeRO stage")
    return zeros[0]


def _tensor_sharded(module: nn.Module) -> bool:
    """Whether a parameter of ``module`` is sharded (``Shard``) along the ``tp`` mesh dimension."""
    from torch.distributed.tensor import DTensor, Shard

    for p in module.parameters():
        if isinstance(p, DTensor):
            names = p.device_mesh.mesh_dim_names or ()
            if any(n == "tp" and isinstance(pl, Shard) for n, pl in zip(names, p.placements, strict=True)):
                return True
    return False


def make_trainer(layers: Sequence[nn.Module], plan: ir.Plan, loss: str, lr: float | None = None) -> Trainer:
    """Build this rank's stages and schedule; returns ``step(x, y) -> mean loss`` on the global batch
    (a :class:`Trainer`: ``step.describe()`` says what this rank built)."""
    return Trainer(layers, plan, loss, lr)


SCRIPT = '''\
#!/usr/bin/env python
"""Train the plan in plan.json with torch.distributed.pipelining (written by `planner export`).

Plan: {model}, {stages} stages x (tp {tp} x dp {dp}) = {world} processes, config {config}, schedule
{schedule} ({cls}), {micro} micro-batches, batch {batch}, precision {precision}.
Stage boundaries (layer index ranges): {ranges}. Forms per stage: {forms}.
ZeRO stage {zero}; recomputation per stage: {recompute}.

Run (CPU: gloo; GPU: nccl):
    torchrun --standalone --nproc_per_node {world} train.py [--model MODEL] [--steps N] [--lr LR] [--report DIR]

What it does:
  1. builds the model MODEL (default: the profiled one, {model_repr}, with the profile's --set
     overrides if it has any) and splits it into exactly the profiled layers
     (planner.profiler.layers.split_model), and frees the weights this rank does not run (in
     turns per server where needed: planner.export.building);
  2. on a (pp={pp}, dp={dp}, tp={tp}) DeviceMesh, makes this rank's PipelineStage(s) from the
     plan's layer ranges, shards tp/split forms over the tensor group with DTensor (Megatron
     blocks, ColwiseParallel/RowwiseParallel), wraps recomputation and bf16 compute, applies ZeRO
     (FSDP2 / ZeroRedundancyOptimizer), and drives them with {cls}
     (planner.export.torch.make_trainer);
  3. trains on synthetic data of the profiled input shape with the plan's optimizer ({optimizer}).
Replace the data in `main()` with yours: every rank passes the same global batch; each takes its part.
"""
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from planner import ir
from planner.export.args import script_args
from planner.export.building import build_turn, release_others
from planner.export.data import data_spec
from planner.export.launched import check_launch, run
from planner.export.layers import load_layers
from planner.export.torch import make_trainer

HERE = Path(__file__).resolve().parent


def main() -> None:
    args = script_args(__doc__, {default_model}, report=True)
    plan = ir.Plan.from_dict(json.loads((HERE / "plan.json").read_text()))
    check_launch(plan, gpus=torch.cuda.device_count())  # a launcher, the plan's processes, a GPU each
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    with build_turn(plan):  # a server's processes build in turns where whole models would not fit its memory
        layers, example = load_layers(args.model, plan, args.seed)
        spec = data_spec(layers, example, args.loss)
        release_others(layers, plan, dist.get_rank())  # this rank keeps its stages' weights only
    step = make_trainer(layers, plan, args.loss, args.lr)
    losses = []
    for s in range(args.steps):
        x, y = spec.batch(s, plan.batch_size, args.seed)
        losses.append(step(x, y))
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"step {{s}} loss {{losses[-1]:.6f}}", flush=True)
    if args.report:  # what this rank built (read back from its modules), the server it ran on, its losses
        report = {{**step.describe(), "node_rank": int(os.environ.get("GROUP_RANK", "0")), "losses": losses}}
        Path(args.report, f"rank{{dist.get_rank()}}.json").write_text(json.dumps(report))
    dist.barrier()  # every rank done before any leaves (a peer's gloo threads may still talk to it)
    dist.destroy_process_group()


if __name__ == "__main__":
    run(main)  # a refusal prints error: and hint: lines, exit 1
'''


def script_text(plan: ir.Plan) -> str:
    check_plan(plan)
    first = plan.stages[0]
    return SCRIPT.format(default_model=repr(plan.model), **docstring_fields(
        model=plan.model, model_repr=repr(plan.model), stages=len(plan.stages), tp=first.tp, dp=first.dp,
        world=plan.world_size, config=plan.config, schedule=plan.schedule, cls=SCHEDULES[plan.schedule],
        micro=plan.microbatches, batch=plan.batch_size, precision=plan.precision, pp=plan.pipeline_stages,
        optimizer=plan.optimizer, zero=first.zero, recompute=", ".join(s.recompute for s in plan.stages),
        ranges=", ".join(f"[{a}, {b})" for a, b in ranges(plan)),
        forms="; ".join(",".join(s.forms) for s in plan.stages)))

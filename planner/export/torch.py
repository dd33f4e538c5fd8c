"""Plan -> torch-native pipeline: ``torch.distributed.pipelining`` stages on a DeviceMesh.

Ranks form a ``(pp, w)`` DeviceMesh of K stages x W devices; stage ``s``'s device ``j`` is
global rank ``s * W + j`` (as for DeepSpeed). Each stage is a ``PipelineStage`` over
``nn.Sequential(layers[first:end])`` (exactly the profiled layers), driven by the schedule
class that matches ``plan.schedule``:

=============  ================================================================
plan           torch.distributed.pipelining
=============  ================================================================
gpipe          ScheduleGPipe
1f1b           Schedule1F1B
interleaved    ScheduleInterleaved1F1B (chunk c on pipeline rank c mod K)
zb-h1          ScheduleInterleavedZeroBubble (backward split into input and weight grads)
pipedream      refused: asynchronous weight stashing has no torch equivalent
=============  ================================================================

The ``w`` mesh dimension has one of two meanings, chosen per plan:

* every layer ``dp``: data parallel across W pipeline replicas; replica ``j`` trains its
  share of every micro-batch and the stage's gradients are averaged over the ``w`` group
  after each step (what DDP would do, without DDP's hooks that pipelining bypasses);
* some layer ``split_out``/``split_in``: tensor parallel inside each stage through DTensor:
  ``split_out`` = ``ColwiseParallel`` (output features sharded; outputs gathered unless the
  next layer is ``split_in``), ``split_in`` = ``RowwiseParallel`` (input features sharded;
  partial outputs all-reduced). The W devices of a stage see the whole micro-batch, and
  ``dp``-form layers in such a plan run replicated on them (same result, no batch split).
  Supported layers: an ``nn.Linear``, or a layer holding exactly one ``nn.Linear`` (other
  modules in it, like activations, stay replicated). Convolutions and other layers have no
  DTensor parallel style and are refused with ExportError naming the stage and layer.

Tied weights (a parameter several layers hold) are kept in sync: the same seed builds
them equal on every rank, and their gradients are summed over the stages that hold them
after every step (a process group per tie and replica).

Gradient scaling: each micro-batch's loss is its mean; the schedule divides gradients by M
(``scale_grads``), the replicas' average divides by W, so a step equals one step of the
unsplit model on the mean loss of the whole batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from planner import ir
from planner.errors import ExportError
from planner.export.data import sub_batch
from planner.export.layers import check_layers_match, find_ties
from planner.export.losses import make_loss
from planner.export.optim import DEFAULT_LR, torch_optimizer
from planner.export.partition import check_common, ranges
from planner.schedule import SCHEDULE_KINDS, find_kind, schedule_kind

SCHEDULES = {name: kind.torch_class for name, kind in SCHEDULE_KINDS.items() if kind.torch_class is not None}
"""plan.schedule -> its torch.distributed.pipelining class (planner.schedule's ``torch_class``)."""


def tensor_parallel(plan: ir.Plan) -> bool:
    """Whether the plan splits any layer (the ``w`` mesh dimension is then tensor parallel)."""
    return any(f != "dp" for st in plan.stages for f in st.forms)


def check_plan(plan: ir.Plan, layers: Sequence[nn.Module] | None = None) -> int:
    """Refuse what the torch export cannot run; return the data-parallel width (1 when split)."""
    kind = find_kind(plan.schedule)
    if kind is None or not kind.runs_on("torch"):
        raise ExportError(f"schedule {plan.schedule!r} has no torch.distributed.pipelining equivalent",
                          "search with `planner search --engine torch --schedule 1f1b` (or gpipe, interleaved, "
                          "zb-h1)")
    k = len(plan.stages)
    v = plan.virtual_stages
    if k % v:
        raise ExportError(f"{k} stages are not {v} chunks per device", "re-run planner search")
    widths = {s.width for s in plan.stages}
    if len(widths) != 1:
        i = next(i for i, s in enumerate(plan.stages) if s.width != plan.stages[0].width)
        raise ExportError(f"stage {i} has {plan.stages[i].width} devices but stage 0 has {plan.stages[0].width}: "
                          "torch pipelining needs every stage the same width",
                          "search a runnable plan with `planner search --engine torch`")
    width = widths.pop()
    if not tensor_parallel(plan):
        return check_common(plan, "torch")
    if plan.batch_size % plan.microbatches:
        raise ExportError(f"batch {plan.batch_size} is not {plan.microbatches} equal micro-batches",
                          "choose --microbatches that divides the batch")
    if layers is not None:
        for i, st in enumerate(plan.stages):
            for j, form in enumerate(st.forms):
                if form != "dp":
                    _split_target(layers[st.layers[0] + j], i, st.layers[0] + j, form)
                    _check_divisible(layers[st.layers[0] + j], width, i, st.layers[0] + j, form)
    return 1


def _split_target(layer: nn.Module, stage: int, index: int, form: str) -> str:
    """The dotted name of the one nn.Linear a split form shards in ``layer``."""
    linears = [name for name, m in layer.named_modules() if isinstance(m, nn.Linear)]
    if len(linears) != 1:
        kinds = sorted({type(m).__name__ for m in layer.modules() if any(True for _ in m.parameters(recurse=False))})
        raise ExportError(
            f"stage {stage}: layer {index} ({type(layer).__name__}, weights in {', '.join(kinds) or 'none'}) "
            f"cannot run the {form} form: the torch export shards exactly one nn.Linear per layer "
            "(DTensor has no parallel style for convolutions or other layers)",
            "search with `planner search --engine deepspeed` (dp forms only), or keep this layer dp")
    return linears[0]


def _check_divisible(layer: nn.Module, width: int, stage: int, index: int, form: str) -> None:
    lin = layer.get_submodule(_split_target(layer, stage, index, form))
    assert isinstance(lin, nn.Linear)
    n = lin.out_features if form == "split_out" else lin.in_features
    if n % width:
        raise ExportError(f"stage {stage}: layer {index}'s {n} {'output' if form == 'split_out' else 'input'} "
                          f"features do not split over {width} devices", "search with other widths")


def device() -> torch.device:
    import os

    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


class _Checkpointed(nn.Module):  # type: ignore[misc]
    """A stage that keeps only its input and recomputes its forward in backward (GPipe)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.utils.checkpoint.checkpoint(self.inner, x, use_reentrant=False)


def _parallelize(module: nn.Sequential, forms: Sequence[str], mesh: Any, stage: int, first: int) -> None:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan: dict[str, Any] = {}
    for j, form in enumerate(forms):
        if form == "dp":
            continue
        target = _split_target(module[j], stage, first + j, form)
        name = f"{j}.{target}" if target else str(j)
        nxt = forms[j + 1] if j + 1 < len(forms) else "dp"
        prev = forms[j - 1] if j > 0 else "dp"
        if form == "split_out":
            plan[name] = ColwiseParallel(output_layouts=Shard(-1) if nxt == "split_in" else Replicate())
        else:
            plan[name] = RowwiseParallel(input_layouts=Shard(-1) if prev == "split_out" else Replicate())
    parallelize_module(module, mesh, plan)


def build_stages(layers: Sequence[nn.Module], plan: ir.Plan, rank: int, world: int) -> tuple[list[Any], Any]:
    """This rank's PipelineStages (one, or v for interleaved) and the (pp, w) DeviceMesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import PipelineStage

    width = plan.stages[0].width
    k = len(plan.stages) // plan.virtual_stages
    if world != k * width:
        raise ExportError(f"the plan needs {k * width} processes, {world} were started", "start plan.world_size")
    dev = device()
    mesh = init_device_mesh(dev.type, (k, width), mesh_dim_names=("pp", "w"))
    pp_rank = rank // width
    stages = []
    for c, st in enumerate(plan.stages):
        if c % k != pp_rank:
            continue
        sub = nn.Sequential(*layers[st.layers[0]:st.layers[1]]).to(dev)
        if tensor_parallel(plan):
            _parallelize(sub, st.forms, mesh["w"], c, st.layers[0])
        mod: nn.Module = _Checkpointed(sub) if st.recompute == "full" else sub
        stages.append(PipelineStage(mod, c, len(plan.stages), dev, group=mesh["pp"].get_group()))
    return stages, mesh


def _tie_groups(layers: Sequence[nn.Module], plan: ir.Plan, rank: int, width: int) -> list[tuple[Any, nn.Parameter]]:
    """Process groups (per replica) over the ranks whose stages hold a tied parameter."""
    k = len(plan.stages) // plan.virtual_stages
    owner = {}
    for c, st in enumerate(plan.stages):
        for i in range(*st.layers):
            owner[i] = c % k
    out = []
    for tie in find_ties(layers):
        pp_ranks = sorted({owner[i] for i in tie.layers})
        if len(pp_ranks) < 2:
            continue
        param = layers[tie.layers[0]].get_parameter(tie.paths[0])
        for j in range(width):  # every rank creates every group, in the same order
            ranks = [p * width + j for p in pp_ranks]
            group = torch.distributed.new_group(ranks)
            if rank in ranks:
                out.append((group, param))
    return out


def _make_schedule(stages: list[Any], plan: ir.Plan, loss: str) -> Any:
    """The torch pipelining schedule for ``plan.schedule`` over this rank's stages."""
    from torch.distributed import pipelining

    kind = schedule_kind(plan.schedule)
    cls = getattr(pipelining, SCHEDULES[plan.schedule])
    return cls(stages if plan.virtual_stages > 1 or kind.torch_stage_list else stages[0],
               plan.microbatches, loss_fn=make_loss(loss))


def _run_schedule(schedule: Any, first: bool, last: bool, xs: torch.Tensor, ys: torch.Tensor) -> list[torch.Tensor]:
    """One pipelined step: the first stage feeds inputs, the last targets; the last stage's micro-batch losses."""
    losses: list[torch.Tensor] = []
    if first and last:
        schedule.step(xs, target=ys, losses=losses)
    elif first:
        schedule.step(xs)
    elif last:
        schedule.step(target=ys, losses=losses)
    else:
        schedule.step()
    return losses


def _sum_tie_grads(ties: list[tuple[Any, nn.Parameter]]) -> None:
    """Sum each tied parameter's gradient over the stages holding it."""
    import torch.distributed as dist

    for group, param in ties:
        if param.grad is None:
            param.grad = torch.zeros_like(param)
        dist.all_reduce(param.grad, group=group)


def _average_grads(params: list[nn.Parameter], group: Any, dp_width: int) -> None:
    """Average gradients over the ``dp_width`` pipeline replicas (what DDP would do)."""
    import torch.distributed as dist

    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, group=group)
        p.grad /= dp_width


def _global_mean_loss(losses: list[torch.Tensor], dev: torch.device, width: int) -> float:
    """The step's mean loss on the global batch: the last stages' means summed over all ranks, over W."""
    import torch.distributed as dist

    mean = torch.stack([t.detach().float() for t in losses]).mean() if losses else torch.zeros(())
    total = mean.reshape(1).to(dev)
    dist.all_reduce(total)
    return float(total) / width


def make_trainer(layers: Sequence[nn.Module], plan: ir.Plan, loss: str,
                 lr: float | None = None) -> Callable[[torch.Tensor, torch.Tensor], float]:
    """Build this rank's stages and schedule; returns ``step(x, y) -> mean loss`` on the global batch."""
    import torch.distributed as dist

    check_plan(plan, layers)
    check_layers_match(layers, plan.profile, ExportError)
    rank, world = dist.get_rank(), dist.get_world_size()
    width = plan.stages[0].width
    tp = tensor_parallel(plan)
    stages, mesh = build_stages(layers, plan, rank, world)
    ties = _tie_groups(layers, plan, rank, width)
    for group, param in ties:  # same seed already; broadcast guards against drift
        dist.broadcast(param.data, src=dist.get_global_rank(group, 0), group=group)
    schedule = _make_schedule(stages, plan, loss)
    params = list({id(p): p for s in stages for p in s.submod.parameters()}.values())
    opt = torch_optimizer(plan.optimizer, params, DEFAULT_LR[plan.optimizer] if lr is None else lr)
    dp_group = mesh["w"].get_group()
    replica = 0 if tp else rank % width
    dp_width = 1 if tp else width
    m = plan.microbatches
    first = any(s.is_first for s in stages)
    last = any(s.is_last for s in stages)
    dev = device()

    def step(x: torch.Tensor, y: torch.Tensor) -> float:
        xs = torch.cat([sub_batch(x, i, replica, m, dp_width) for i in range(m)]).to(dev)
        ys = torch.cat([sub_batch(y, i, replica, m, dp_width) for i in range(m)]).to(dev)
        opt.zero_grad()
        losses = _run_schedule(schedule, first, last, xs, ys)
        _sum_tie_grads(ties)
        if dp_width > 1:
            _average_grads(params, dp_group, dp_width)
        opt.step()
        return _global_mean_loss(losses, dev, width)

    return step


SCRIPT = '''\
#!/usr/bin/env python
"""Train the plan in plan.json with torch.distributed.pipelining (written by `planner export`).

Plan: {model}, {stages} stages x {width} = {world} processes, config {config}, schedule {schedule}
({cls}), {micro} micro-batches, batch {batch}; the width dimension is {wmeaning}.
Stage boundaries (layer index ranges): {ranges}. Forms per stage: {forms}.

Run (CPU: gloo; GPU: nccl):
    torchrun --standalone --nproc_per_node {world} train.py [--model MODEL] [--steps N]

What it does:
  1. builds the model MODEL (default: the profiled one, {model!r}) and splits it into exactly
     the profiled layers (planner.profiler.layers.split_model);
  2. on a (pp={pp}, w={width}) DeviceMesh, makes this rank's PipelineStage(s) from the plan's
     layer ranges, shards split_out/split_in layers with DTensor ColwiseParallel/RowwiseParallel,
     and drives them with {cls} (planner.export.torch.make_trainer);
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
from planner.export.data import data_spec
from planner.export.layers import load_layers
from planner.export.torch import make_trainer

HERE = Path(__file__).resolve().parent


def main() -> None:
    args = script_args(__doc__, {model!r})
    plan = ir.Plan.from_dict(json.loads((HERE / "plan.json").read_text()))
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    layers, example = load_layers(args.model, plan, args.seed)
    spec = data_spec(layers, example, args.loss)
    step = make_trainer(layers, plan, args.loss)
    for s in range(args.steps):
        x, y = spec.batch(s, plan.batch_size, args.seed)
        loss = step(x, y)
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"step {{s}} loss {{loss:.6f}}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''


def script_text(plan: ir.Plan) -> str:
    check_plan(plan)
    width = plan.stages[0].width
    return SCRIPT.format(
        model=plan.model, stages=len(plan.stages), width=width, world=plan.world_size, config=plan.config,
        schedule=plan.schedule, cls=SCHEDULES[plan.schedule], micro=plan.microbatches, batch=plan.batch_size,
        pp=len(plan.stages) // plan.virtual_stages, optimizer=plan.optimizer,
        wmeaning="tensor parallel (DTensor)" if tensor_parallel(plan) else "data parallel across pipelines",
        ranges=", ".join(f"[{a}, {b})" for a, b in ranges(plan)),
        forms="; ".join(",".join(s.forms) for s in plan.stages))

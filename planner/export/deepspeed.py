"""Plan -> DeepSpeed: a ``PipelineModule`` with exactly the plan's stages, and its config.

DeepSpeed's ``PipelineModule`` picks stage boundaries itself (``partition_method``:
``uniform``, ``parameters``, ``type:regex``); none can express an explicit split. We
subclass it and override ``_partition_layers`` so that ``parts`` are the plan's boundaries
(pinned by tests/test_export_deepspeed.py, which checks each rank's layer range).

Topology: ``PipeDataParallelTopology(num_pp=K, num_dp=W)``; DeepSpeed orders ranks with
the data axis fastest, so stage ``s``'s devices ``stage.devices[j]`` are global ranks
``s * W + j``. What DeepSpeed can run (planner.runnable's deepspeed limits, refused with
ExportError naming the stage and ``--engine deepspeed``): a pipe x data grid with every stage
the same width ``W`` and no tensor parallelism (DeepSpeed's pipeline has no tensor-split
layers), schedule ``1f1b`` (its ``TrainSchedule``), ZeRO 0 or 1 (its pipeline engine asserts
stage < 2) in ``zero_optimization``, recomputation none or full (the stage's layers up to the model's
last transformer block checkpointed: in a model with blocks each on its own, ``activation_checkpoint_interval``
= 1 and the chunks before the head checkpointed; else as one chunk of that many layers, the only one
checkpointed; ``ModelProfile.blockwise_recompute``, as the cost model counts it), fp32 or bf16/fp16 in
the config.

Tied weights go through DeepSpeed's ``TiedLayerSpec`` (:mod:`planner.export.deepspeed_ties`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
from torch import nn

from planner import grad_buffers, ir, runnable
from planner.errors import ExportError, PlanError
from planner.export.data import sub_batch
from planner.export.deepspeed_ties import layer_specs
from planner.export.layers import as_layers, check_layers_match
from planner.export.losses import make_loss
from planner.export.optim import DEFAULT_LR
from planner.export.outputs import contiguous, differentiable
from planner.export.partition import boundaries, check_common, micro_batch_size, ranges
from planner.export.quoting import docstring_fields
from planner.export.sharding import cast_running_stats


def skip_shm_build() -> None:
    """Skip the C++ op DeepSpeed's CPU accelerator JIT-builds at its first init_distributed (~35 s).

    The op (``deepspeed_shm_comm``) only speeds up inference all-reduce on CPU; training
    collectives go through torch.distributed either way. Call before ``init_distributed``.
    (``import deepspeed.comm.torch`` binds the name to torch itself: deepspeed.comm
    re-exports torch, so the module is taken from sys.modules.)
    """
    import sys

    import deepspeed.comm.torch  # noqa: F401

    ds_comm: Any = sys.modules["deepspeed.comm.torch"]
    ds_comm.build_shm_op = lambda: None


def check_plan(plan: ir.Plan, layers: Sequence[nn.Module] | None = None) -> int:
    """Refuse what DeepSpeed cannot run (planner.runnable's rules for it, and with ``layers`` their own: a
    stage that trains nothing, :func:`check_trainable`); return the data-parallel width."""
    try:
        runnable.check_runnable(plan, "deepspeed")
    except PlanError as exc:
        raise ExportError(exc.cause, exc.hint) from None
    if layers is not None:
        check_trainable(layers, plan)
    return check_common(plan, "deepspeed")


def precision_config(precision: str) -> dict[str, Any]:
    """DeepSpeed's mixed precision: ``bf16`` (bf16 weights and activations; under ZeRO-1 the
    ``DeepSpeedZeroOptimizer`` keeps fp32 master partitions and optimizer state) or ``fp16`` (with
    DeepSpeed's dynamic loss scale; written, not run in the tests: CPU has no fp16 training path)."""
    if precision == "bf16":
        return {"bf16": {"enabled": True}}
    if precision == "fp16":
        return {"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}}
    return {}


def with_fused_adam(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with torch's fused Adam kernel (CUDA or the CPU, the devices DeepSpeed's runs here take) unless
    the config's Adam says otherwise (``"fused": false``): one pass of 28 bytes a value and no temporaries, as
    the cost model counts, where torch's defaults make seven passes or loop tensor by tensor
    (planner.export.optim)."""
    if config["optimizer"]["type"] == "Adam":
        config["optimizer"]["params"].setdefault("fused", True)
    return config


def ds_config(plan: ir.Plan, lr: float | None = None) -> dict[str, Any]:
    """The DeepSpeed config: micro-batch per GPU, accumulation = micro-batches, a torch optimizer,
    the plan's ZeRO stage (0 or 1: DeepSpeed's pipeline engine runs no more) and precision.

    Gradient clipping is off (DeepSpeed's default clips to 1.0). DeepSpeed's FusedAdam op is never built:
    Adam is selected with ``torch_adam`` (and ``adam_w_mode`` off, so it is
    ``torch.optim.Adam``; :func:`with_fused_adam` adds torch's fused kernel); the other
    optimizers are torch.optim classes.
    """
    width = check_plan(plan)
    lr = DEFAULT_LR[plan.optimizer] if lr is None else lr
    optimizers: dict[str, dict[str, Any]] = {
        "sgd": {"type": "SGD", "params": {"lr": lr}},
        "momentum": {"type": "SGD", "params": {"lr": lr, "momentum": 0.9}},
        "adam": {"type": "Adam", "params": {"lr": lr, "torch_adam": True, "adam_w_mode": False}},
        "rmsprop": {"type": "RMSprop", "params": {"lr": lr}},
    }
    return {
        "train_batch_size": plan.batch_size,
        "train_micro_batch_size_per_gpu": micro_batch_size(plan, width),
        "gradient_accumulation_steps": plan.microbatches,
        "optimizer": optimizers[plan.optimizer],
        # DeepSpeed 0.19 clips gradients to norm 1.0 unless told otherwise; a plan trains
        # exactly like the unsplit model, so clipping is off (set it here if you want it).
        "gradient_clipping": 0.0,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        # ZeRO-1 allocates two fp32 buffers of reduce_bucket_size elements (5e8 by default: 3.8 GB a
        # rank); bounded here, and charged by the cost model (planner.grad_buffers.deepspeed_bucket_params)
        "zero_optimization": {"stage": plan.stages[0].zero,
                              **({"reduce_bucket_size": grad_buffers.deepspeed_bucket_params(plan.profile.param_count)}
                                 if plan.stages[0].zero == 1 else {})},
        # ZeRO wraps the torch optimizers above; DeepSpeed asks to confirm those it did not test
        **({"zero_allow_untested_optimizer": True} if plan.stages[0].zero else {}),
        **precision_config(plan.precision),
    }


def optimizer_params(module: nn.Module) -> list[Any]:
    """The stage's trainable parameters for ``deepspeed.initialize``; one empty parameter group when it has
    none (every weight frozen): torch's optimizers refuse an empty list, and DeepSpeed drops empty groups."""
    trainable = [p for p in module.parameters() if p.requires_grad]
    return trainable if trainable else [{"params": []}]


COMPUTE_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}
"""The dtype DeepSpeed's bf16 and fp16 modes cast the weights to (fp32 plans: none)."""


def to_compute_dtype(value: Any, dtype: torch.dtype | None) -> Any:
    """Floating-point tensors (alone, or in a tuple or list) in ``dtype``; integers (token ids) as they are.

    DeepSpeed casts the weights to bf16 or fp16 but hands a stage its input unchanged: the first stage's
    float data, or another stage's fp32 output, would meet bf16 weights ("mat1 and mat2 must have the same dtype").
    """
    if dtype is None:
        return value
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() and value.dtype != dtype else value
    if isinstance(value, (tuple, list)):
        return type(value)(to_compute_dtype(v, dtype) for v in value)
    return value


def _explicit_class() -> type:
    from deepspeed.pipe import PipelineModule

    class ExplicitPipelineModule(PipelineModule):  # type: ignore[misc]
        """A PipelineModule whose stage boundaries are given, not computed, whose stages take
        their floating-point inputs in the engine's compute dtype and send their outputs contiguous."""

        def __init__(self, layers: Sequence[Any], parts: Sequence[int], compute_dtype: torch.dtype | None = None,
                     recomputed: int = 0, **kwargs: Any) -> None:
            object.__setattr__(self, "_explicit_parts", list(parts))
            object.__setattr__(self, "_recomputed", recomputed)
            object.__setattr__(self, "_compute_dtype", compute_dtype)
            super().__init__(layers, partition_method="uniform", **kwargs)

        def forward(self, forward_input: Any) -> Any:
            out = super().forward(to_compute_dtype(forward_input, object.__getattribute__(self, "_compute_dtype")))
            if self.stage_id < self.num_stages - 1:  # sent to the next stage: gloo sends contiguous tensors
                out = contiguous(out)
            return differentiable(out)

        def _partition_layers(self, method: str = "uniform") -> None:
            parts = object.__getattribute__(self, "_explicit_parts")
            if len(parts) != self.num_stages + 1 or parts[-1] != len(self._layer_specs):
                raise ExportError(f"stage boundaries {parts} do not fit {self.num_stages} stages of "
                                  f"{len(self._layer_specs)} layers", "re-run planner search")
            self.parts = list(parts)
            stage_id = self._topo.get_coord(self.global_rank).pipe
            self._set_bounds(start=self.parts[stage_id], stop=self.parts[stage_id + 1])

        def _is_checkpointable(self, funcs: Sequence[Any]) -> bool:
            """A chunk is checkpointed when it lies among the stage's first ``recomputed`` layers (its layers up
            to the model's last transformer block; the head after it runs as it is)."""
            k = object.__getattribute__(self, "_recomputed")
            return len(funcs) > 0 and any(f is funcs[0] for f in self.forward_funcs[:k])

        def _synchronize_tied_weights(self) -> None:
            # DeepSpeed broadcasts the tied parameters in place with autograd on: c10d's
            # broadcast_ then enters the graph and the tied weights' gradients go wrong.
            with torch.no_grad():
                super()._synchronize_tied_weights()

    return ExplicitPipelineModule


_CLASS: list[type] = []


def check_trainable(layers: Sequence[nn.Module], plan: ir.Plan) -> None:
    """DeepSpeed's ZeRO and bf16/fp16 optimizers cannot step a stage whose weights are all frozen (its fp32 one
    without ZeRO steps nothing: planner.runnable.frozen_stage_problems); such a plan is refused, naming the
    stage, before any engine is built, by the layers' own ``requires_grad``."""
    for i, st in enumerate(plan.stages):
        what = runnable.optimizer_needing_weights(plan, st)
        if what is None:
            continue
        if not any(p.requires_grad for layer in layers[st.layers[0]:st.layers[1]] for p in layer.parameters()):
            where = f"layer {st.layers[0]}" if st.layers[1] - st.layers[0] == 1 else \
                f"layers {st.layers[0]}-{st.layers[1] - 1}"
            raise ExportError(f"stage {i} ({where}) has no trainable weights, and DeepSpeed's {what} optimizer "
                              "cannot step a stage without any",
                              "give the stage a trainable layer (--config), or train it in --precision fp32 with "
                              "--zero 0, or use --engine torch")


def build_pipeline_module(model_or_layers: Any, plan: ir.Plan,
                          loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | str = "cross_entropy",
                          example_input: torch.Tensor | None = None) -> Any:
    """A DeepSpeed ``PipelineModule`` over exactly the profile's layers and the plan's stages.

    Needs ``torch.distributed`` initialised with ``len(plan.stages) * width`` processes.
    Every stage casts its floating-point input to the plan's compute dtype (:func:`to_compute_dtype`).
    A stage with ``recompute="full"`` checkpoints its layers up to the model's last transformer block
    (``ModelProfile.recomputed_layers``), each on its own in a model with blocks, else as one region
    (``ModelProfile.blockwise_recompute``); the head after it keeps its activations.
    """
    from deepspeed.runtime.pipe.topology import PipeDataParallelTopology

    layers = as_layers(model_or_layers, example_input)
    check_layers_match(layers, plan.profile, ExportError)
    width = check_plan(plan, layers)
    if isinstance(loss_fn, str):
        loss_fn = make_loss(loss_fn)
    if not _CLASS:
        _CLASS.append(_explicit_class())
    topo = PipeDataParallelTopology(num_pp=len(plan.stages), num_dp=width)
    rank = torch.distributed.get_rank()
    stage = plan.stages[topo.get_coord(rank).pipe]
    if plan.precision in COMPUTE_DTYPES:  # DeepSpeed casts the weights, not a batch norm's statistics
        for layer in layers:
            cast_running_stats(layer, COMPUTE_DTYPES[plan.precision])
    recomputed = plan.profile.recomputed_layers(*stage.layers) if stage.recompute == "full" else 0
    interval = min(recomputed, 1) if plan.profile.blockwise_recompute else recomputed
    ckpt = partial(torch.utils.checkpoint.checkpoint, use_reentrant=False)
    return _CLASS[0](layer_specs(layers), boundaries(plan), COMPUTE_DTYPES.get(plan.precision), recomputed,
                     topology=topo, loss_fn=loss_fn, activation_checkpoint_interval=interval,
                     activation_checkpoint_func=ckpt)


SCRIPT = '''\
#!/usr/bin/env python
"""Train the plan in plan.json on DeepSpeed's pipeline engine (written by `planner export`).

Plan: {model}, {stages} stages x {width} data-parallel = {world} processes, config {config},
schedule {schedule} (DeepSpeed runs 1F1B), {micro} micro-batches of {mb} samples per process,
batch {batch}. Stage boundaries (layer index ranges): {ranges}.

Run with either launcher (CPU: gloo; GPU: nccl):
    torchrun --standalone --nproc_per_node {world} train.py [--model MODEL] [--steps N]
    deepspeed --num_gpus {world} train.py [--model MODEL] [--steps N]

What it does:
  1. builds the model MODEL (default: the profiled one, {model_repr}, with the profile's --set
     overrides if it has any) and splits it into exactly the layers that were profiled
     (planner.profiler.layers.split_model), then frees the weights of the layers this rank does
     not run (a server's processes build in turns where whole models would not fit its memory:
     planner.export.building); its stages take float inputs in the plan's precision;
  2. wraps them in a DeepSpeed PipelineModule whose stage boundaries are the plan's
     (planner.export.deepspeed.build_pipeline_module overrides DeepSpeed's partitioning),
     on a PipeDataParallelTopology(num_pp={stages}, num_dp={width});
  3. trains with ds_config.json (micro-batch size, gradient accumulation = micro-batches,
     the plan's optimizer; Adam runs torch's fused kernel unless the file says
     "fused": false) on synthetic data of the profiled input shape.
Replace `batches()` with your data loader: each process yields (inputs, labels) per micro-batch.
"""
import json
import os
from pathlib import Path

import deepspeed
import torch

from planner import ir
from planner.export.args import script_args
from planner.export.building import build_turn, release_others
from planner.export.data import data_spec, sub_batch
from planner.export.launched import check_launch, run
from planner.export.layers import load_layers
from planner.export.deepspeed import build_pipeline_module, optimizer_params, skip_shm_build, with_fused_adam

HERE = Path(__file__).resolve().parent


def main() -> None:
    args = script_args(__doc__, {default_model}, local_rank=True)  # the deepspeed launcher sets --local_rank
    plan = ir.Plan.from_dict(json.loads((HERE / "plan.json").read_text()))
    check_launch(plan, gpus=torch.cuda.device_count())  # a launcher, the plan's processes, a GPU each
    config = json.loads((HERE / "ds_config.json").read_text())
    skip_shm_build()  # a CPU-only C++ op DeepSpeed would JIT-build (~35 s); training does not use it
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    with build_turn(plan):  # a server's processes build in turns where whole models would not fit its memory
        layers, example = load_layers(args.model, plan, args.seed)
        spec = data_spec(layers, example, args.loss)
        release_others(layers, plan, torch.distributed.get_rank())  # this rank keeps its stages' weights only
    module = build_pipeline_module(layers, plan, args.loss)
    if args.lr is not None:
        config["optimizer"]["params"]["lr"] = args.lr
    engine, _, _, _ = deepspeed.initialize(model=module, config=with_fused_adam(config),
                                           model_parameters=optimizer_params(module))
    replica, width = engine.grid.get_data_parallel_rank(), engine.grid.get_data_parallel_world_size()

    def batches(step: int):
        x, y = spec.batch(step, plan.batch_size, args.seed)
        for m in range(plan.microbatches):
            yield (sub_batch(x, m, replica, plan.microbatches, width),
                   sub_batch(y, m, replica, plan.microbatches, width))

    for step in range(args.steps):
        loss = engine.train_batch(data_iter=batches(step))
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"step {{step}} loss {{float(loss):.6f}}", flush=True)
    # every rank done before any leaves: a rank exiting while its peers' gloo threads still talk
    # to it made a peer abort (SIGABRT) after training had finished
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    run(main)  # a refusal prints error: and hint: lines, exit 1
'''


def script_text(plan: ir.Plan) -> str:
    width = check_plan(plan)
    return SCRIPT.format(default_model=repr(plan.model), **docstring_fields(
        model=plan.model, model_repr=repr(plan.model), stages=len(plan.stages), width=width, world=plan.world_size,
        config=plan.config, schedule=plan.schedule, micro=plan.microbatches, mb=micro_batch_size(plan, width),
        batch=plan.batch_size, ranges=", ".join(f"[{a}, {b})" for a, b in ranges(plan))))


def make_trainer(layers: Sequence[nn.Module], plan: ir.Plan, loss: str,
                 lr: float | None = None) -> Callable[[torch.Tensor, torch.Tensor], float]:
    """A DeepSpeed pipeline engine for ``plan``; returns ``step(x, y) -> mean loss`` on the global batch.

    Each data-parallel replica takes its share of every micro-batch (sub_batch);
    ``train_batch`` returns the loss averaged over micro-batches and replicas.
    """
    import logging

    import deepspeed
    from deepspeed.utils import logger

    logger.setLevel(logging.WARNING)
    module = build_pipeline_module(list(layers), plan, loss)
    engine, _, _, _ = deepspeed.initialize(model=module, config=with_fused_adam(ds_config(plan, lr)),
                                           model_parameters=optimizer_params(module))
    replica = engine.grid.get_data_parallel_rank()
    width = engine.grid.get_data_parallel_world_size()
    m = plan.microbatches

    def step(x: torch.Tensor, y: torch.Tensor) -> float:
        dev = engine.device
        batches = [(sub_batch(x, i, replica, m, width).to(dev),
                    sub_batch(y, i, replica, m, width).to(dev)) for i in range(m)]
        return float(engine.train_batch(data_iter=iter(batches)))

    return step

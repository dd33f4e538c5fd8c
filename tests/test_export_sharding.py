"""export.sharding: recomputation wrappers (full, selective = attention core only) and bf16 compute."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from planner.export import sharding
from tests.test_export_grids import tiny_gpt2


class _Count(TorchDispatchMode):  # type: ignore[misc]
    """Counts the attention-core and matrix-product ops that run."""

    def __init__(self) -> None:
        super().__init__()
        self.sdpa = 0
        self.mm = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = str(func)
        self.sdpa += sharding.ATTENTION_CORE in name and "backward" not in name
        self.mm += name.startswith(("aten.mm", "aten.addmm"))
        return func(*args, **(kwargs or {}))


def _ops(recompute: str) -> tuple[int, int]:
    """(attention-core, matrix-product) ops of one forward and backward of two GPT-2 blocks."""
    from planner.profiler.layers import split_model

    torch.manual_seed(0)
    model, example = tiny_gpt2()
    layers = split_model(model, example).layers
    stage = sharding.with_recompute(nn.Sequential(*layers[1:3]), recompute)
    x = torch.randn(2, 8, 32, requires_grad=True)
    with _Count() as count:
        stage(x).sum().backward()
    return count.sdpa, count.mm


def test_selective_recomputes_the_attention_core_only_and_full_recomputes_everything() -> None:
    none_sdpa, none_mm = _ops("none")
    sel_sdpa, sel_mm = _ops("selective")
    full_sdpa, full_mm = _ops("full")
    assert none_sdpa == 2 and sel_sdpa == 4 and full_sdpa == 4  # one per block, again in backward
    assert sel_mm == none_mm  # the projections' outputs are saved, not recomputed
    assert full_mm > none_mm  # full recomputation redoes every product


def test_full_recomputation_checkpoints_the_first_layers_and_runs_the_head_as_it_is() -> None:
    layers = [nn.Linear(4, 4) for _ in range(3)]
    stage = sharding.with_recompute(nn.Sequential(*layers), "full", 2)
    assert isinstance(stage, nn.Sequential) and isinstance(stage[0], sharding.Checkpointed)
    assert list(stage[0].inner) == layers[:2] and stage[1] is layers[2]
    assert isinstance(sharding.with_recompute(nn.Sequential(*layers), "full", 3), sharding.Checkpointed)
    plain = nn.Sequential(*layers)
    assert sharding.with_recompute(plain, "full", 0) is plain
    x = torch.randn(2, 4)
    assert torch.equal(stage(x), nn.Sequential(*layers)(x))


def _saved_bytes(stage: nn.Module, x: torch.Tensor) -> int:
    """Bytes autograd keeps for the backward after one forward of ``stage`` (a tensor counted once)."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        stage(x)
    return sum(seen.values())


def test_full_recomputation_per_layer_keeps_each_layers_input_and_trains_the_same() -> None:
    # each GPT-2 block checkpointed on its own keeps its input, as ModelProfile.blockwise_recompute's cost counts;
    # one region keeps the stage's input only; both compute the same gradients as no recomputation
    from planner.profiler.layers import split_model

    torch.manual_seed(0)
    model, example = tiny_gpt2()
    blocks = split_model(model, example).layers[1:4]
    x = torch.randn(2, 8, 32, requires_grad=True)
    grads = {}
    for mode, per_layer in (("none", False), ("full", True), ("full", False)):
        stage = sharding.with_recompute(nn.Sequential(*blocks), mode, per_layer=per_layer)
        if mode == "full":
            kept = _saved_bytes(stage, x)
            assert kept == x.nbytes * (3 if per_layer else 1)
            assert all(isinstance(m, sharding.Checkpointed) for m in stage) if per_layer else \
                isinstance(stage, sharding.Checkpointed)
        x.grad = None
        stage(x).sum().backward()
        grads[(mode, per_layer)] = x.grad.clone()
    assert torch.allclose(grads[("full", True)], grads[("none", False)], atol=1e-6)
    assert torch.allclose(grads[("full", False)], grads[("none", False)], atol=1e-6)


def test_bf16_computes_every_module_in_bf16_over_fp32_parameters() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 4))
    seen: list[torch.dtype] = []
    for layer in model:
        layer.register_forward_hook(lambda m, a, out: seen.append(out.dtype))
    out = sharding.with_precision(model, "bf16")(torch.randn(2, 4))
    assert out.dtype == torch.bfloat16 and seen == [torch.bfloat16] * 3  # the norm too, unlike autocast
    assert all(isinstance(p, nn.Parameter) and p.dtype == torch.float32 for p in model.parameters())
    out.float().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())
    assert sharding.with_precision(model, "fp32") is model


def test_bf16_puts_the_parameters_back_when_a_forward_fails() -> None:
    lin = nn.Linear(4, 4)
    weight = lin.weight
    wrapped = sharding.with_precision(lin, "bf16")
    with pytest.raises(RuntimeError):
        wrapped(torch.randn(2, 5))  # the wrong width
    assert lin.weight is weight and lin.weight.dtype == torch.float32


def test_bf16_recomputation_casts_again_in_the_backward() -> None:
    """A checkpointed layer redoes its forward in the backward: the casts run again, and the gradients are
    those of the layer run without checkpointing."""
    grads = {}
    for recompute in ("none", "full"):
        torch.manual_seed(0)
        stage = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4))
        model = sharding.with_precision(sharding.with_recompute(stage, recompute, per_layer=True), "bf16")
        model(torch.randn(3, 4, requires_grad=True)).float().sum().backward()
        grads[recompute] = torch.cat([p.grad.flatten() for p in stage.parameters()])
    assert torch.equal(grads["none"], grads["full"])


def test_grad_buckets_keep_order_and_split_by_dtype_and_size() -> None:
    a, b, c, d = torch.zeros(10), torch.zeros(20), torch.zeros(5, dtype=torch.float64), torch.zeros(300)
    buckets = sharding.grad_buckets([a, b, c, d], limit_bytes=4 * 40)
    assert [[t.numel() for t in bucket] for bucket in buckets] == [[10, 20], [5], [300]]
    assert sharding.grad_buckets([]) == []


def test_sum_grads_is_one_all_reduce_per_bucket_and_writes_every_gradient_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    calls: list[int] = []

    def all_reduce(t: torch.Tensor, group: object = None) -> None:
        calls.append(t.numel())
        t.mul_(2)  # two replicas holding the same gradient

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    params = [nn.Parameter(torch.ones(3, 4)), nn.Parameter(torch.ones(5)), nn.Parameter(torch.ones(2))]
    params[0].grad = torch.arange(12.0).reshape(4, 3).t()  # not contiguous
    params[1].grad = torch.full((5,), 3.0)
    sharding.sum_grads(params, None, divisor=2)
    assert calls == [19]
    assert torch.equal(params[0].grad, torch.arange(12.0).reshape(4, 3).t())
    assert torch.equal(params[1].grad, torch.full((5,), 3.0)) and torch.equal(params[2].grad, torch.zeros(2))


def test_sum_grads_reduces_a_gradient_over_the_bucket_limit_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bucket of one contiguous gradient is all-reduced as it is: the flat copy never holds more
    than the limit (the transient the cost model charges, planner.grad_buffers.GradCopy)."""
    import torch.distributed as dist

    seen: list[torch.Tensor] = []

    def all_reduce(t: torch.Tensor, group: object = None) -> None:
        seen.append(t)
        t.mul_(2)

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    params = [nn.Parameter(torch.ones(100)), nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(4))]
    for p in params:
        p.grad = torch.full_like(p, 5.0)
    big = params[0].grad
    sharding.sum_grads(params, None, divisor=2, limit_bytes=4 * 10)
    assert seen[0] is big and [t.numel() for t in seen] == [100, 7]
    assert all(torch.equal(p.grad, torch.full_like(p, 5.0)) for p in params)


@pytest.mark.filterwarnings("ignore:`torch.jit.:DeprecationWarning")  # torch's own, importing ZeRO
def test_zero1_steps_the_modules_own_parameters_from_one_buffer(tmp_path: Path) -> None:
    """ZeRO-1 broadcasts one flat buffer per rank a step, not each parameter, and the module trains
    the very tensors the optimizer updates."""
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        lin = nn.Linear(4, 3)
        opt = sharding.optimizer("sgd", list(lin.parameters()), 0.1, 1, dist.group.WORLD)
        assert opt.parameters_as_bucket_view
        assert all(proxy is param for param, proxy in opt.planner_params)
        before = lin.weight.detach().clone()
        lin(torch.randn(2, 4)).sum().backward()
        sharding.zero1_grads(opt)
        opt.step()
        assert not torch.equal(lin.weight.detach(), before)  # the module's own weight moved
    finally:
        dist.destroy_process_group()


def test_bf16_casts_each_weight_once_a_step_and_its_gradients_are_the_same() -> None:
    """Within a step the micro-batches share one bf16 copy of each weight (one cast kernel, one copy held); the
    gradients are those of a cast per micro-batch; outside a step every forward casts anew (the optimizer may
    have changed the weights: fused Adam does not even bump their version counters)."""
    grads = {}
    for per_step in (False, True):
        torch.manual_seed(0)
        stage = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4))
        model = sharding.with_precision(stage, "bf16")
        assert isinstance(model, sharding.Bf16Compute)
        with sharding.casts_per_step([model]) if per_step else contextlib.nullcontext():
            for _ in range(3):  # three micro-batches
                model(torch.randn(2, 4)).float().sum().backward()
            if per_step:  # two weights and two biases, each cast once for the three micro-batches
                assert model.casts is not None and len(model.casts) == 4
        assert model.casts is None  # dropped when the step ends
        grads[per_step] = torch.cat([p.grad.flatten() for p in stage.parameters()])
    assert torch.equal(grads[False], grads[True])


class _Norm(nn.Module):  # type: ignore[misc]
    """An RMSNorm as Llama's: statistics in fp32, then its weight times the input's dtype (the weight saved)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h.to(x.dtype)


def test_bf16_selective_recompute_replays_its_casts_and_trains_as_without() -> None:
    """A bf16 stage under selective recomputation (a Llama plan, `--recompute selective --precision bf16`) runs a
    step of two micro-batches: its region's recomputation replays the forward's weight casts one for one (a cast
    shared over the step would be skipped there: torch's CheckpointError), with the gradients of no recomputation."""
    grads = {}
    for recompute in ("none", "selective"):
        torch.manual_seed(0)
        stage = nn.Sequential(nn.Linear(4, 4), _Norm(), nn.Linear(4, 4))
        model = sharding.with_precision(sharding.with_recompute(stage, recompute), "bf16")
        with sharding.casts_per_step([model]):
            for mb in range(2):
                model(torch.randn(2, 4, generator=torch.Generator().manual_seed(mb))).float().sum().backward()
        grads[recompute] = torch.cat([p.grad.flatten() for p in stage.parameters()])
    assert torch.equal(grads["none"], grads["selective"])


@pytest.mark.slow
def test_zero1_sums_the_sequence_parallel_norms_partial_gradients_as_zero0_does() -> None:
    """Under sequence parallelism a norm's replicated weight gets a partial gradient, each tensor rank's share of
    the sequence; ZeRO-1 handed its local proxy that share unsummed, so the norms trained on half their gradient (a
    tp 2 x dp 2 Llama with Adam: 0.028 from ZeRO-0's losses; a zoo GPT-2 searched as such failed --check at 1.9e-5).
    Now the same losses as ZeRO-0, whose optimizer steps the DTensor and sums it."""
    from planner.runner import max_rel_diff
    from tests.test_export_grids import grid_plan, run_grids

    plans = {f"zero{z}": grid_plan("tiny_llama", [0, 4], tp=2, dp=2, zero=z, sequence_parallel=True,
                                   optimizer="adam") for z in (0, 1)}
    got = run_grids(plans)
    assert max_rel_diff(got["zero1"][0]["losses"], got["zero0"][0]["losses"]) < 1e-6


def test_a_batch_norm_computes_in_bf16_with_its_running_statistics_cast() -> None:
    """Bf16Compute casts a batch norm's weights, and torch's batch norm takes its statistics in the same dtype: the
    forward failed ("expected scalar type BFloat16 but found Float"), in the torch export and --check's reference;
    DeepSpeed's bf16 (weights cast, buffers kept) takes the same cast (planner.export.deepspeed)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU()).train()
    x = torch.randn(2, 3, 5, 5)
    want = model(x)
    out = sharding.with_precision(model, "bf16")(x)
    assert out.dtype == torch.bfloat16
    assert torch.allclose(out.float(), want, atol=0.05)
    assert model[1].running_mean.dtype == torch.bfloat16 and model[1].weight.dtype == torch.float32
    assert model[1].num_batches_tracked.dtype == torch.long


def test_schedules_leave_the_micro_batch_mean_to_the_trainer() -> None:
    """torch's classes that divide by M per stage are told not to (a weight two chunks of a rank share was divided
    twice); a class without the keyword (torch before 2.7, which divided nothing) gets none."""
    from torch.distributed import pipelining

    for name in ("ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B", "ScheduleInterleavedZeroBubble"):
        assert sharding.unscaled(getattr(pipelining, name)) == {"scale_grads": False}

    class Old:
        def __init__(self, stage: Any, n_microbatches: int, loss_fn: Any = None) -> None: ...

    assert sharding.unscaled(Old) == {}


@pytest.mark.parametrize("microbatches", [1, 2, 3])
def test_a_shared_weight_is_divided_by_the_micro_batches_once(microbatches: int) -> None:
    shared = nn.Linear(2, 2)
    chunks = [nn.Sequential(shared, nn.Linear(2, 2)), nn.Sequential(nn.Tanh(), shared)]
    params = list({id(p): p for c in chunks for p in c.parameters()}.values())
    for p in params:
        p.grad = torch.full_like(p, 6.0)
    sharding.mean_over_microbatches(params, microbatches)
    assert all(torch.equal(p.grad, torch.full_like(p, 6.0 / microbatches)) for p in params if p.grad is not None)



def _gathers_worker(rank: int, store: str, per_layer: bool, out: str) -> None:
    """One of 2 ranks: a 3-layer stage under ZeRO-3 and full recomputation, two micro-batches' forward and backward;
    rank 0 writes how many unit all-gathers (FSDP2's ``foreach_all_gather``) each ran."""
    import json

    import torch.distributed as dist
    import torch.distributed.fsdp._fully_shard._fsdp_param_group as param_group
    from torch.distributed.device_mesh import init_device_mesh

    counts: list[int] = []
    gather = param_group.foreach_all_gather

    def counted(*args: Any, **kwargs: Any) -> Any:
        counts[-1] += 1
        return gather(*args, **kwargs)

    param_group.foreach_all_gather = counted
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2)
    torch.manual_seed(0)
    sub = nn.Sequential(*(nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(3)))
    root = sharding.with_recompute(sub, "full", None, per_layer)
    sharding.fully_shard_stage(root, list(sub), init_device_mesh("cpu", (2,)), 3)
    for _ in range(2):
        counts.append(0)
        root(torch.randn(4, 8, requires_grad=True)).sum().backward()
    if rank == 0:
        Path(out).write_text(json.dumps(counts))
    dist.destroy_process_group()


@pytest.mark.parametrize("per_layer", [True, False])
def test_zero3_full_recomputation_gathers_each_unit_twice_a_micro_batch(tmp_path: Path, per_layer: bool) -> None:
    """Under ZeRO-3 (FSDP2, resharded after forward) a unit is gathered in its forward and in its backward; the
    forward its backward redoes runs on that gather, a region per layer or one for the stage alike, as the cost
    model counts it (planner.costmodel.variant: the recomputed forward gathers nothing more)."""
    import json

    import torch.multiprocessing as mp

    out = tmp_path / "gathers.json"
    mp.start_processes(_gathers_worker, args=(str(tmp_path / "store"), per_layer, str(out)), nprocs=2,
                       join=True, start_method="spawn")
    assert json.loads(out.read_text()) == [2 * 3, 2 * 3]  # each micro-batch: forward and backward, 3 units

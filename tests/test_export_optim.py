"""export.optim: the plan's optimizer as a torch class."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from planner.export.optim import torch_optimizer


def test_fused_adam_steps_sharded_and_plain_parameters_together(tmp_path: Path) -> None:
    """A tensor-parallel stage holds DTensor weights (its split layers) beside plain ones (its dp-form layers);
    one fused Adam kernel refuses the mix, so each layout is its own group."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        sharded = nn.Parameter(distribute_tensor(torch.randn(4, 3), mesh, [Shard(0)]))
        plain = nn.Parameter(torch.randn(3))
        opt = torch_optimizer("adam", [sharded, plain], 1e-2)
        assert opt.defaults["fused"]
        before = (sharded.detach().full_tensor().clone(), plain.detach().clone())
        (sharded.full_tensor().sum() + plain.sum()).backward()
        opt.step()
        assert not torch.equal(sharded.detach().full_tensor(), before[0])
        assert not torch.equal(plain.detach(), before[1])
    finally:
        dist.destroy_process_group()

"""export.data, export.losses, export.optim: synthetic batches, their split, the losses and optimizers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from planner.errors import ExportError, RunError
from planner.export.data import data_spec, sub_batch
from planner.export.losses import make_loss
from planner.export.optim import DEFAULT_LR, torch_optimizer
from tests.test_runner import tiny_mlp, tiny_tied


def test_the_same_batch_on_every_process_for_a_seed_and_step() -> None:
    model, example = tiny_mlp()
    spec = data_spec(tuple(model.children()), example, "cross_entropy")
    x1, y1 = spec.batch(3, 8, 0)
    x2, y2 = spec.batch(3, 8, 0)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(spec.batch(4, 8, 0)[0], x1) and not torch.equal(spec.batch(3, 8, 1)[0], x1)
    assert x1.shape == (8, 16) and y1.shape == (8,) and int(y1.max()) < 10


def test_token_models_get_token_ids_below_the_vocabulary() -> None:
    model, example = tiny_tied()
    spec = data_spec(tuple(model.children()), example, "cross_entropy")
    x, y = spec.batch(0, 4, 0)
    assert spec.input_high == 20 and not x.is_floating_point() and int(x.max()) < 20 and y.shape == (4, 6)


def test_sub_batches_tile_the_batch_micro_batch_by_replica() -> None:
    x = torch.arange(12)
    parts = [sub_batch(x, m, w, 3, 2) for m in range(3) for w in range(2)]
    assert torch.equal(torch.cat(parts), x) and all(len(p) == 2 for p in parts)


def test_a_model_that_fails_on_its_input_is_a_run_error() -> None:
    with pytest.raises(RunError, match="fail on its example input"):
        data_spec((nn.Linear(3, 2),), torch.randn(2, 5), "mse")


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors:UserWarning")  # a Linear of 0 outputs
@pytest.mark.parametrize("classes", [0, 1])
def test_a_cross_entropy_over_fewer_than_two_classes_is_refused(classes: int) -> None:
    """A regression head (transformers' ...ForSequenceClassification at num_labels=1) gives one logit: its
    cross-entropy is 0 whatever the weights, so the run would train nothing and --check compare zeros."""
    layers = (nn.Linear(4, 8), nn.Linear(8, classes))
    with pytest.raises(RunError, match=rf"has {classes} classes \(its last dimension\)") as err:
        data_spec(layers, torch.randn(4, 4), "cross_entropy")
    assert err.value.hint == "use --loss mse"
    assert data_spec(layers, torch.randn(4, 4), "mse").output_shape == (classes,)


def test_losses_and_optimizers_by_name() -> None:
    out, target = torch.tensor([[2.0, 0.0]]), torch.tensor([0])
    expect = float(nn.functional.cross_entropy(out, target))
    assert float(make_loss("cross_entropy")(out, target)) == pytest.approx(expect)
    assert float(make_loss("mse")(torch.ones(2), torch.zeros(2))) == 1.0
    with pytest.raises(ExportError, match="unknown loss 'hinge'"):
        make_loss("hinge")
    p = [nn.Parameter(torch.zeros(1))]
    assert isinstance(torch_optimizer("adam", p, DEFAULT_LR["adam"]), torch.optim.Adam)
    assert torch_optimizer("momentum", p, 0.1).defaults["momentum"] == 0.9
    with pytest.raises(ExportError, match="unknown optimizer"):
        torch_optimizer("lamb", p, 0.1)


def test_adam_runs_fused_where_every_parameter_is_on_a_device_the_kernel_runs_on() -> None:
    """torch's fused Adam (the cost model's 28 bytes a value, no temporaries) on CPUs and GPUs; elsewhere, or
    when told, torch's default (``fused=None``: False would loop tensor by tensor)."""
    from planner.export.optim import fused_adam_runs

    cpu = [nn.Parameter(torch.zeros(3))]
    assert torch_optimizer("adam", cpu, 1e-3).defaults["fused"] is True and fused_adam_runs(cpu)
    assert torch_optimizer("adam", cpu, 1e-3, fused=False).defaults["fused"] is None
    meta = [nn.Parameter(torch.zeros(3, device="meta"))]
    assert not fused_adam_runs(meta) and not fused_adam_runs([])
    assert torch_optimizer("adam", meta, 1e-3).defaults["fused"] is None


class _PositionsFirst(nn.Module):
    """A token model whose position table (64 rows) is registered, and found, before its vocabulary (50)."""

    def __init__(self) -> None:
        super().__init__()
        self.pos = nn.Embedding(64, 8)
        self.tok = nn.Embedding(50, 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tok(ids) + self.pos(torch.arange(ids.shape[1]))


def test_token_ids_stay_below_the_embedding_the_input_feeds() -> None:
    """The first embedding's 64 rows were taken for the vocabulary: ids up to 63 into a table of 50, an
    IndexError inside every worker of `planner run`."""
    layers = (_PositionsFirst(), nn.Linear(8, 50))
    spec = data_spec(layers, torch.randint(0, 50, (4, 6)), "cross_entropy")
    assert spec.input_high == 50
    x, _ = spec.batch(0, 64, 0)
    assert int(x.max()) < 50
    nn.Sequential(*layers)(x)  # runs

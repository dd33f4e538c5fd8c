"""profiler.layered: weight facts, parameter accounting (each counted once) and ties as ir.Tie."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from planner import ir
from planner.profiler.layered import (
    batch_stats,
    dominant,
    param_accounting,
    primary_output,
    rejects_input,
    tensor_counts,
    trainable_counts,
    weight_features,
)


def test_weight_features_of_convolution_linear_and_embedding() -> None:
    assert weight_features(nn.Conv2d(3, 8, 3)) == (3, 8)
    assert weight_features(nn.Linear(5, 7)) == (5, 7)
    assert weight_features(nn.Embedding(100, 16)) == (100, 16)
    assert weight_features(nn.ReLU()) == (None, None)
    assert dominant([nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 50))]) is not None


def test_a_shared_parameter_is_counted_once_and_becomes_an_ir_tie() -> None:
    emb = nn.Embedding(10, 4)
    head = nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    model = nn.Sequential(emb, nn.Linear(4, 4), head)
    layer_params = [list(emb.named_parameters()), list(model[1].named_parameters()), list(head.named_parameters())]
    counts, nbytes, ties = param_accounting(model, layer_params)
    assert counts == (40, 20, 0) and nbytes == (160, 80, 0)
    assert ties == (ir.Tie("0.weight", (0, 2), 40, 160),)
    assert isinstance(ties[0], ir.Tie)


def test_parameters_no_layer_uses_are_counted_in_none() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    counts, nbytes, ties = param_accounting(model, [list(model[0].named_parameters()), []])
    assert counts == (6, 0) and nbytes == (24, 0) and ties == ()


class _WithUnused(nn.Module):
    """A model with a module its forward never calls (as BertModel's pooler is left out of its split)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.aux = nn.Linear(8, 16), nn.Linear(16, 4), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def test_a_model_with_unused_parameters_has_the_counts_its_runnable_layers_have() -> None:
    from planner.export.layers import layer_param_counts
    from planner.profiler.layers import split_model

    lm = split_model(_WithUnused(), torch.randn(2, 8))
    assert lm.param_counts == tuple(layer_param_counts(lm.layers)) == (8 * 16 + 16, 16 * 4 + 4)


def test_primary_output_and_the_rejection_message() -> None:
    t = torch.zeros(2)
    assert primary_output(t) is t and primary_output((t, 1)) is t
    err = rejects_input(torch.zeros(4, 7), RuntimeError("mat1 and mat2 shapes cannot be multiplied\nmore"))
    assert err.cause == "the model rejects input of shape (7,) (batch 4): mat1 and mat2 shapes cannot be multiplied"
    assert "--input-shape" in err.hint


def test_floats_given_to_an_embedding_get_a_hint_for_integer_examples() -> None:
    embedding = torch.nn.Embedding(10, 4)
    with pytest.raises(RuntimeError) as info:
        embedding(torch.zeros(2, 3))
    err = rejects_input(torch.zeros(2, 3), info.value)
    assert "integer indices" in err.hint and "torch.long" in err.hint
    ints = rejects_input(torch.zeros(2, 3, dtype=torch.long), info.value)
    assert "--input-shape" in ints.hint


def test_a_batch_norm_given_one_sample_gets_a_hint_for_a_larger_batch() -> None:
    """Before: 'pass the --input-shape the model expects', which no shape fixes."""
    norm = torch.nn.BatchNorm1d(4).train()
    with pytest.raises(ValueError) as info:
        norm(torch.zeros(1, 4))
    err = rejects_input(torch.zeros(1, 4), info.value)
    assert "more than 1 value per channel" in err.cause and "--batch-size of 2 or more" in err.hint


class _Routed(nn.Module):  # type: ignore[misc]
    """A mixture of experts' dispatch in miniature: which rows go on depends on the values."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = (x[:, 0] > 0).nonzero(as_tuple=True)[0]
        return x.index_add(0, rows, x[rows])


@pytest.mark.parametrize("fails", [lambda x: _Routed()(x), lambda x: x[x.sum(1) > 0], lambda x: x.sum().item()])
def test_an_op_the_meta_device_cannot_run_points_at_measured_mode(fails: object) -> None:
    """Analytic mode runs on meta tensors: value-dependent shapes fail there, whatever the input's shape."""
    x = torch.zeros(4, 3, device="meta")
    with pytest.raises((RuntimeError, NotImplementedError)) as info:
        fails(x)  # type: ignore[operator]
    err = rejects_input(x, info.value)
    assert "cannot run on the meta device" in err.cause and "--mode measured" in err.hint
    assert "--input-shape" not in err.hint
    real = rejects_input(torch.zeros(4, 3), RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert "rejects input of shape" in real.cause and "--input-shape" in real.hint


def test_trainable_counts_leave_out_frozen_parameters_each_counted_once() -> None:
    """A frozen first layer trains none of its parameters; a layer sharing a frozen weight with it counts
    it there, not again; a layer with every parameter training says None (no field in the profile)."""
    first, second, third = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2)
    first.weight.requires_grad_(False)
    second.weight = first.weight  # tied, counted in the first layer
    got = trainable_counts([first, second, third], [20, 4, 10])
    assert got == (4, None, None)  # first: its bias trains (4 of 20); second: its own bias only
    first.bias.requires_grad_(False)
    assert trainable_counts([first, second, third], [20, 4, 10])[0] == 0


def test_tensor_counts_list_each_trainable_tensor_once_largest_first() -> None:
    """A tensor shared with an earlier layer is listed there only; a frozen one is not listed (it has no optimizer
    state); where a layer's list does not add up to its trainable count, no layer lists any (unknown)."""
    first, second, third = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2)
    second.weight = first.weight
    third.bias.requires_grad_(False)
    counts, trainable = [20, 4, 10], trainable_counts([first, second, third], [20, 4, 10])
    assert tensor_counts([first, second, third], counts, trainable) == ((16, 4), (4,), (8,))
    assert tensor_counts([first, second, third], [20, 5, 10], trainable) == ((), (), ())


def test_a_frozen_layers_profile_records_it_and_its_backward_computes_no_weight_gradient() -> None:
    from planner.profiler.core import profile_model
    from planner.profiler.loader import LoadedModel

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    model[2].weight.requires_grad_(False)
    prof = profile_model(LoadedModel("frozen", model, torch.randn(4, 16), (16,)), mode="analytic",
                         device_flops=1e12)
    last = prof.layers[-1]
    assert last.trainable_count == 8 and last.trainable_share == pytest.approx(8 / (32 * 8 + 8))
    assert prof.layers[0].trainable_count is None
    again = ir.ModelProfile.from_dict(prof.to_dict())
    assert again.layers[-1].trainable_count == 8


def test_batch_stats_finds_a_batch_norm_at_any_depth() -> None:
    block = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Sequential(nn.BatchNorm2d(4), nn.ReLU()))
    assert batch_stats(block) and batch_stats(nn.BatchNorm1d(4))
    assert not batch_stats(nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.GroupNorm(2, 4)))


def test_running_out_of_memory_on_the_example_is_not_blamed_on_the_input_shape() -> None:
    """A worker (or profile) out of memory while it runs the model on its example read "the model rejects input of
    shape ...", with the hint to pass another --input-shape."""
    from planner.profiler.layered import rejects_input

    err = rejects_input(torch.zeros(8, 16), torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"))
    assert err.cause == "out of memory running the model on input of shape (16,) (batch 8) on cpu (torch asked for " \
                        "20.00 GiB)"
    assert "--input-shape" not in err.cause and "smaller --batch-size" in err.hint


def test_an_embedding_dtensor_cannot_shard_has_no_weight_shape_so_its_layer_runs_dp() -> None:
    """An nn.Embedding with max_norm (renormalised in place: no sharding strategy for aten.embedding_renorm_) or
    sparse gradients: a torch search split it (its shape was known) and every worker of `planner run` failed with
    DTensor's NotImplementedError; its layer now has no weight shape (dp only), and the export refuses the split."""
    from planner.errors import ExportError
    from planner.export import splits
    from planner.profiler.layered import weight_features

    assert weight_features(nn.Embedding(64, 32, padding_idx=0, scale_grad_by_freq=True)) == (64, 32)
    for kw, said in (({"max_norm": 1.0}, "max_norm=1 renormalises"), ({"sparse": True}, "sparse=True")):
        emb = nn.Embedding(64, 32, **kw)
        assert weight_features(emb) == (None, None)
        with pytest.raises(ExportError, match=said):
            splits.check_split(nn.Sequential(emb), 2, 0, 0, "split_in", "Embedding", (64, 32))

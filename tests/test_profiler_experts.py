"""profiler.experts: a mixture of experts' work counted evenly routed on the meta device, its own forward elsewhere."""

from __future__ import annotations

import pytest
import torch

from planner.profiler.experts import balanced_forward, is_experts, routed_evenly
from tests.test_profiler_hfsplit import family_model


def _balanced_routing(tokens: int, k: int, experts: int) -> torch.Tensor:
    """The routing balanced_forward assumes: pair ``i`` (token ``i // k``, slot ``i % k``) to expert ``i // rows``."""
    rows = -(-tokens * k // experts)
    return torch.arange(tokens * k).reshape(tokens, k) // rows


@pytest.mark.parametrize("family", ["Mixtral", "GptOss", "Qwen3Moe", "Olmoe"])
def test_balanced_work_is_the_models_own_under_that_routing(family: str) -> None:
    """Under the routing it assumes, the balanced forward computes what the model's own experts do: Mixtral's and
    Qwen3-MoE's gated experts, gpt-oss's (biases, weights stored transposed, its own clamped gate), OLMoE's; 24
    tokens x 2 over 4 experts, and 25 (the last expert's rows padded)."""
    torch.manual_seed(0)
    model = family_model(family).double()
    model.set_experts_implementation("eager")  # transformers' reference loop over the experts (grouped_mm: no fp64)
    experts = model.model.layers[0].mlp.experts
    assert is_experts(experts)
    for tokens in (24, 25):
        hidden = torch.randn(tokens, 64, dtype=torch.float64)
        index = _balanced_routing(tokens, 2, 4)
        weights = torch.rand(tokens, 2, dtype=torch.float64)
        torch.testing.assert_close(balanced_forward(experts, hidden, index, weights), experts(hidden, index, weights))


def test_routed_evenly_runs_on_meta_leaves_real_tensors_to_the_model_and_restores_it() -> None:
    """Inside, meta tensors run the balanced work (the model's own forward cannot: it reads the routing's values) and
    real ones the model's own forward; on leaving, even by an error, the experts' forwards are their class's again."""
    torch.manual_seed(0)
    model = family_model("Mixtral")
    with torch.device("meta"):
        on_meta = family_model("Mixtral")
    experts, meta_experts = model.model.layers[0].mlp.experts, on_meta.model.layers[0].mlp.experts
    hidden, index, weights = torch.randn(8, 64), torch.randint(0, 4, (8, 2)), torch.rand(8, 2)
    want = experts(hidden, index, weights)
    meta = [t.to("meta") for t in (hidden, index, weights)]
    with pytest.raises((RuntimeError, NotImplementedError)):
        meta_experts(*meta)
    with routed_evenly(on_meta) as count, routed_evenly(model):
        assert count == 2 and "forward" in vars(meta_experts)
        assert meta_experts(*meta).shape == (8, 64)
        assert torch.equal(experts(hidden, index, weights), want)
    assert "forward" not in vars(experts) and "forward" not in vars(meta_experts)
    with pytest.raises(ValueError, match="inside"), routed_evenly(model):
        raise ValueError("inside")
    assert all("forward" not in vars(m) for m in model.modules())


def test_a_dense_model_has_no_experts() -> None:
    model = family_model("Gemma")
    with routed_evenly(model) as count:
        assert count == 0

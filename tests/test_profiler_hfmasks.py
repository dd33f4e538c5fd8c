"""profiler.hfmasks: each split block masks its attention as its model's forward does (causal, within a sliding
window where its layer slides, boolean for SDPA or additive for eager attention), so decoders with sliding windows
shorter than the sequence, Gemma 2 (eager, soft-capped) and Gemma 3 (rotary per layer type) split bit for bit."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from planner.errors import TraceError
from planner.profiler.hfmasks import BlockMask, block_masks, sliding_of
from planner.profiler.hfsplit import split_hf
from tests.test_profiler_fxsplit import primary_output
from tests.test_profiler_hfsplit import _exact_both, _split, family_model


def test_a_block_mask_is_causal_within_its_window_and_none_where_sdpa_masks_itself() -> None:
    hidden = torch.zeros(1, 5, 2)
    assert BlockMask().build(hidden) is None and BlockMask(window=6).build(hidden) is None
    window = BlockMask(window=2).build(hidden)
    assert window is not None and window.shape == (1, 1, 5, 5) and window.dtype == torch.bool
    assert window[0, 0].int().tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 1, 1, 0, 0], [0, 0, 1, 1, 0],
                                           [0, 0, 0, 1, 1]]
    assert torch.equal(BlockMask(window=5).build(hidden), torch.ones(5, 5, dtype=torch.bool).tril()[None, None])
    additive = BlockMask(additive=True).build(hidden.bfloat16())
    assert additive is not None and additive.dtype == torch.bfloat16
    assert torch.equal(additive[0, 0] == 0, torch.ones(5, 5, dtype=torch.bool).tril())
    assert float(additive[0, 0, 0, 1]) == torch.finfo(torch.bfloat16).min


class _Config:
    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


def test_block_masks_follow_the_configs_layer_types_window_and_attention() -> None:
    assert block_masks(_Config(sliding_window=8), 2, "every") == (BlockMask(8), BlockMask(8))  # Mistral: every layer
    assert block_masks(_Config(sliding_window=None), 1, "every") == (BlockMask(),)
    typed = _Config(sliding_window=8, layer_types=["sliding_attention", "full_attention"], _attn_implementation="eager")
    assert block_masks(typed, 2, "typed") == (BlockMask(8, True), BlockMask(None, True))
    assert block_masks(typed, 2, "every") == (BlockMask(8, True), BlockMask(8, True))  # the layer types unread
    assert block_masks(typed, 2, "none") == (BlockMask(None, True), BlockMask(None, True))  # the window unread
    with pytest.raises(TraceError, match="layer 1 is of type 'chunked_attention'"):
        block_masks(_Config(layer_types=["full_attention", "chunked_attention"]), 2, "typed")
    with pytest.raises(TraceError, match="use_bidirectional_attention"):
        block_masks(_Config(use_bidirectional_attention=True), 1, "none")
    with pytest.raises(TraceError, match="chunks of 16 tokens"):
        block_masks(_Config(attention_chunk_size=16), 1, "none")


def test_which_layers_slide_is_read_off_the_models_forward() -> None:
    import transformers

    sliding = {family: sliding_of(getattr(transformers, f"{family}Model").forward)
               for family in ("Llama", "Gemma", "Olmo2", "Mistral", "Phi3", "Starcoder2", "Ministral3", "Qwen2",
                              "SmolLM3", "Gemma2", "Gemma3Text", "Olmo3", "Exaone4", "Cohere2")}
    assert sliding == {"Llama": "none", "Gemma": "none", "Olmo2": "none", "Mistral": "every", "Phi3": "every",
                       "Starcoder2": "every", "Ministral3": "every", "Qwen2": "typed", "SmolLM3": "typed",
                       "Gemma2": "typed", "Gemma3Text": "typed", "Olmo3": "typed", "Exaone4": "typed",
                       "Cohere2": "typed"}


@pytest.mark.parametrize(("family", "fields"), [
    ("Llama", {"sliding_window": 5}),  # a field Llama's config keeps and its forward ignores
    ("Olmo2", {"sliding_window": 5, "attn_implementation": "eager"}),
    ("Mistral", {"sliding_window": 5, "layer_types": ["full_attention", "full_attention"]}),  # Mistral slides all
    ("Phi3", {"sliding_window": 5, "layer_types": ["sliding_attention", "full_attention"]}),
    ("Ministral3", {"sliding_window": 5, "head_dim": 16, "layer_types": ["full_attention", "full_attention"]}),
])
def test_config_fields_the_forward_ignores_leave_the_masks_as_the_forward_builds_them(family: str,
                                                                                     fields: dict[str, Any]) -> None:
    """A window on a config whose model's forward builds only the causal mask, or layer types on one whose forward
    slides every layer: the split masks as the forward does, bit for bit (it masked by the config's fields)."""
    torch.manual_seed(0)
    model = family_model(family, **fields)
    _exact_both(model, model.model, torch.randint(0, 96, (2, 16)), model.config.model_type)


def _unwindowed(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The model's output with the same weights and a window longer than the sequence (the window must matter for a
    test to hold)."""
    state = model.config.sliding_window
    model.config.sliding_window = 10**6
    try:
        with torch.no_grad():
            return primary_output(model.eval()(x, use_cache=False))
    finally:
        model.config.sliding_window = state


@pytest.mark.parametrize(("family", "fields"), [
    ("Mistral", {"sliding_window": 5}),
    ("Mistral", {"sliding_window": 5, "attn_implementation": "eager"}),
    ("Qwen2", {"use_sliding_window": True, "sliding_window": 5, "max_window_layers": 1}),  # layer 1 slides
    ("Phi3", {"sliding_window": 5}),
    ("Starcoder2", {"sliding_window": 5}),
    ("Ministral3", {"sliding_window": 5, "head_dim": 16}),  # recognised by its code (Mistral's forwards)
])
def test_a_window_shorter_than_the_sequence_is_masked_as_the_model_masks_it(family: str, fields: dict[str, Any]
                                                                           ) -> None:
    torch.manual_seed(0)
    model = family_model(family, **fields)
    x = torch.randint(0, 96, (2, 16))
    arch = model.config.model_type
    lm = _exact_both(model, model.model, x, arch)
    with torch.no_grad():
        assert not torch.equal(lm.run(x), _unwindowed(model, x))


def test_gemma2_splits_exactly_with_eager_soft_capped_attention_and_capped_logits() -> None:
    """Gemma 2: sliding and full layers alternating, its attention scores and logits soft-capped (eager attention:
    SDPA refuses the cap), pre- and post-norms around attention and MLP."""
    torch.manual_seed(0)
    model = family_model("Gemma2", head_dim=16, sliding_window=5, attn_implementation="eager",
                         attn_logit_softcapping=5.0, final_logit_softcapping=2.0)
    x = torch.randint(0, 96, (2, 16))
    lm = _exact_both(model, model.model, x, "gemma2")
    with torch.no_grad():
        logits = lm.run(x)
    assert float(logits.abs().max()) <= 2.0 and not torch.equal(logits, _unwindowed(model, x))
    shape = lm.block(1)
    assert shape is not None and shape.gated and shape.head_dim is None and lm.in_features[0] is None  # scaled


def test_gemma3_splits_exactly_with_rotary_embeddings_and_masks_per_layer_type() -> None:
    """Gemma 3: local (sliding, rotary base 10,000) and global (full, its own base) layers; per-head q/k norms."""
    torch.manual_seed(0)
    model = family_model("Gemma3Text", head_dim=32, sliding_window=5,
                         layer_types=["sliding_attention", "full_attention"])
    x = torch.randint(0, 96, (2, 16))
    lm = _exact_both(model, model.model, x, "gemma3_text")
    blocks = [layer for layer in lm.layers if hasattr(layer, "layer_type")]
    assert [b.layer_type for b in blocks] == ["sliding_attention", "full_attention"]
    shape = lm.block(1)
    assert shape is not None and shape.head_dim == 32 and shape.gated


@pytest.mark.parametrize(("family", "shardable"), [("Olmo3", False), ("Exaone4", True), ("Cohere2", False),
                                                  ("Ministral", True)])
def test_decoders_with_masks_per_layer_type_split_exactly(family: str, shardable: bool) -> None:
    """OLMo 3 (q/k norms over all heads: not sharded), EXAONE 4 (per-head q/k norms, post-norms; sharded: a tp 2
    pipeline trains like one process, tests/test_export_grids), Cohere 2 (Cohere's parallel block and logit
    scale: not sharded) and Ministral (Mistral's blocks; a pp 2 x tp 2 grid with sequence parallelism trained like
    one process, 8.6e-8) mask and rotate each layer by its type in their model's forward: Llama's split, each block
    masked as its layer type."""
    torch.manual_seed(0)
    model = family_model(family, head_dim=16, sliding_window=5, layer_types=["sliding_attention", "full_attention"])
    x = torch.randint(0, 96, (2, 16))
    lm = _exact_both(model, model.model, x, model.config.model_type)
    with torch.no_grad():
        assert not torch.equal(lm.run(x), _unwindowed(model, x))
    shape = lm.block(1)
    assert shape is not None and shape.gated and shape.shardable == shardable


def test_gemma3_bidirectional_and_other_models_eager_attention_are_refused() -> None:
    with pytest.raises(TraceError, match="use_bidirectional_attention"):
        split_hf(family_model("Gemma3Text", head_dim=16, use_bidirectional_attention=True), torch.zeros(1, 4).long())
    gpt_neox = family_model("GPTNeoX", attn_implementation="eager")  # its blocks get no mask: refused as before
    with pytest.raises(TraceError, match="attn_implementation='sdpa'"):
        split_hf(gpt_neox, torch.zeros(1, 4).long())
    llama = family_model("Llama", attn_implementation="eager")
    assert _split(llama, torch.zeros(1, 4).long()).method == "structure:llama"

"""profiler.repeats: identical consecutive layers counted once give the same facts as a full pass."""

from __future__ import annotations

import torch
from torch import nn

from planner.profiler.layers import split_model
from planner.profiler.loader import load_model
from planner.profiler.measure import instrumented_pass
from planner.profiler.repeats import fact_sources, instrumented_pass_once_per_kind, layer_signature


def test_runs_of_identical_layers_take_their_second_layers_facts() -> None:
    layers = [nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 8), nn.Linear(8, 8)]
    assert fact_sources(layers) == [0, 1, 1, 1, 4, 5]
    assert layer_signature(nn.Linear(4, 4)) == layer_signature(nn.Linear(4, 4))
    assert layer_signature(nn.Linear(4, 4)) != layer_signature(nn.Linear(4, 4, bias=False))
    assert fact_sources([nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4)]) == [0, 1, 2]


def test_llama_blocks_counted_once_equal_a_full_pass() -> None:
    loaded = load_model("llama2-7b", 1, (64,), dtype="bfloat16", device="meta", overrides={"num_hidden_layers": 6})
    lm = split_model(loaded.module, loaded.example_input)
    params = list(loaded.module.parameters())
    facts, counted = instrumented_pass_once_per_kind(lm.layers, loaded.example_input, params)
    assert counted == 4 and len(facts) == 8  # embedding, blocks 0 and 1, head
    assert facts == instrumented_pass(lm.layers, loaded.example_input, params)


def test_shape_changing_runs_are_counted_in_full() -> None:
    with torch.device("meta"):
        layers = [nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)]
        x = torch.randn(2, 4)
    _, counted = instrumented_pass_once_per_kind(layers, x, [p for m in layers for p in m.parameters()])
    assert counted == 2  # Linear(4, 4) keeps the shape: the third takes the second's facts
    pools = [nn.MaxPool1d(2), nn.MaxPool1d(2), nn.MaxPool1d(2)]  # identical, but each halves the length
    y = torch.randn(2, 4, 16, device="meta", requires_grad=True)
    facts, counted = instrumented_pass_once_per_kind(pools, y, [])
    assert counted == 3 and [f.output_shape for f in facts] == [(2, 4, 8), (2, 4, 4), (2, 4, 2)]


def test_gemma3_sliding_and_full_blocks_are_not_one_run() -> None:
    """Gemma 3's sliding blocks build a mask (a window shorter than the sequence) and its full ones leave it to
    SDPA: the same modules and weights, other facts (the mask SDPA saves), so a full block is counted itself."""
    loaded = load_model("gemma3-1b", 1, (64,), dtype="bfloat16", device="meta",
                        overrides={"num_hidden_layers": 8, "sliding_window": 16})
    lm = split_model(loaded.module, loaded.example_input)
    params = list(loaded.module.parameters())
    assert fact_sources(lm.layers) == [0, 1, 2, 2, 2, 2, 6, 7, 8, 9]  # blocks 0-4 slide, 5 is full, 6-7 slide
    facts, counted = instrumented_pass_once_per_kind(lm.layers, loaded.example_input, params)
    assert counted == 7 and facts == instrumented_pass(lm.layers, loaded.example_input, params)

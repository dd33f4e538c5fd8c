"""export.layers: the model as the profiled layers, its ties, its check against the plan's profile."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from planner import ir
from planner.errors import ExportError, PlanError, RunError
from planner.export.layers import as_layers, check_layers_match, disable_dropout, load_layers
from planner.export.ties import find_ties
from tests.test_runner import tiny_plan


def test_load_layers_builds_the_same_weights_for_a_seed_and_checks_the_profile() -> None:
    plan = tiny_plan("tiny_mlp", [0, 2, -1])
    a, _ = load_layers("tests.test_runner:tiny_mlp", plan, seed=3)
    b, _ = load_layers("tests.test_runner:tiny_mlp", plan, seed=3)
    assert len(a) == len(plan.profile.layers)
    assert all(torch.equal(p, q) for la, lb in zip(a, b, strict=True)
               for p, q in zip(la.parameters(), lb.parameters(), strict=True))
    with pytest.raises(RunError, match="parameters in the model"):
        load_layers("tests.test_runner:tiny_mlp_wide", plan)


def test_layer_count_mismatch_names_both_counts() -> None:
    plan = tiny_plan("tiny_mlp", [0, 2, -1])
    with pytest.raises(ExportError, match=r"the model has 1 layers but the plan's profile .* has 4"):
        check_layers_match([nn.Linear(16, 10)], plan.profile, ExportError)


def test_as_layers_takes_lists_sequentials_and_split_models() -> None:
    seq = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    assert as_layers(seq) == tuple(seq.children()) and as_layers(list(seq)) == tuple(seq)
    with pytest.raises(ExportError, match="without an example input"):
        as_layers(nn.Linear(2, 2))
    with pytest.raises(ExportError, match=r"not an nn\.Module"):
        as_layers([nn.Linear(2, 2), "x"])


def test_ties_must_be_the_profiles() -> None:
    """A profile that records ties holds the model to them (the same ir.Tie the profiler wrote)."""
    import dataclasses

    profile = tiny_plan("tiny_tied", [0, 1, -1]).profile
    layers, _ = load_layers("tests.test_runner:tiny_tied", tiny_plan("tiny_tied", [0, 1, -1]), seed=0)
    (found,) = find_ties(layers)
    assert found.layers == (0, 1)
    check_layers_match(layers, dataclasses.replace(profile, ties=(found.tie,)), ExportError)
    untied, _ = load_layers("tests.test_runner:tiny_mlp", tiny_plan("tiny_mlp", [0, 2, -1]), seed=0)
    claims = dataclasses.replace(tiny_plan("tiny_mlp", [0, 2, -1]).profile, ties=(ir.Tie("x", (0, 3), 32, 128),))
    with pytest.raises(ExportError, match=r"tied weights \(none\) are not the plan's profile's \(layers 0, 3\)"):
        check_layers_match(untied, claims, ExportError)


TINY_GPT2 = {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 64}


def tiny_gpt2_plan() -> ir.Plan:
    """A 2-stage plan over gpt2 profiled (analytic: no timing) with --set overrides, as `planner profile` does."""
    from planner.api import profile_model
    from planner.export.partition import manual_plan
    from tests.conftest import make_cluster_dict

    prof = profile_model("gpt2", batch_size=4, mode="analytic", input_shape=(8,), overrides=TINY_GPT2)
    return manual_plan(prof, ir.Cluster.from_dict(make_cluster_dict(1, 2)), [0, 2, 4], microbatches=2)


def test_the_profiled_zoo_model_is_built_with_the_profiles_overrides() -> None:
    """`planner run PLAN --model gpt2` once built the full-size gpt2 (14 layers) for a profile of 4."""
    plan = tiny_gpt2_plan()
    assert plan.profile.meta["overrides"] == TINY_GPT2
    layers, example = load_layers("gpt2", plan, seed=0)
    assert len(layers) == 4 and tuple(example.shape) == (4, 8)
    assert layers[0].wte.num_embeddings == 64  # type: ignore[union-attr]


def test_bad_overrides_in_a_plan_are_the_plans_error_not_a_set_option() -> None:
    """A plan whose profile.meta.overrides were edited to a bad value: the error named `--set`, which the user of
    `planner run` never typed, and exited 2. It names the plan's field and exits 1."""
    import dataclasses

    plan = tiny_gpt2_plan()
    meta = {**plan.profile.meta, "overrides": {**TINY_GPT2, "n_layer": "abc"}}
    bad = dataclasses.replace(plan, profile=dataclasses.replace(plan.profile, meta=meta))
    with pytest.raises(PlanError, match=r"profile.meta.overrides do not build gpt2: --set n_layer='abc'") as err:
        load_layers("gpt2", bad, seed=0)
    assert err.value.exit_code == 1


def test_a_model_that_does_not_match_names_the_profiles_overrides() -> None:
    plan = tiny_gpt2_plan()
    with pytest.raises(RunError, match=r"has 4 \(the profile was made from gpt2 with --set n_layer=2 n_embd=32 "
                                       r"n_head=2 vocab_size=64\)") as err:
        check_layers_match([nn.Linear(16, 10)], plan.profile, RunError)
    assert "--model gpt2, which builds it with those overrides" in err.value.hint
    assert "package.module:factory" in err.value.hint


def test_disable_dropout_zeroes_the_probabilities_modules_keep_as_numbers() -> None:
    """nn.MultiheadAttention(dropout=0.5) and a transformers attention's attention_dropout kept dropping in
    `planner run`: a data-parallel plan of a ViT with attention dropout departed from the reference by 0.077."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 2, dropout=0.5, batch_first=True)
    qwen = Qwen2ForCausalLM(Qwen2Config(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                        num_key_value_heads=1, intermediate_size=32, attention_dropout=0.5))
    model = nn.ModuleDict({"mha": mha, "qwen": qwen, "drop": nn.Dropout(0.3)}).train()
    disable_dropout(model)
    x = torch.randn(2, 5, 16)
    outs = [mha(x, x, x, need_weights=False)[0] for _ in range(2)]
    assert torch.equal(outs[0], outs[1])
    assert mha.dropout == 0.0 and qwen.model.layers[0].self_attn.attention_dropout == 0.0
    assert model["drop"].p == 0.0


@pytest.mark.parametrize(("family", "fields"), [("Mixtral", {"router_jitter_noise": 0.5}),
                                               ("Phimoe", {"input_jitter_noise": 0.5})])
def test_disable_dropout_stills_a_routers_noise_and_sampling_however_the_model_trains(
        family: str, fields: dict[str, object]) -> None:
    """Mixtral's router jitter and PhiMoE's (its input jitter, and its sparse mixer sampling the experts while
    training, at its defaults too) drew on each rank's own generator: every plan of PhiMoE failed `planner run
    --check` on 2 processes (3.7e-05 relative off one process for 1-1, 5e-05 for dp 2). After it, two training
    forwards under different seeds agree, the model put to train again; PhiMoE's router_jitter_noise, a threshold
    and no draw, is kept."""
    from tests.test_profiler_hfsplit import family_model

    torch.manual_seed(0)
    model = family_model(family, **fields)
    disable_dropout(model)
    model.train()
    x = torch.randint(0, 96, (2, 8))
    outs = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        outs.append(model(x).logits)
    assert torch.equal(outs[0], outs[1])
    assert model.training and model.model.layers[0].mlp.training
    if family == "Phimoe":
        router = model.model.layers[0].mlp.router
        assert not router.training and router.router_jitter_noise == model.config.router_jitter_noise > 0


def huge_unless_meta() -> tuple[nn.Module, torch.Tensor]:
    """A model whose weights would not fit in memory: built on the meta device only (its factory refuses
    otherwise, standing for the out-of-memory kill)."""
    if torch.empty(0).device.type != "meta":
        raise MemoryError("built with real weights before any check")
    return nn.Sequential(nn.Linear(16, 100_000), nn.ReLU(), nn.Linear(100_000, 10)), torch.randn(8, 16)


def conv_only() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten())


def test_another_model_is_checked_on_the_meta_device_before_its_weights_are_made() -> None:
    """`--model llama2-7b` for a plan of a two-block GPT-2 built 27 GB of weights in every process, killed out of
    memory with no message; the model is now split on the meta device and refused by its layers first."""
    plan = tiny_plan("tiny_mlp", [0, 2, -1])
    with pytest.raises(RunError, match=r"the model has 2 layers but the plan's profile .* has 4"):
        load_layers(f"{__name__}:huge_unless_meta", plan, seed=0)
    layers, _ = load_layers("tests.test_runner:tiny_mlp", plan, seed=0)  # the profiled model: built once
    assert len(layers) == 4


def test_another_model_that_rejects_the_plans_input_is_named_as_not_the_plans() -> None:
    plan = tiny_plan("tiny_mlp", [0, 2, -1])
    with pytest.raises(RunError, match=r"conv_only is not the plan's model \(tests.test_runner:tiny_mlp\): the model "
                                       r"rejects input") as err:
        load_layers(f"{__name__}:conv_only", plan, seed=0)
    assert "--model tests.test_runner:tiny_mlp" in err.value.hint

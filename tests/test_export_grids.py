"""export.torch on tensor x data x pipeline grids: real multi-process training (gloo) against one process.

The factories and :func:`grid_plan` are shared by the other export tests; workers import the
factories as ``tests.test_export_grids:<name>``. Profiles are measured by
``planner.profiler.profile_model`` (one repeat: only the layer structure and parameter counts
matter here); the transformer blocks get their :class:`~planner.ir.BlockShape` from the model's
config where the profiler does not record it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import tempfile
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from planner import ir
from planner.export.building import build_turn, release_others
from planner.export.data import data_spec
from planner.export.layers import disable_dropout, load_layers
from planner.export.partition import manual_plan
from planner.runner import max_rel_diff, reference_losses
from tests.conftest import make_cluster_dict

ROOT = Path(__file__).resolve().parents[1]
STEPS = 3
FP32_TOL = 1e-5
LR = 0.3
"""SGD with momentum at a learning rate that moves the loss visibly in three steps (a wrong gradient shows)."""

SEQ = 8
VOCAB = 64
BATCH = 8


def tiny_gpt2() -> tuple[nn.Module, torch.Tensor]:
    """GPT-2 with 4 blocks of width 32 and 4 heads, tied wte/lm_head (transformers' own classes)."""
    from planner.profiler.zoo import gpt2

    model = gpt2(n_layer=4, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=16, bos_token_id=0, eos_token_id=0)
    return model, torch.randint(0, VOCAB, (BATCH, SEQ))


@cache
def profile(factory: str) -> ir.ModelProfile:
    """The measured profile of ``factory`` (its transformer blocks carry their block shapes)."""
    from planner.profiler.core import profile_model
    from planner.profiler.loader import load_model

    torch.manual_seed(0)
    loaded = load_model(f"tests.test_export_grids:{factory}", BATCH)
    prof = profile_model(loaded, mode="measured", threads=1, repeats=1, warmup=0, whole_repeats=0)
    assert any(lp.block is not None for lp in prof.layers)  # the profiler records block shapes
    return prof


def grid_plan(factory: str, parts: Sequence[int], tp: int = 1, dp: int = 1, *, zero: int = 0,
              recompute: str = "none", precision: str = "fp32", sequence_parallel: bool = False,
              microbatches: int = 2, schedule: str = "1f1b", optimizer: str = "momentum",
              servers: tuple[int, int] = (2, 4)) -> ir.Plan:
    """A plan of ``len(parts) - 1`` stages of ``tp x dp`` devices; blocks run ``tp`` when tp > 1.

    ``servers``: the cluster's servers and GPUs per server; stages take devices in order."""
    prof = profile(factory)
    base = manual_plan(prof, ir.Cluster.from_dict(make_cluster_dict(*servers)), parts, tp * dp,
                              microbatches=microbatches, schedule=schedule, optimizer=optimizer,
                              predicted=ir.Prediction(0.01, 800.0, 0.1, 0))
    stages = tuple(dataclasses.replace(
        st, tp=tp, zero=zero, recompute=recompute, sequence_parallel=sequence_parallel,
        forms=tuple("tp" if tp > 1 and prof.layers[i].block is not None else "dp" for i in range(*st.layers)))
        for st in base.stages)
    return dataclasses.replace(base, stages=stages, precision=precision, engine="torch")


def tiny_gpt2_untied() -> tuple[nn.Module, torch.Tensor]:
    from planner.profiler.zoo import gpt2

    model = gpt2(n_layer=4, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=16, bos_token_id=0, eos_token_id=0,
                 tie_word_embeddings=False)
    return model, torch.randint(0, VOCAB, (BATCH, SEQ))


def tiny_gpt2_frozen() -> tuple[nn.Module, torch.Tensor]:
    """The untied tiny GPT-2 with its embeddings frozen (fine-tuning): a first stage of them trains nothing."""
    model, x = tiny_gpt2_untied()
    for p in model.transformer.wte.parameters():
        p.requires_grad_(False)
    for p in model.transformer.wpe.parameters():
        p.requires_grad_(False)
    return model, x


# ----------------------------------------------------------------------------- one launch, many plans


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def train_plans(docs: str, out: str) -> None:
    """In a joined process group: train each plan ``STEPS`` steps; write per plan this rank's losses, what it
    built and the server (torchrun's node rank) it ran on, one JSON line each, to ``out/rank<R>.jsonl``."""
    torch.set_num_threads(1)
    import torch.distributed as dist

    from planner.export.torch import Trainer

    dist.init_process_group("gloo")
    with open(Path(out, f"rank{dist.get_rank()}.jsonl"), "w") as f:
        for name, doc in json.loads(docs).items():
            plan = ir.Plan.from_dict(doc)
            with build_turn(plan):  # as the exported scripts build
                layers, example = load_layers(plan.model, plan, 0)
                for layer in layers:
                    disable_dropout(layer)
                spec = data_spec(layers, example, "cross_entropy")
                release_others(layers, plan, dist.get_rank())
            trainer = Trainer(layers, plan, "cross_entropy", lr=LR)
            losses = [trainer(*spec.batch(s, plan.batch_size, 0)) for s in range(STEPS)]
            node = int(os.environ.get("GROUP_RANK", "0"))
            f.write(json.dumps({"plan": name, "losses": losses, "node_rank": node, **trainer.describe()}) + "\n")
            f.flush()
    dist.destroy_process_group()


def _grid_worker(rank: int, world: int, port: int, docs: str, out: str) -> None:
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    sys.path.insert(0, str(ROOT))
    train_plans(docs, out)


def read_runs(plans: dict[str, ir.Plan], out: Path, world: int) -> dict[str, list[dict[str, Any]]]:
    """Per plan, every rank's JSON line (:func:`train_plans`), in rank order."""
    lines = [json.loads(ln) for r in range(world) for ln in Path(out, f"rank{r}.jsonl").read_text().splitlines()]
    return {k: sorted((d for d in lines if d["plan"] == k), key=lambda d: d["rank"]) for k in plans}


def plans_json(plans: dict[str, ir.Plan]) -> str:
    """The plans as one JSON document (name -> plan), as :func:`train_plans` reads them."""
    return json.dumps({k: p.to_dict() for k, p in plans.items()})


def run_grids(plans: dict[str, ir.Plan], world: int = 4) -> dict[str, list[dict[str, Any]]]:
    """Run every plan in one launch of ``world`` processes; per plan, every rank's JSON line."""
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_grid_worker, args=(world, _free_port(), plans_json(plans), out), nprocs=world, join=True,
                           start_method="spawn")
        return read_runs(plans, Path(out), world)


def reference(plan: ir.Plan) -> list[float]:
    """Single-process training of the unsplit model on the same data (planner.runner's --check)."""
    return list(_reference(plan.model, plan.stages[0].dp, plan.microbatches, plan.optimizer))


@cache
def _reference(model: str, dp: int, microbatches: int, optimizer: str) -> tuple[float, ...]:
    plan = grid_plan(model.split(":")[1], [0, len(profile(model.split(":")[1]).layers)], dp=dp,
                     microbatches=microbatches, optimizer=optimizer)
    layers, example = load_layers(plan.model, plan, 0)
    spec = data_spec(layers, example, "cross_entropy")
    return tuple(reference_losses(layers, plan, spec, STEPS, 0, dp, lr=LR))


# ----------------------------------------------------------------------------- the grids

BF16_TOL = 1e-3
"""bf16 products round to 8 significant bits (2^-8 relative each); the mean loss over a batch averages
those errors, and over three steps of a tiny model it moved by at most 2.1e-5 against fp32 training
(torch and DeepSpeed grids, measured). 1e-3 leaves that a 50x margin and stays below the 8e-3 that a
gradient off by the data-parallel factor causes (test_a_wrong_gradient_is_caught)."""

GRIDS: dict[str, dict[str, Any]] = {
    "pp2-dp2-zero1-full": {"parts": [0, 2, 6], "dp": 2, "zero": 1, "recompute": "full"},
    "pp2-dp2-zero3-selective": {"parts": [0, 4, 6], "dp": 2, "zero": 3, "recompute": "selective"},
    "pp2-tp2-sp-selective": {"parts": [0, 3, 6], "tp": 2, "sequence_parallel": True, "recompute": "selective"},
    "tp2-dp2-zero1": {"parts": [0, 6], "tp": 2, "dp": 2, "zero": 1},
    "tp2-dp2-zero3-full": {"parts": [0, 6], "tp": 2, "dp": 2, "zero": 3, "recompute": "full"},
    "tp2-dp2-zero2-bf16": {"parts": [0, 6], "tp": 2, "dp": 2, "zero": 2, "precision": "bf16"},
    "pp2-dp2-bf16-gpipe": {"parts": [0, 3, 6], "dp": 2, "precision": "bf16", "schedule": "gpipe"},
    # bf16 casts (export.sharding.Bf16Compute) of weights tied across stages, under ZeRO-1's proxies and redone by
    # full recomputation; and of tensor-parallel DTensors
    "pp2-dp2-zero1-bf16-full": {"parts": [0, 3, 6], "dp": 2, "zero": 1, "precision": "bf16", "recompute": "full"},
    "pp2-tp2-bf16": {"parts": [0, 3, 6], "tp": 2, "precision": "bf16"},
}


def expected_rank(plan: ir.Plan, rank: int) -> dict[str, Any]:
    """What rank ``rank`` must build for ``plan``: rank = pp x (dp x tp) + replica x tp + tensor rank;
    in a tensor group of two or more, the ``dp``-form layers compute their share of the samples. It frees the
    weights of every layer with weights that it does not run, but for a layer tied to one it runs."""
    first = plan.stages[0]
    pp, d, t = rank // first.width, (rank // first.tp) % first.dp, rank % first.tp
    st = plan.stages[pp]
    own = list(range(*st.layers))
    kept = set(own)
    for _ in plan.profile.ties:  # ties connected through a layer: as many passes as ties reach every member
        kept |= {i for tie in plan.profile.ties if kept.intersection(tie.layers) for i in tie.layers}
    weighted = [i for i, layer in enumerate(plan.profile.layers) if layer.param_count or any(
        i in tie.layers for tie in plan.profile.ties)]
    return {"coords": {"pp": pp, "dp": d, "tp": t}, "stages": [pp], "layers": own,
            "tp_layers": [i for i, f in zip(own, st.forms, strict=True) if f == "tp"],
            "sample_split_layers": [i for i, f in zip(own, st.forms, strict=True) if f == "dp" and st.tp > 1],
            "zero": st.zero, "recompute": [] if st.recompute == "none" else [st.recompute],
            "bf16": plan.precision == "bf16", "released_layers": [i for i in weighted if i not in kept]}


def check_grid_run(name: str, plan: ir.Plan, ranks: list[dict[str, Any]]) -> float:
    """Every rank built what the plan says (:func:`expected_rank`) and trained like one process (the
    tolerance of the plan's precision); returns the largest relative loss difference."""
    assert len(ranks) == plan.world_size, name
    for r, doc in enumerate(ranks):
        assert doc["rank"] == r, (name, r)
        built = {k: doc[k] for k in expected_rank(plan, r)}
        assert built == expected_rank(plan, r), (name, r)
    diff = max_rel_diff(ranks[0]["losses"], reference(plan))
    print(f"{name}: max relative loss difference {diff:.2e}")
    assert diff < (BF16_TOL if plan.precision == "bf16" else FP32_TOL), (name, diff)
    assert all(d["losses"] == ranks[0]["losses"] for d in ranks), name
    return diff


@pytest.mark.slow
def test_grids_train_like_one_process_and_build_what_the_plan_says() -> None:
    """pp x dp, pp x tp and tp x dp grids of a tiny GPT-2, ZeRO 0-3, recomputation none/full/selective,
    sequence parallelism, fp32 and bf16: every rank's coordinates, layers, tensor-sharded layers,
    ZeRO stage and wrappers are the plan's, and the losses are single-process training's."""
    plans = {name: grid_plan("tiny_gpt2", **kw) for name, kw in GRIDS.items()}
    got = run_grids(plans)
    for name, plan in plans.items():
        check_grid_run(name, plan, got[name])


@pytest.mark.slow
def test_planner_run_check_trains_a_tp_by_dp_zero3_grid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI path: `planner run --engine torch --check --json` on tp 2 x dp 2 with ZeRO-3 and full recompute."""
    from click.testing import CliRunner

    from planner.cli import main

    monkeypatch.chdir(ROOT)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(grid_plan("tiny_gpt2", [0, 6], tp=2, dp=2, zero=3, recompute="full").to_dict()))
    res = CliRunner().invoke(main, ["run", str(path), "--model", "tests.test_export_grids:tiny_gpt2", "--engine",
                                    "torch", "--steps", "3", "--warmup", "1", "--check", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["world_size"] == 4 and doc["max_rel_loss_diff"] < FP32_TOL


def test_a_wrong_gradient_is_caught() -> None:
    """The tolerance is not loose: training with gradients off by the data-parallel factor differs by more."""
    plan = grid_plan("tiny_gpt2", [0, 6], dp=2)
    layers, example = load_layers(plan.model, plan, 0)
    spec = data_spec(layers, example, "cross_entropy")
    wrong = reference_losses(layers, plan, spec, STEPS, 0, 2, lr=LR * 2)  # an all-reduce that sums, not averages
    assert max_rel_diff(wrong, reference(plan)) > BF16_TOL


def tiny_llama() -> tuple[nn.Module, torch.Tensor]:
    """transformers' LlamaForCausalLM, the zoo's llama-tiny (hidden 64, 2 blocks, 4 heads, 2 KV heads, SwiGLU)."""
    from planner.profiler.hfzoo import llama

    model = llama("llama-tiny", bos_token_id=0, eos_token_id=0)
    return model, torch.randint(0, 256, (BATCH, SEQ))


def tiny_decoder(name: str, **fields: Any) -> tuple[nn.Module, torch.Tensor]:
    """Zoo decoder ``name`` cut to hidden 64, 2 blocks, 4 heads, 2 KV heads, FFN 128, 256 tokens."""
    from planner.profiler.hfzoo import build

    model = build(name, SEQ, {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                              "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256,
                              "bos_token_id": 0, "eos_token_id": 0, **fields})
    return model, torch.randint(0, 256, (BATCH, SEQ))


def tiny_qwen2() -> tuple[nn.Module, torch.Tensor]:
    """Qwen2: Llama's block with biases on q, k and v (sharded with their columns)."""
    return tiny_decoder("qwen2-7b")


def tiny_qwen3() -> tuple[nn.Module, torch.Tensor]:
    """Qwen3: per-head q/k norms and a head size (32) that is not hidden / heads (16)."""
    return tiny_decoder("qwen3-8b", head_dim=32)


def _tiny_family(family: str, **fields: object) -> tuple[nn.Module, torch.Tensor]:
    """transformers' ``<family>ForCausalLM`` as the profiler's tests build it (hidden 64, 2 blocks), 256 tokens."""
    from tests.test_profiler_hfsplit import family_model

    return family_model(family, vocab=256, **fields), torch.randint(0, 256, (BATCH, SEQ))


def tiny_gemma() -> tuple[nn.Module, torch.Tensor]:
    """Gemma: GeGLU, an embedding that scales its output by sqrt(hidden) in its own forward, tied to the head."""
    return _tiny_family("Gemma")


def tiny_phi3() -> tuple[nn.Module, torch.Tensor]:
    """Phi-3: fused q/k/v and gate/up projections (its blocks are not sharded: data and pipeline parallel)."""
    return _tiny_family("Phi3")


def tiny_gpt_neox() -> tuple[nn.Module, torch.Tensor]:
    """GPT-NeoX (Pythia): q/k/v fused per head (not sharded), parallel residual, its own module names."""
    return _tiny_family("GPTNeoX")


def tiny_opt() -> tuple[nn.Module, torch.Tensor]:
    """OPT: learned positions offset by 2, a head tied to the token embedding, post-attention LayerNorms."""
    return _tiny_family("OPT")


def tiny_bloom() -> tuple[nn.Module, torch.Tensor]:
    """BLOOM: ALiBi biases and an additive causal mask rebuilt in each block, the embedding's LayerNorm, a tied head."""
    return _tiny_family("Bloom")


def tiny_falcon() -> tuple[nn.Module, torch.Tensor]:
    """Falcon 7B's shape: multi-query attention beside the MLP, rotary positions, an explicit causal mask, tied head."""
    return _tiny_family("Falcon")


def tiny_mixtral() -> tuple[nn.Module, torch.Tensor]:
    """Mixtral: each token routed to 2 of 4 experts, whose weights are 3-D parameters (not sharded)."""
    return _tiny_family("Mixtral")


def tiny_qwen3_moe() -> tuple[nn.Module, torch.Tensor]:
    """Qwen3-MoE: 2 of 4 experts a token, q/k norms."""
    return _tiny_family("Qwen3Moe")


def tiny_gpt_bigcode() -> tuple[nn.Module, torch.Tensor]:
    """GPT-BigCode (StarCoder): GPT-2's layers with multi-query attention, its head tied across stages."""
    return _tiny_family("GPTBigCode")


def tiny_gptj() -> tuple[nn.Module, torch.Tensor]:
    """GPT-J: attention beside the MLP, sinusoidal rotary positions over part of each head, an untied head."""
    return _tiny_family("GPTJ")


def tiny_gpt_neo() -> tuple[nn.Module, torch.Tensor]:
    """GPT-Neo: GPT-2's layers with global and local (a window of 5 of the 8 tokens) layers, eager attention."""
    return _tiny_family("GPTNeo")


def _encoder(family: str, kind: str, **fields: object) -> nn.Module:
    """transformers' ``<family><kind>`` (BERT's or RoBERTa's config) at hidden 32, 2 blocks of 4 heads, 3 labels."""
    import transformers

    config = getattr(transformers, f"{family}Config")(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                                      num_attention_heads=4, intermediate_size=64,
                                                      max_position_embeddings=16, num_labels=3, **fields)
    return getattr(transformers, f"{family}{kind}")(config)


def tiny_bert_classifier() -> tuple[nn.Module, torch.Tensor]:
    """BERT as sequence classifier: its pooler over the first token, dropout and classifier in the last layer."""
    return _encoder("Bert", "ForSequenceClassification"), torch.randint(0, VOCAB, (BATCH, SEQ))


def tiny_roberta() -> tuple[nn.Module, torch.Tensor]:
    """RoBERTa as masked LM: positions counted from the token ids, its head tied to the word embedding."""
    return _encoder("Roberta", "ForMaskedLM"), torch.randint(2, VOCAB, (BATCH, SEQ))


def tiny_vit() -> tuple[nn.Module, torch.Tensor]:
    """ViT as image classifier: 16 patches of 4 x 4 pixels and the class token, the classifier over that token."""
    import transformers

    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                    image_size=16, patch_size=4, num_labels=5)
    return transformers.ViTForImageClassification(config), torch.randn(BATCH, 3, 16, 16)


def tiny_mpt() -> tuple[nn.Module, torch.Tensor]:
    """MPT: ALiBi biases over max_seq_len positions, a boolean causal mask, its head tied to the embedding."""
    import transformers

    config = transformers.MptConfig(vocab_size=256, d_model=64, n_layers=2, n_heads=4, max_seq_len=SEQ)
    return transformers.MptForCausalLM(config), torch.randint(0, 256, (BATCH, SEQ))


def tiny_arcee() -> tuple[nn.Module, torch.Tensor]:
    """Arcee: Llama's block with an ungated ReLU^2 MLP (up and down only)."""
    return _tiny_family("Arcee")


def tiny_helium() -> tuple[nn.Module, torch.Tensor]:
    """Helium: a class the planner does not name, recognised by its forwards' code as Llama's
    (planner.profiler.hfcode), its blocks Llama's code too and so sharded."""
    return _tiny_family("Helium", head_dim=16)


def tiny_granite() -> tuple[nn.Module, torch.Tensor]:
    """Granite: Llama's forwards with its embeddings multiplied and its logits divided (in the end layers), its head
    tied to the embedding across the pipeline; Llama's attention and MLP, its residuals scaled (sharded)."""
    return _tiny_family("Granite", head_dim=16, embedding_multiplier=12.0, logits_scaling=8.0, residual_multiplier=0.22,
                        attention_multiplier=0.0625, tie_word_embeddings=True)


def tiny_starcoder2() -> tuple[nn.Module, torch.Tensor]:
    """Starcoder2: Llama's forwards with a functional dropout of the embeddings (kept as a module in the first
    layer), an ungated MLP of its own names (not sharded)."""
    return _tiny_family("Starcoder2", head_dim=16, sliding_window=None)


def tiny_gemma2() -> tuple[nn.Module, torch.Tensor]:
    """Gemma 2: sliding (a window of 5 of the 8 tokens) and full layers alternating, eager attention with soft-capped
    scores and logits, norms before and after attention and MLP."""
    return _tiny_family("Gemma2", head_dim=16, sliding_window=5, attn_implementation="eager",
                        attn_logit_softcapping=5.0, final_logit_softcapping=2.0)


def tiny_gemma3() -> tuple[nn.Module, torch.Tensor]:
    """Gemma 3: local (a window of 5 of the 8 tokens) and global layers, each with its rotary base; per-head q/k
    norms."""
    return _tiny_family("Gemma3Text", head_dim=16, sliding_window=5,
                        layer_types=["sliding_attention", "full_attention"])


def tiny_exaone4() -> tuple[nn.Module, torch.Tensor]:
    """EXAONE 4: sliding and full layers (a window of 5 of the 8 tokens), per-head q/k norms, post-norms."""
    return _tiny_family("Exaone4", head_dim=16, sliding_window=5, layer_types=["sliding_attention", "full_attention"])


LLAMA_GRIDS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-pp2-tp2-sp": ("tiny_llama", {"parts": [0, 2, 4], "tp": 2, "sequence_parallel": True}),
    "llama-tp2-dp2-zero3-selective": ("tiny_llama", {"parts": [0, 4], "tp": 2, "dp": 2, "zero": 3,
                                                     "recompute": "selective"}),
    "llama-pp2-dp2-zero1-full": ("tiny_llama", {"parts": [0, 1, 4], "dp": 2, "zero": 1, "recompute": "full"}),
    "qwen2-pp2-tp2-sp": ("tiny_qwen2", {"parts": [0, 2, 4], "tp": 2, "sequence_parallel": True}),
    "qwen3-tp2-dp2-zero1": ("tiny_qwen3", {"parts": [0, 4], "tp": 2, "dp": 2, "zero": 1}),
    "llama-tp2-dp2-zero1-bf16-sp": ("tiny_llama", {"parts": [0, 4], "tp": 2, "dp": 2, "zero": 1, "precision": "bf16",
                                                   "sequence_parallel": True}),
    "gemma-pp2-tp2-sp": ("tiny_gemma", {"parts": [0, 2, 4], "tp": 2, "sequence_parallel": True}),
    "phi3-pp2-dp2-zero1": ("tiny_phi3", {"parts": [0, 2, 4], "dp": 2, "zero": 1}),
    "arcee-tp2-dp2-zero1": ("tiny_arcee", {"parts": [0, 4], "tp": 2, "dp": 2, "zero": 1}),
    "helium-pp2-tp2-sp": ("tiny_helium", {"parts": [0, 2, 4], "tp": 2, "sequence_parallel": True}),
    "granite-pp2-dp2-zero1": ("tiny_granite", {"parts": [0, 2, 4], "dp": 2, "zero": 1}),
    "granite-tp2-dp2-zero1-sp": ("tiny_granite", {"parts": [0, 4], "tp": 2, "dp": 2, "zero": 1,
                                                  "sequence_parallel": True}),
    "starcoder2-pp2-dp2-zero3": ("tiny_starcoder2", {"parts": [0, 2, 4], "dp": 2, "zero": 3}),
    "gemma2-pp2-tp2-sp": ("tiny_gemma2", {"parts": [0, 2, 4], "tp": 2, "sequence_parallel": True}),
    "gemma3-tp2-dp2-zero1-sp": ("tiny_gemma3", {"parts": [0, 4], "tp": 2, "dp": 2, "zero": 1,
                                                "sequence_parallel": True}),
    "exaone4-pp2-tp2": ("tiny_exaone4", {"parts": [0, 2, 4], "tp": 2}),
    "gpt-neox-pp2-dp2-zero3": ("tiny_gpt_neox", {"parts": [0, 2, 4], "dp": 2, "zero": 3}),
    "opt-pp2-dp2-zero1": ("tiny_opt", {"parts": [0, 2, 4], "dp": 2, "zero": 1}),
    "bloom-pp2-dp2-zero3": ("tiny_bloom", {"parts": [0, 2, 4], "dp": 2, "zero": 3}),
    "falcon-pp2-dp2-zero1": ("tiny_falcon", {"parts": [0, 2, 4], "dp": 2, "zero": 1}),
    "mixtral-pp2-dp2-zero1": ("tiny_mixtral", {"parts": [0, 2, 4], "dp": 2, "zero": 1}),
    "gpt-bigcode-pp2-dp2": ("tiny_gpt_bigcode", {"parts": [0, 2, 4], "dp": 2}),
    "mpt-pp2-dp2-zero1": ("tiny_mpt", {"parts": [0, 2, 4], "dp": 2, "zero": 1}),
    "gptj-pp2-dp2-zero1": ("tiny_gptj", {"parts": [0, 2, 4], "dp": 2, "zero": 1}),
    "gpt-neo-pp2-dp2-zero3": ("tiny_gpt_neo", {"parts": [0, 2, 4], "dp": 2, "zero": 3}),
    "bert-classifier-pp2-tp2": ("tiny_bert_classifier", {"parts": [0, 2, 4], "tp": 2}),
    "roberta-tp2-dp2-zero1": ("tiny_roberta", {"parts": [0, 4], "tp": 2, "dp": 2, "zero": 1}),
    "vit-pp2-dp2-zero1": ("tiny_vit", {"parts": [0, 2, 4], "dp": 2, "zero": 1}),
    "qwen3-moe-dp4-zero3": ("tiny_qwen3_moe", {"parts": [0, 4], "dp": 4, "zero": 3}),
    "gpt2-frozen-embeddings-pp2-dp2-zero1": ("tiny_gpt2_frozen", {"parts": [0, 1, 6], "dp": 2, "zero": 1}),
    "gpt2-frozen-embeddings-pp2-dp2-zero3-bf16": ("tiny_gpt2_frozen", {"parts": [0, 1, 6], "dp": 2, "zero": 3,
                                                                      "precision": "bf16"}),
}


@pytest.mark.slow
def test_llama_grids_train_like_one_process() -> None:
    """A tiny Llama (rotary positions, grouped KV heads, gated MLP): tensor-parallel q/k/v/o and
    gate/up/down with sequence parallelism, ZeRO-3 with selective recomputation, ZeRO-1 with full;
    and the Llama-family decoders split the same way: Qwen2 (q/k/v biases), Qwen3 (q/k norms), Gemma (a scaled,
    tied embedding; GeGLU), Phi-3 (fused projections, not sharded), Arcee (an ungated MLP), Helium (recognised by its
    code), Granite (scaled embeddings and logits, tied), Starcoder2 (its embedding dropout, ZeRO-3), Gemma 2 (eager,
    soft-capped attention and logits, sliding windows shorter than the sequence), Gemma 3 (rotary and masks per layer
    type), EXAONE 4 (sliding and full layers), each sharded, GPT-NeoX (its
    own names, ZeRO-3), OPT (learned positions, its head tied across stages), BLOOM (ALiBi, its head tied across stages,
    ZeRO-3), Falcon (multi-query, its head tied across stages), Mixtral and Qwen3-MoE (routed experts, ZeRO-1 and 3),
    GPT-BigCode (multi-query), MPT (ALiBi), GPT-J (partial rotary), GPT-Neo (local layers, its head tied across
    stages, ZeRO-3), the encoders BERT (a sequence classifier, sharded), RoBERTa (a masked LM, sharded) and ViT (an
    image classifier); and a first stage whose weights are all frozen (fine-tuning: it trains
    nothing)."""
    plans = {name: grid_plan(factory, **kw) for name, (factory, kw) in LLAMA_GRIDS.items()}
    got = run_grids(plans)
    for name, plan in plans.items():
        check_grid_run(name, plan, got[name])

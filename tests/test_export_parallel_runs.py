"""export.parallel in real 2-process tensor-parallel runs (gloo, `planner run --check`): BERT's layers, a frozen
GPT-2 block and split embeddings, each against single-process training. The factories are imported by the workers as
``tests.test_export_parallel_runs:<name>``; :func:`measured_plan` is shared by the other export tests."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
import torch
from torch import nn

from planner import ir
from planner.export.partition import manual_plan
from planner.runner import run_plan
from tests.conftest import make_cluster_dict, weights_agree

VOCAB, SEQ, BATCH = 64, 8, 8


def tiny_bert() -> tuple[nn.Module, torch.Tensor]:
    """BertForMaskedLM with 2 layers of width 32 and 4 heads (no dropout: equal runs compare)."""
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=16, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, attn_implementation="sdpa")
    return BertForMaskedLM(cfg), torch.randint(0, VOCAB, (BATCH, SEQ))


def tiny_gpt2_frozen_block() -> tuple[nn.Module, torch.Tensor]:
    """GPT-2 with 2 blocks of width 32, the first frozen (fine-tuning the rest)."""
    from planner.profiler.zoo import gpt2

    model = gpt2(n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=16, bos_token_id=0, eos_token_id=0)
    for p in model.transformer.h[0].parameters():
        p.requires_grad_(False)
    return model, torch.randint(0, VOCAB, (BATCH, SEQ))


def tiny_llama() -> tuple[nn.Module, torch.Tensor]:
    """LlamaForCausalLM with 2 layers of width 32, 4 heads and 2 KV heads, its embedding and head untied."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=16)
    return LlamaForCausalLM(cfg), torch.randint(0, VOCAB, (BATCH, SEQ))


class _Residual(nn.Module):
    """``x + relu(fc(x))``: one fx layer whose Linear's input is read again by the residual sum."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.fc(x))


def residual_mlp() -> tuple[nn.Module, torch.Tensor]:
    """A Linear, then two residual Linears with a norm after the last, then a head: fx layers a torch search splits
    ``split_out``, ``split_in``, ``split_in``, ``dp`` (a plan it emitted for 2 CPU processes, micro-batch size 1)."""
    return (nn.Sequential(nn.Linear(16, 32), _Residual(32), _Residual(32), nn.LayerNorm(32), nn.Linear(32, 4)),
            torch.randn(BATCH, 16))


def measured_plan(model: str, parts: Sequence[int], width: int = 1, *, tp: int = 1,
                  sequence_parallel: bool = False, microbatches: int = 2, engine: str = "torch") -> ir.Plan:
    """A plan of ``model`` (``module:factory``, measured once) over stages ``parts`` of ``width`` devices;
    with ``tp`` > 1 the transformer blocks run the ``tp`` form and the other layers ``dp``."""
    from planner.profiler.core import profile_model
    from planner.profiler.loader import load_model

    torch.manual_seed(0)
    prof = profile_model(load_model(model, BATCH), mode="measured", threads=1, repeats=1, warmup=0,
                         whole_repeats=0)
    base = manual_plan(prof, ir.Cluster.from_dict(make_cluster_dict(1, 8)), parts, width,
                       microbatches=microbatches, optimizer="sgd", predicted=ir.Prediction(0.01, 800.0, 0.1, 0))
    stages = tuple(dataclasses.replace(
        st, tp=tp, sequence_parallel=sequence_parallel,
        forms=tuple("tp" if tp > 1 and prof.layers[i].block is not None else "dp" for i in range(*st.layers)))
        for st in base.stages)
    return dataclasses.replace(base, stages=stages, engine=engine)


def _check(plan: ir.Plan, model: str) -> float:
    """The run's largest relative loss difference from one process, its trained weights checked too."""
    doc = run_plan(plan, model, engine="torch", steps=3, warmup=1, check=True)
    print(f"{model} {[s.forms for s in plan.stages]}: max relative loss difference {doc['max_rel_loss_diff']:.2e}, "
          f"weights {doc['max_rel_weight_diff']} ({doc['worst_weight']})")
    assert weights_agree(doc), doc
    return float(doc["max_rel_loss_diff"])


@pytest.mark.slow
@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_bert_layers_run_tensor_parallel_like_one_process(sequence_parallel: bool) -> None:
    """BertForMaskedLM on one stage of tp 2: its layers' query/key/value and intermediate column-parallel, both
    output denses row-parallel (with sequence parallelism, the post-norms on the sequence shard)."""
    model = "tests.test_export_parallel_runs:tiny_bert"
    plan = measured_plan(model, [0, 4], 2, tp=2, sequence_parallel=sequence_parallel)
    assert plan.stages[0].forms == ("dp", "tp", "tp", "dp")
    assert _check(plan, model) < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_a_frozen_gpt2_block_stays_frozen_when_it_runs_tensor_parallel(sequence_parallel: bool) -> None:
    """Its Conv1Ds become Linears that once trained (requires_grad by default): the losses drifted by 3.7e-4. Under
    sequence parallelism torch's SequenceParallel registered its norms' weights again as trainable: Adam trained
    the frozen norms and the losses moved by 3.4e-6 only, inside the check's 1e-5; the weights' check caught it."""
    model = "tests.test_export_parallel_runs:tiny_gpt2_frozen_block"
    plan = measured_plan(model, [0, 4], 2, tp=2, sequence_parallel=sequence_parallel)
    plan = dataclasses.replace(plan, optimizer="adam")
    assert plan.stages[0].forms == ("dp", "tp", "tp", "dp")
    assert _check(plan, model) < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize(("model", "n", "embedding", "sequence_parallel"),
                         [("tests.test_export_parallel_runs:tiny_llama", 4, "split_in", True),
                          ("tests.test_export_grids:tiny_gpt2_untied", 6, "split_out", False)])
def test_an_embedding_runs_split_over_its_vocabulary_or_width_like_one_process(
        model: str, n: int, embedding: str, sequence_parallel: bool) -> None:
    """The first layer's nn.Embedding (GPT-2's token one, not its position one) row-parallel over the vocabulary
    (its partial rows all-reduced) or column-parallel over its width, the blocks tp, the head column-parallel."""
    base = measured_plan(model, [0, n], 2, tp=2, sequence_parallel=sequence_parallel)
    assert base.profile.layers[0].type == "Embedding" and base.stages[0].layers == (0, n)
    forms = (embedding, *base.stages[0].forms[1:-1], "split_out")
    plan = dataclasses.replace(base, stages=(dataclasses.replace(base.stages[0], forms=forms),))
    assert _check(plan, model) < 1e-5


@pytest.mark.slow
def test_a_column_layer_before_a_residual_row_layer_runs_like_one_process() -> None:
    """split_out -> split_in where the row layer's input is also its residual: the column layer gathers its output
    (before, it kept it sharded, and the residual sum failed: 16 features against 32)."""
    model = "tests.test_export_parallel_runs:residual_mlp"
    base = measured_plan(model, [0, 4], 2, tp=2)
    stage = dataclasses.replace(base.stages[0], forms=("split_out", "split_in", "split_in", "dp"))
    assert _check(dataclasses.replace(base, stages=(stage,)), model) < 1e-5

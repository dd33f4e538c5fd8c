"""When no plan fits: the least memory over every problem searched, the plan that needs it, and hints that
name only what the request does not already use."""

from __future__ import annotations

import math
from typing import Any

import pytest

from planner import ir
from planner.cluster import cluster_from_dict
from planner.errors import InfeasibleError
from planner.search import search
from tests.conftest import make_cluster_dict, make_profile_dict


def _heavy(batch_size: int = 8, **overrides: Any) -> ir.ModelProfile:
    """Four layers whose activations dominate memory: more micro-batches need less."""
    d = make_profile_dict(4, batch_size=batch_size, **overrides)
    for layer in d["layers"]:
        layer["saved_bytes"] = 20_000_000
    return ir.ModelProfile.from_dict(d)


def _llm() -> ir.ModelProfile:
    """Two transformer blocks (an LLM: sgd is no advice for it), profiled in bf16."""
    d = make_profile_dict(2, batch_size=8, dtype="bfloat16")
    for layer in d["layers"]:
        layer.update(in_features=256, out_features=256, saved_bytes=20_000_000,
                     block={"hidden": 256, "heads": 4, "kv_heads": 4, "ffn": 1024, "seq_len": 64})
    return ir.ModelProfile.from_dict(d)


def _error(profile: ir.ModelProfile, memory: int = 5_000_000, **options: Any) -> InfeasibleError:
    cluster = cluster_from_dict(make_cluster_dict(1, 2, memory_bytes=memory))
    with pytest.raises(InfeasibleError) as exc:
        search(profile, cluster, **options)
    return exc.value


def test_auto_microbatches_report_the_least_need_over_every_count_and_its_plan() -> None:
    profile = _heavy(batch_size=12)  # searched in the order 6, 3, 2, 1, 12, 4 (lower bounds): 4 is not the least
    needs = {m: _error(profile, microbatches=m).needed_bytes or 0 for m in (1, 2, 3, 4, 6, 12)}
    assert needs[12] == min(needs.values()) < needs[4] < needs[1]
    auto = _error(profile)
    assert auto.needed_bytes == needs[12]
    assert "12 micro-batches of 1 sample per data-parallel rank, config " in auto.cause
    assert "(the least over micro-batch counts 1, 2, 3, 4, 6, 12)" in auto.cause
    assert "micro-batch counts 1/2/3/4/6/12 were tried" in auto.hint


def test_the_hint_estimates_how_many_gpus_of_this_kind_the_need_implies() -> None:
    err = _error(_heavy())
    assert err.needed_bytes is not None
    assert f"about {math.ceil(err.needed_bytes * 2 / 5_000_000)} GPUs of " in err.hint
    assert "an estimate" in err.hint


def test_hints_name_what_the_request_does_not_use() -> None:
    err = _error(_heavy(), microbatches=1, schedule="gpipe", optimizer="adam")
    for hint in ("more micro-batches", "--schedule 1f1b", "--precision bf16", "--optimizer (sgd"):
        assert hint in err.hint
    assert "--zero 3" not in err.hint and "--recompute full" not in err.hint and "--tp auto" not in err.hint
    fixed = _error(_heavy(), zero=1, recompute="selective", tp=1)
    for hint in ("--zero 3", "--recompute full", "--tp auto"):
        assert hint in fixed.hint


def test_an_engines_search_with_tp_auto_is_not_told_to_use_tp_auto() -> None:
    """Review 2: torch's search fixes each problem's tensor degree (one mesh for every stage); the hint named
    '--tp auto' to a request that already had it."""
    err = _error(_llm(), memory=1_000_000, optimizer="adam", engine="torch")
    assert "tensor degrees 1/2, ZeRO" in err.hint and "--tp auto" not in err.hint
    assert "--tp auto" in _error(_llm(), memory=1_000_000, optimizer="adam", engine="torch", tp=2).hint


def test_hints_leave_out_what_is_already_used() -> None:
    err = _error(_heavy(), precision="bf16", optimizer="adam")  # 1f1b and every micro-batch count already
    for hint in ("more micro-batches", "--schedule", "--precision"):
        assert hint not in err.hint
    llm = _error(_llm(), memory=1_000_000, optimizer="adam")  # bf16 profile: bf16 precision already
    for hint in ("--optimizer", "--precision", "--schedule", "more micro-batches"):
        assert hint not in llm.hint
    assert "GPUs of " in llm.hint


def test_a_fixed_micro_batch_size_hints_at_a_smaller_one_not_at_more_micro_batches() -> None:
    err = _error(_heavy(), micro_batch_size=2)
    assert "a smaller --micro-batch-size than 2" in err.hint and "more micro-batches" not in err.hint


def test_an_engine_searched_per_zero_stage_reports_every_stage_tried_and_names_its_limit() -> None:
    err = _error(_heavy(), engine="deepspeed")
    assert "ZeRO 0/1, recomputation none/full" in err.hint
    assert "an --engine that runs ZeRO-3 (--engine deepspeed runs ZeRO 0/1)" in err.hint and "--zero 3" not in err.hint


def test_on_gpus_of_two_sizes_the_cause_gives_their_range_not_the_least_as_the_most() -> None:
    """A server with a 5 MB GPU and one with a 6 MB GPU: the cause said "(4.77 MiB per device at most)", the
    least memory given as the most any device has."""
    doc = make_cluster_dict(2, 1, memory_bytes=5_000_000)
    doc["nodes"][1]["gpus"][0]["memory_bytes"] = 6_000_000
    with pytest.raises(InfeasibleError) as exc:
        search(_heavy(), cluster_from_dict(doc))
    assert "(4.77 MiB to 5.72 MiB per device)" in exc.value.cause
    assert "at most" not in exc.value.cause.split(";")[0]
    assert "(4.77 MiB per device at most)" in _error(_heavy()).cause


@pytest.mark.parametrize("candidates", [0, 16])
def test_the_least_memory_named_counts_what_the_dp_leaves_out(candidates: int) -> None:
    """A tie's gradient made twice on one stage at M = 1 is counted after the DP (planner.search.solutions): the
    bisection alone named 8.39 MiB for a plan that needs 10.30, and a search on GPUs of that memory failed. The
    figure is now the plan's whole peak, and a search on GPUs of exactly that much finds a plan."""
    from planner import ir

    doc = make_profile_dict(4, batch_size=8, ties=[{"name": "wte", "layers": [0, 3], "param_count": 250_000,
                                                    "param_bytes": 1_000_000}])
    profile = ir.ModelProfile.from_dict(doc)
    with pytest.raises(InfeasibleError) as exc:
        search(profile, cluster_from_dict(make_cluster_dict(1, 1, 5_000_000)), microbatches=1, engine="torch",
               candidates=candidates)
    need = exc.value.needed_bytes
    assert need is not None and "needs 10.30 MiB per device" in exc.value.cause
    plan = search(profile, cluster_from_dict(make_cluster_dict(1, 1, need)), microbatches=1, engine="torch",
                  candidates=candidates)
    assert plan.stages[0].memory_bytes <= need


def test_a_micro_batch_size_and_count_that_fix_the_data_parallel_degree_say_so() -> None:
    """--micro-batch-size 1 --microbatches 2 of a batch of 8 asks every stage for 4 data-parallel ranks; on a cluster
    whose --config stage holds 2 the error names the degree it needed, not only the micro-batch size."""
    from planner.errors import PlanError

    profile = ir.ModelProfile.from_dict(make_profile_dict(4, batch_size=8))
    cluster = cluster_from_dict(make_cluster_dict(1, 2))
    with pytest.raises(PlanError, match=r"--microbatches 2 \(a data-parallel degree of 4 in every stage\)"):
        search(profile, cluster, micro_batch_size=1, microbatches=2, config=(2,))


def test_a_config_stage_no_grid_of_which_splits_the_batch_names_the_config() -> None:
    """--config 3 on a batch of 16 (3 GPUs: tp 1 x dp 3 only) told the user to try another micro-batch count, size or
    --tp, none of which helps: the cause and the hint now name --config."""
    from planner.errors import PlanError

    profile = ir.ModelProfile.from_dict(make_profile_dict(4, batch_size=16))
    cluster = cluster_from_dict(make_cluster_dict(1, 4))
    with pytest.raises(PlanError) as err:
        search(profile, cluster, config=(3,))
    assert err.value.cause.endswith("with micro-batch counts [1, 2, 4, 8, 16] and --config 3")
    assert err.value.hint.endswith("or --config stage widths whose data-parallel degree divides the batch")


def test_a_count_above_what_auto_tries_is_named_as_an_option_to_give() -> None:
    """A prime batch: auto tries 1 micro-batch only (MAX_AUTO_MICROBATCHES), and the hint names the next count that
    divides the batch, to give with --microbatches, rather than 'auto searches every count'."""
    doc = make_profile_dict(2, batch_size=8191)
    for layer in doc["layers"]:
        layer["saved_bytes"] = 10**9
    with pytest.raises(InfeasibleError) as err:
        search(ir.ModelProfile.from_dict(doc), cluster_from_dict(make_cluster_dict(1, 1, 10**9)))
    assert "--microbatches 8191 (the next count that divides the batch of 8191, above the 4096 auto tries" \
        in err.value.hint

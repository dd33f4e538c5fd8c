"""scripts/bench_published.py, published_fsdp.py, published_h100_fsdp.py, published_mpt.py and published_v100.py:
published runs written as plans, as their papers ran them (issue 15's and issue 11's published figures): they fit,
they are predicted within 0.85..1.15 of the published throughput (the H100 runs, whose GPU's peak is not known, within
the bracket of no and full recomputation), and the planner's own plan is no slower."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import bench_published as bp
import published_fsdp as pf
import published_h100_fsdp as ph
import published_llama3_405b as pl
import published_mpt as pm
import published_v100 as pv

from planner import gpus
from planner.judge import judge
from planner.search import search

SC21 = [row for row in bp.ROWS if row.name.startswith("gpt-")]
KORTHIKANTI = [row for row in bp.ROWS if row.name.startswith("sp-")]


@pytest.mark.parametrize("row", bp.ROWS, ids=lambda r: r.name)
def test_published_plan_is_the_papers_layout_and_fits(row: bp.Published) -> None:
    prof, _, judged, _ = bp.published_fidelity(row)
    plan = judged.plan
    dp = row.gpus // (row.t * row.p)
    assert len(plan.stages) == row.p * row.virtual_stages and plan.pipeline_stages == row.p
    schedule = "interleaved" if row.virtual_stages > 1 else "1f1b"
    assert (plan.schedule, plan.virtual_stages) == (schedule, row.virtual_stages)
    assert all(s.devices == plan.stages[c % row.p].devices for c, s in enumerate(plan.stages))
    assert {(s.tp, s.dp, s.zero) for s in plan.stages} == {(row.t, dp, row.zero)}
    assert {(s.recompute, s.sequence_parallel) for s in plan.stages} == {(row.recompute, row.sequence_parallel)}
    assert plan.microbatches * dp * row.micro_batch == row.batch
    assert sum(s.layers[1] - s.layers[0] for s in plan.stages) == len(prof.layers)
    assert judged.fits, judged.reason


MISSED = pytest.mark.xfail(strict=True, reason="MT-NLG's 2021 stack: predicted 1.20-1.25x its published throughput")


@pytest.mark.parametrize("row", [pytest.param(r, marks=MISSED) if r in bp.MTNLG else r for r in bp.ROWS],
                         ids=lambda r: r.name)
def test_published_runs_are_predicted_within_15_percent(row: bp.Published) -> None:
    _, _, _, ratio = bp.published_fidelity(row)
    assert pf.TARGET[0] <= ratio <= pf.TARGET[1]


def test_mtnlg_rows_are_the_papers_throughputs_and_the_known_miss_is_optimistic() -> None:
    """MT-NLG's iteration times give the 126, 121 and 113 TFLOP/s per GPU it published; the model predicts all three
    faster (the miss is one-sided: its 2021 stack ran the layout of SC'21's 529.6B row at 0.7-0.8 of that row's
    speed), and its predicted throughput falls as the pipelines' micro-batches do, as the published one does."""
    assert [row.tflops for row in bp.MTNLG] == pytest.approx([126, 121, 113], abs=1.0)  # published to 3 digits
    ratios = [bp.published_fidelity(row)[3] for row in bp.MTNLG]
    predicted = [ratio * row.tflops for ratio, row in zip(ratios, bp.MTNLG, strict=True)]
    assert all(1.15 < ratio < 1.35 for ratio in ratios), ratios
    assert predicted == sorted(predicted, reverse=True)


def test_the_sustained_share_is_the_fit_on_the_fit_rows_only() -> None:
    assert bp.fit_sustained() == pytest.approx(gpus.SUSTAINED, abs=0.005)
    assert all(row in SC21 for row in bp.FIT_ROWS) and bp.ROWS[-1] not in bp.FIT_ROWS
    assert len(bp.ROWS) - len(bp.FIT_ROWS) >= 5  # held out


def test_korthikanti_rows_are_the_papers_times() -> None:
    """Table 5's iteration times, by the rows' TFLOP/s: the present work's model FLOPs utilisation (SC'21's count
    without recomputation, 72 B s l h^2 (1 + s/6h + V/12lh), over 312 TFLOP/s) is the paper's 41.5-56.3%."""
    assert len(KORTHIKANTI) == 8
    for row, mfu in zip([r for r in KORTHIKANTI if r.sequence_parallel], (0.415, 0.514, 0.560, 0.563), strict=True):
        b, s, h, lay, v = row.batch, row.seq, row.hidden, row.layers, row.vocab
        flops = 72.0 * b * s * lay * h * h * (1 + s / (6 * h) + v / (12 * lay * h))
        iteration_s = bp.model_flops(row) / (row.tflops * 1e12 * row.gpus)
        assert flops / iteration_s / row.gpus / 312e12 == pytest.approx(mfu, rel=0.005)  # times given to 10 ms


def test_korthikanti_rows_run_table_3s_micro_batches_and_section_6s_schedules() -> None:
    """Table 3 gives the micro-batch (4 for 22B, whose global batch is 4; 1 for the others) and section 6 says "We use
    the interleaving schedule with three interleaving stages (m = 3) for the 175B and 530B models": 4 and 1 blocks a
    chunk; 1T (2 blocks a stage) and 22B (one stage) run 1F1B. Interleaving is what the 530B rows gain over SC'21's
    529.6B pipeline: their bubble is 34 of 3 x 280 + 34 chunk slots, not 34 of 314."""
    layout = {row.name.split("-")[1]: (row.micro_batch, row.virtual_stages) for row in KORTHIKANTI}
    assert layout == {"22b": (4, 1), "175b": (1, 3), "530b": (1, 3), "1t": (1, 1)}
    row = next(r for r in KORTHIKANTI if r.name == "sp-530b-full")
    interleaved = bp.published_fidelity(row)[3]
    one_f_one_b = bp.published_fidelity(dataclasses.replace(row, virtual_stages=1))[3]
    assert interleaved > 1.03 * one_f_one_b


def test_selective_recomputation_and_sequence_parallelism_gain_what_the_paper_measured() -> None:
    """Each Korthikanti model, full recomputation against selective with sequence parallelism: the predicted
    speed-up is within 10% of the measured one (1.29-1.32x)."""
    for full, sel in zip(KORTHIKANTI[::2], KORTHIKANTI[1::2], strict=True):
        assert (full.recompute, sel.recompute, sel.sequence_parallel) == ("full", "selective", True)
        published = sel.tflops / full.tflops
        full_s, sel_s = (bp.published_fidelity(row)[2].prediction.iteration_s for row in (full, sel))
        predicted = full_s / sel_s
        assert published * 0.9 <= predicted <= published * 1.1, (full.name, published, predicted)


def test_larger_layers_reach_a_larger_share_of_peak() -> None:
    """The roofline's shape law: the 1008B model's layers (h/t = 3200) run nearer the peak than 18.4B's (768)."""
    def tflops(row: bp.Published) -> float:
        block = next(x for x in bp.row_profile(row).layers if x.block is not None)
        return block.forward_flops / block.forward_s / 1e12
    small, large = (next(r for r in bp.ROWS if r.name == n) for n in ("gpt-18.4b", "gpt-1008b"))
    assert tflops(large) > 1.1 * tflops(small)


def test_model_flops_is_the_sc21_formula() -> None:
    """96 B s l h^2 (1 + s/6h + V/16lh): the 1.7B row's per-iteration FLOPs, by hand."""
    row = bp.ROWS[0]
    b, s, h, lay, v = 512, 2048, 2304, 24, 51200
    assert bp.model_flops(row) == pytest.approx(96 * b * s * lay * h * h * (1 + s / (6 * h) + v / (16 * lay * h)))


def test_planner_plan_fits_and_is_no_slower_than_the_published_one() -> None:
    prof, clus, judged, _ = bp.published_fidelity(bp.ROWS[0])
    mine = search(prof, clus, optimizer="adam", precision="bf16")
    assert mine.predicted.iteration_s <= judged.prediction.iteration_s * (1 + 1e-9)
    assert judge(mine).fits


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt-1.7b", "gpt-1008b"])
def test_the_planners_own_analytic_profile_predicts_published_runs(name: str) -> None:
    """Issue 15's complaint: the analytic path predicted a published data-parallel GPT run on A100s 1.41x too
    fast. Through planner profile's roofline (at the share training sustains) the 1.7B run is within 15%
    (1.32 at the best-case share), and so is the largest, held out of the fit."""
    row = next(r for r in bp.ROWS if r.name == name)
    _, _, judged, ratio = bp.profiler_fidelity(row)
    assert 0.85 <= ratio <= 1.15 and judged.fits


@pytest.mark.parametrize("row", pf.ROWS, ids=lambda r: r.name)
def test_torchtitans_published_fsdp_runs_fit_and_are_predicted_within_15_percent(row: pf.FsdpRun) -> None:
    """torchtitan's Llama runs with FSDP on 64 A100s, profiled as a user would (analytic, the transformers model):
    the 70B runs with full checkpointing fit (each block keeps its input; the stage as one checkpoint needed 259 GiB)
    and the predicted throughput, FSDP's gathers beside the compute, is within 0.85..1.15 of the published."""
    judged, ratio = pf.fsdp_fidelity(row)
    assert judged.fits, judged.reason
    (stage,) = judged.plan.stages
    assert (stage.tp, stage.dp, stage.zero, stage.recompute) == (1, 64, 3, row.recompute)
    assert judged.plan.micro_batch_size(stage) == row.local_batch
    assert pf.TARGET[0] <= ratio <= pf.TARGET[1]


@pytest.mark.parametrize("row", ph.ROWS, ids=lambda r: f"{r.gpus} GPUs")
def test_torchtitans_h100_runs_lie_between_full_and_no_recomputation_at_the_sxm_peak(row: ph.H100Row) -> None:
    """torchtitan's eager FSDP Llama 3.1 8B on 8 and 128 H100s (per-op checkpointing, 5,762 and 5,605 tokens/s/GPU),
    held out of the H100's fitted share (published_mpt.py): at the SXM peak the planner's full and no recomputation
    bracket them. (Before that share, at 0.81 of the best cases as on the A100, even full recomputation was
    predicted faster than published at the SXM peak.)"""
    low, high = (ph.predicted(row, rc, ph.PEAKS_BF16["SXM"]) for rc in ("full", "none"))
    assert low <= row.tokens_per_s <= high


def test_the_h100_share_is_the_fit_on_mpts_8_gpu_rows() -> None:
    """planner.gpus.SUSTAINED_H100 is what ``published_mpt.py --fit`` finds on its fit rows (H100 only, 8 GPUs at
    2048 tokens), lower than the A100's share fitted on SC'21: the same llm-foundry runs sustained 38-46% of the
    H100's peak and 55-64% of the A100's."""
    fit = [row for row in pm.ROWS if row.fit]
    assert fit and all(row.gpu == "h100" and row.gpus == 8 and row.seq == 2048 for row in fit)
    assert pm.fit_h100() == pytest.approx(gpus.SUSTAINED_H100, abs=0.005)
    assert gpus.SUSTAINED_H100 < gpus.SUSTAINED
    assert gpus.gpu_spec("h200").sustained == gpus.gpu_spec("h100").sustained == gpus.SUSTAINED_H100
    assert gpus.gpu_spec("a100").sustained == gpus.SUSTAINED


def test_mpts_held_out_runs_are_mostly_within_15_percent() -> None:
    """Held out: every A100 row (the A100 share comes from SC'21, not from these) is within 0.85..1.15, and so are
    six of the nine H100 rows run on more GPUs, longer sequences or at large scale; the other three, each with full
    recomputation, sit at 0.84-0.85 (docs/fidelity.md: the H100 rows with recomputation lean slow)."""
    held = [row for row in pm.ROWS if not row.fit]
    ratios = {row: pm.ratio(row) for row in held}
    assert all(fits for _, fits in ratios.values())
    inside = {row for row, (r, _) in ratios.items() if pm.TARGET[0] <= r <= pm.TARGET[1]}
    assert {row for row in held if row.gpu != "h100"} <= inside
    assert all(r >= 0.8 for r, _ in ratios.values())
    assert len([row for row in inside if row.gpu == "h100"]) >= 6


@pytest.mark.parametrize("run", pv.ROWS, ids=lambda r: r.name)
def test_megatron_v100_runs_are_predicted_within_15_percent_with_the_a100s_share(run: pv.V100Run) -> None:
    """Held out: a Volta GPU in fp16, nothing fitted on it; both Megatron's kernels and planner profile's path."""
    assert pv.server(run.t).gpus[0].flops_for("fp16") == pv.PEAK_FP16
    for profile in (pv.megatron_profile(run), pv.hf_profile(run)):
        ratio, fits = pv.ratio(run, profile)
        assert fits and pv.TARGET[0] <= ratio <= pv.TARGET[1], (run.name, ratio)


def test_the_dgx2h_peak_is_the_posts_48_percent() -> None:
    """The post's 62.4 TFLOP/s is "48% of the theoretical peak" of a DGX-2H GPU: 130 TFLOP/s, not the V100 SXM2's
    125 of the catalogue."""
    share = 62.4e12 / pv.PEAK_FP16
    assert 0.475 <= share <= 0.485
    assert gpus.gpu_spec("v100-32gb").peak("fp16") < pv.PEAK_FP16


def test_llama3_405b_layouts_are_meta_s_and_stay_below_its_throughput() -> None:
    """Meta's 8,192-GPU layout as written: 16 pipeline ranks of tensor 8 x data 64, 126 blocks with the embedding and
    head taking a block's place on the end ranks, chunk c on rank c mod 16; with full recomputation it fits and is
    predicted 0.5-0.65 of the published 430 TFLOP/s, no recomputation does not fit 80 GB (docs/fidelity.md: the row
    is left out of the published table, and this pins what the script prints)."""
    gpus, dp, per_rank, published = pl.ROWS[0]
    prof = pl.profile(dp * per_rank)
    full = judge(pl.layout(prof, gpus, per_rank, "full", 4))
    plan = full.plan
    assert len(plan.stages) == 64 and plan.stages[0].layers == (0, 2) and plan.stages[-1].layers == (126, 128)
    assert all(s.devices == plan.stages[c % 16].devices for c, s in enumerate(plan.stages))
    assert {(s.tp, s.dp) for s in plan.stages} == {(8, 64)}
    tflops = pl.flops_per_token() * dp * per_rank * pl.SEQ / full.prediction.iteration_s / gpus / 1e12
    assert full.fits and 0.5 < tflops / published < 0.65
    assert not judge(pl.layout(prof, gpus, per_rank, "none", 4)).fits



@pytest.mark.parametrize("row", bp.ROWS, ids=lambda r: r.name)
def test_block_counts_cover_the_blocks_and_each_chunk_is_whole(row: bp.Published) -> None:
    counts = bp.block_counts(row)
    assert len(counts) == row.p and sum(counts) == row.layers
    assert all(c % row.virtual_stages == 0 for c in counts)

"""costmodel.precision: bytes per value, and a profile's times moved to a cluster's GPUs (the rescale note)."""

from __future__ import annotations

import dataclasses

import pytest

from planner import gpus, ir
from planner.costmodel.precision import MATCH_TOLERANCE, flop_scale, rescale_note
from tests.conftest import make_cluster_dict, make_profile_dict


def _cpu_cluster(flops: float, concurrent: float | None = 1.0) -> ir.Cluster:
    """Two CPU processes on one node of ``concurrent`` cores (None: a node that shares nothing)."""
    gpus = tuple(ir.GPU(f"cpu{i}", flops, 2**30) for i in range(2))
    node = ir.Node("cpu", gpus, concurrent, 0.8 if concurrent else None)
    link = ir.Link(1e9, 1e-5)
    return ir.Cluster("calibrated-cpu", (node,), (("intra_node", link), ("inter_node", link)))


def _profile(device: str, flops: float) -> ir.ModelProfile:
    return dataclasses.replace(ir.ModelProfile.from_dict(make_profile_dict(4)), device=device, device_flops=flops)


def test_no_note_when_the_peaks_agree_and_the_factor_otherwise() -> None:
    cluster = ir.Cluster.from_dict(make_cluster_dict(1, 2))
    peak = min(g.flops for g in cluster.gpus)
    assert rescale_note(_profile("rtx2080ti", peak * 1.005), cluster, "fp32") is None
    note = rescale_note(_profile("rtx2080ti", peak * 2), cluster, "fp32")
    assert note is not None and note.factor == pytest.approx(2.0) and note.matched_factor is None
    assert note.warning is None and note.to_dict()["warning"] is None


def test_a_cpu_profile_on_a_cluster_matched_to_it_has_the_core_shares_factor_and_no_warning() -> None:
    # 2 processes on 1 core at 0.8 efficiency: the cluster's flops are 0.4 of one process alone
    cluster = _cpu_cluster(0.4e10)
    note = rescale_note(_profile("cpu", 1e10), cluster, "fp32")
    assert note is not None and note.factor == pytest.approx(2.5) and note.matched_factor == pytest.approx(2.5)
    assert note.warning is None


@pytest.mark.parametrize("off", [MATCH_TOLERANCE * 1.01, 1 / (MATCH_TOLERANCE * 1.01), 90.0])
def test_a_cpu_profile_far_from_the_clusters_speed_is_warned_with_what_to_do(off: float) -> None:
    note = rescale_note(_profile("cpu", 1e10 * off), _cpu_cluster(0.4e10), "fp32")
    assert note is not None and note.warning is not None
    assert f"{off:.3g} times" in note.warning and "--match-profile" in note.warning
    assert note.to_dict()["warning"] == note.warning


def test_inside_the_tolerance_or_off_a_calibrated_cpu_cluster_nothing_is_warned() -> None:
    assert rescale_note(_profile("cpu", 1e10 * 1.4), _cpu_cluster(0.4e10), "fp32").warning is None  # type: ignore[union-attr]
    gpu_profile = rescale_note(_profile("h100", 1e15), _cpu_cluster(0.4e10), "fp32")
    assert gpu_profile is not None and gpu_profile.warning is None  # an analytic GPU profile: rescaled on purpose
    unshared = rescale_note(_profile("cpu", 1e12), _cpu_cluster(1e10, concurrent=None), "fp32")
    assert unshared is not None and unshared.warning is None  # a hand-written cluster: nothing to compare with


def test_a_profile_moved_between_catalogued_gpus_scales_by_the_rates_training_sustains() -> None:
    """An A100 profile (bf16 GEMMs sustained at 0.70 of 312 TFLOP/s) on H100s (0.51 of 989.4): 2.31x faster, as the
    analytic profiler times the two GPUs, not the peaks' 3.17x; the note says so."""
    a100, h100 = gpus.gpu_spec("a100"), gpus.gpu_spec("h100")
    rate = {g.name: g.peak("bf16") * g.large_gemm_share("bf16") * g.sustained for g in (a100, h100)}
    profile = dataclasses.replace(_profile("a100", a100.peak("bf16")), dtype="bfloat16")
    assert flop_scale(profile, h100.peak("bf16")) == pytest.approx(rate["a100"] / rate["h100"])
    assert 2.2 < 1 / flop_scale(profile, h100.peak("bf16")) < 2.4
    cluster = ir.Cluster("h100s", (ir.Node("s0", (h100.to_gpu("g0"), h100.to_gpu("g1"))),),
                         (("intra_node", ir.Link(4.5e11, 2e-6)), ("inter_node", ir.Link(5e10, 5e-6))))
    note = rescale_note(profile, cluster, "bf16")
    assert note is not None and note.factor == pytest.approx(flop_scale(profile, h100.peak("bf16")))
    assert note.shares == pytest.approx(note.factor * h100.peak("bf16") / a100.peak("bf16"))
    assert "sustained shares" in note.text and note.to_dict()["shares"] == note.shares and note.warning is None


@pytest.mark.parametrize(("profile_flops", "peak"), [(1e10, 0.4e10), (312e12, 300e12), (250e12, 989.4e12)])
def test_a_peak_no_catalogued_gpu_has_scales_by_the_peaks_alone(profile_flops: float, peak: float) -> None:
    """A measured CPU's rate, a cluster file's own figure: nothing to say what training sustains there."""
    assert flop_scale(_profile("x", profile_flops), peak) == pytest.approx(profile_flops / peak)


@pytest.mark.parametrize(("mine", "theirs"), [("h100", "h200"), ("a100", "a100-40gb"), ("v100", "v100-32gb")])
def test_gpus_of_one_die_scale_by_the_peaks_alone(mine: str, theirs: str) -> None:
    peak = gpus.peak_flops(theirs, "fp32")
    assert flop_scale(_profile(mine, gpus.peak_flops(mine, "fp32")), peak) == pytest.approx(
        gpus.peak_flops(mine, "fp32") / peak)


@pytest.mark.parametrize(("source", "target"), [("a100", "h100"), ("h100", "a100"), ("v100", "a100")])
def test_a_gpus_analytic_profile_moved_to_another_gpu_times_it_as_that_gpus_own_does(source: str, target: str) -> None:
    """The two ways to a prediction on ``target``: profile for it, or profile for ``source`` and let the cost model
    move the times. A GEMM-bound model (width 2048, 1024 tokens): the moved times are within 15% of the target's own
    (A100 to H100 by the peaks alone: 1.3x too fast)."""
    from planner.api import profile_model

    fmt = "fp16" if "v100" in (source, target) else "bf16"
    dtype = {"fp16": "float16", "bf16": "bfloat16"}[fmt]
    widths = {"n_embd": 2048, "n_head": 16, "n_layer": 2, "vocab_size": 32768, "n_positions": 1024}

    def total_s(gpu: str) -> tuple[ir.ModelProfile, float]:
        prof = profile_model("gpt2", batch_size=8, mode="analytic", input_shape=(1024,), dtype=dtype,
                             device_flops=gpu, overrides=widths)
        return prof, sum(x.forward_s + x.backward_s for x in prof.layers)

    moved, moved_s = total_s(source)
    _, own_s = total_s(target)
    ratio = moved_s * flop_scale(moved, gpus.peak_flops(target, fmt)) / own_s
    assert 0.85 <= ratio <= 1.15, ratio


@pytest.mark.parametrize(("device", "dtype", "precision", "expected", "fix"), [
    ("a100", "float32", "bf16", "fp32", "--dtype bfloat16"),  # a reviewer's: predicted 22% fast, with a note only
    ("a100-tf32", "float32", "fp32", "tf32", "not NAME-tf32"),  # scaled 8x onto the fp32 peak
])
def test_a_profile_in_another_number_format_than_the_plan_is_warned_with_the_fix(
        device: str, dtype: str, precision: str, expected: str, fix: str) -> None:
    from planner.profiler.analytic import named_peak

    profile = dataclasses.replace(_profile(device, named_peak(device, dtype)), dtype=dtype)
    a100 = gpus.gpu_spec("a100")
    cluster = ir.Cluster("a100s", (ir.Node("s0", (a100.to_gpu("g0"),)),),
                         (("intra_node", ir.Link(3e11, 3e-6)), ("inter_node", ir.Link(2.5e10, 5e-6))))
    note = rescale_note(profile, cluster, precision)
    assert note is not None and note.profile_format == expected and note.warning is not None
    assert f"times are {expected} and the plan computes in {precision}" in note.warning and fix in note.warning
    assert note.to_dict()["warning"] == note.warning


def test_a_profile_moved_to_another_gpu_in_its_own_format_is_not_warned() -> None:
    profile = dataclasses.replace(_profile("a100", 312e12), dtype="bfloat16")
    h100 = gpus.gpu_spec("h100")
    cluster = ir.Cluster("h100s", (ir.Node("s0", (h100.to_gpu("g0"),)),),
                         (("intra_node", ir.Link(4.5e11, 2e-6)), ("inter_node", ir.Link(5e10, 5e-6))))
    note = rescale_note(profile, cluster, "bf16")
    assert note is not None and note.profile_format == "bf16" and note.warning is None


def _node(name: str, *peaks_tflops: float) -> ir.Node:
    return ir.Node(name, tuple(ir.GPU(f"{name}.g{i}", 67e12, 80 * 2**30, 3.35e12, (("bf16", p * 1e12),))
                               for i, p in enumerate(peaks_tflops)))


def test_a_mixed_group_is_timed_on_its_slowest_gpu_by_sustained_rate_not_by_the_lowest_peak() -> None:
    """Two H100s and two GPUs of 756 TFLOP/s bf16, a peak no catalogued GPU has (a reviewer's): an A100 profile moves
    to the H100s at the two GPUs' shares (x0.433) and to the others by the peaks alone (x0.413), so the H100s are the
    slower for it and the group waits for them; timed at the lowest peak, the mixed group came out faster than four
    H100s and the search put a stage on the 756s alone."""
    from planner.cluster import group_of
    from planner.costmodel.precision import slowest_peak

    link = ir.Link(4.5e11, 2e-6)
    mixed = ir.Cluster("mix", (_node("a", 989.4, 989.4), _node("b", 756, 756)), (("intra_node", link),
                                                                                 ("inter_node", link)))
    profile = dataclasses.replace(_profile("a100", 312e12), dtype="bfloat16")
    group = group_of(mixed, [g.name for g in mixed.gpus], "bf16")
    assert group.peaks == (756e12, 989.4e12)
    assert slowest_peak(profile, group.peaks) == 989.4e12
    assert flop_scale(profile, 989.4e12) > flop_scale(profile, 756e12)
    note = rescale_note(profile, mixed, "bf16")
    assert note is not None and note.cluster_flops == 989.4e12  # the note names the GPU the times are moved to


@pytest.mark.parametrize(("source", "target", "fmt"), [("v100", "h100", "fp16"), ("a100", "h100", "bf16"),
                                                        ("h100", "v100", "fp16")])
def test_a_gpu_profiles_fixed_part_is_host_time_and_is_not_moved_with_the_peaks(source: str, target: str,
                                                                                 fmt: str) -> None:
    """GPT-2 small at 16 x 128 tokens is host-bound on every GPU (the roofline's host floor per kernel): its fixed
    part is about the same on a V100, an A100 and an H100. Moved by the peaks with the rest, a V100 profile on H100s
    was predicted 4.3x faster than the H100's own (a reviewer's); now within 15% of it. A CPU profile's fixed part
    is its cores' work and moves with them."""
    from planner.api import profile_model
    from planner.costmodel.batch import times_at
    from planner.costmodel.precision import fixed_scale

    dtype = {"fp16": "float16", "bf16": "bfloat16"}[fmt]

    def made_for(gpu: str) -> ir.ModelProfile:
        return profile_model("gpt2", batch_size=16, mode="analytic", dtype=dtype, device_flops=gpu)

    def total_s(prof: ir.ModelProfile, peak: float) -> float:
        at = times_at(prof, prof.batch_size)
        return float((at.fwd_fixed + at.bwd_fixed).sum() * fixed_scale(prof, peak)
                      + (at.fwd_var + at.bwd_var).sum() * flop_scale(prof, peak))

    moved, own = made_for(source), made_for(target)
    peak = gpus.peak_flops(target, fmt)
    assert 0.85 <= total_s(moved, peak) / total_s(own, peak) <= 1.15
    assert fixed_scale(moved, peak) == 1.0
    cpu = _profile("cpu", 1e10)
    assert fixed_scale(cpu, 0.4e10) == flop_scale(cpu, 0.4e10) == pytest.approx(2.5)


def test_bf16_and_fp16_times_move_alike_and_a_gpu_without_the_plans_format_is_named_by_its_own() -> None:
    """A V100's fp16 profile searched in bf16 on A100s is not warned (same bytes, tensor cores both); a bf16
    profile on a cluster whose slowest GPU has no bf16 peak (an RTX 2080 Ti computes it at its fp32 peak) is: the
    note names that GPU's format, fp32."""
    v100 = dataclasses.replace(_profile("v100", 125e12), dtype="float16")
    a100 = gpus.gpu_spec("a100")
    link = ir.Link(3e11, 3e-6)
    a100s = ir.Cluster("a100s", (ir.Node("s0", (a100.to_gpu("g0"),)),), (("intra_node", link), ("inter_node", link)))
    note = rescale_note(v100, a100s, "bf16")
    assert note is not None and note.warning is None
    turing = gpus.gpu_spec("rtx2080ti")
    mixed = ir.Cluster("mixed", (ir.Node("s0", (a100.to_gpu("g0"), turing.to_gpu("g1"))),),
                       (("intra_node", link), ("inter_node", link)))
    bf16 = dataclasses.replace(_profile("a100", 312e12), dtype="bfloat16")
    note = rescale_note(bf16, mixed, "bf16")
    assert note is not None and note.number_format == "fp32" and note.cluster_flops == 13.4e12
    assert note.warning is not None and "plan computes in fp32" in note.warning

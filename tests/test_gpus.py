"""planner.gpus: the GPU catalog (data-sheet peaks per number format, memory, bandwidth); pure Python."""

from __future__ import annotations

import subprocess
import sys

import pytest

from planner import gpus
from planner.errors import UsageError


def test_data_sheet_peaks() -> None:
    assert gpus.peak_flops("a100", "bf16") == 312e12 and gpus.peak_flops("a100", "fp32") == 19.5e12
    assert gpus.peak_flops("a100", "tf32") == 156e12 and gpus.peak_flops("A100-40GB", "fp16") == 312e12
    assert gpus.peak_flops("h100", "bf16") == pytest.approx(989.4e12) and gpus.peak_flops("h100", "fp32") == 67e12
    assert gpus.peak_flops("v100", "fp16") == 125e12 and gpus.peak_flops("v100", "fp32") == 15.7e12
    assert gpus.peak_flops("rtx2080ti", "fp32") == 13.4e12 and gpus.peak_flops("rtx2080ti", "fp16") == 53.8e12


def test_memory_and_bandwidth() -> None:
    a100 = gpus.gpu_spec("a100")
    assert a100.memory_bytes == 80 * 2**30 and a100.memory_bandwidth_Bps == 2.039e12
    assert gpus.gpu_spec("a100-40gb").memory_bytes == 40 * 2**30
    assert gpus.gpu_spec("rtx2080ti").memory_bytes == 11 * 2**30
    assert gpus.gpu_spec("h100").memory_bandwidth_Bps == 3.35e12


def test_every_gpu_has_fp32_and_tensor_cores_beat_it() -> None:
    for name in gpus.GPU_NAMES:
        spec = gpus.gpu_spec(name)
        assert spec.name == name and spec.peak_flops["fp32"] > 0
        assert all(spec.peak_flops[f] >= spec.peak_flops["fp32"] for f in spec.peak_flops)
        assert set(spec.peak_flops) <= set(gpus.NUMBER_FORMATS)


def test_missing_formats_and_unknown_names_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="v100 has no bf16 peak"):
        gpus.peak_flops("v100", "bf16")
    with pytest.raises(UsageError, match="unknown GPU") as err:
        gpus.gpu_spec("tpu9")
    assert "a100" in err.value.hint
    with pytest.raises(UsageError, match="unknown number format"):
        gpus.peak_flops("a100", "int8")


def test_number_format_of_dtype() -> None:
    assert [gpus.number_format_of_dtype(d) for d in ("float32", "bfloat16", "torch.float16")] == ["fp32", "bf16",
                                                                                                   "fp16"]
    with pytest.raises(UsageError):
        gpus.number_format_of_dtype("int8")


def test_to_gpu_gives_a_cluster_device() -> None:
    gpu = gpus.gpu_spec("a100").to_gpu("s0.g0")
    assert gpu.name == "s0.g0" and gpu.flops == 19.5e12 and gpu.memory_bytes == 80 * 2**30
    assert gpu.flops_for("bf16") == 312e12 and gpu.flops_for("tf32") == 156e12
    assert gpus.gpu_spec("v100").to_gpu("g").flops_for("bf16") == 15.7e12  # no bf16 peak: the fp32 one


def test_imports_no_torch() -> None:
    code = "import sys, planner.gpus; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_roofline_constants_sms_gemm_shares_and_launch() -> None:
    assert [gpus.gpu_spec(n).sm_count for n in ("rtx2080ti", "v100", "a100", "a100-40gb", "h100")] == [
        68, 80, 108, 108, 132]
    a100, h100 = gpus.gpu_spec("a100"), gpus.gpu_spec("h100")
    assert a100.large_gemm_share("bf16") == a100.large_gemm_share("fp16") == pytest.approx(267.9 / 312)
    assert h100.large_gemm_share("bf16") == pytest.approx(792.1 / 989)  # MAMF measurements
    assert a100.large_gemm_share("fp32") == gpus.DEFAULT_GEMM_SHARE == 0.80  # none published: the assumption
    assert gpus.gpu_spec("v100").large_gemm_share("fp16") == gpus.DEFAULT_GEMM_SHARE
    assert all(gpus.gpu_spec(n).launch_s == gpus.LAUNCH_S == 4e-6 for n in gpus.GPU_NAMES)
    assert a100.fused_attention_share("bf16") == pytest.approx(0.615) and h100.fused_attention_share("fp16") == 0.35
    assert a100.fused_attention_share("fp32") == a100.large_gemm_share("fp32")  # unpublished: the GEMM share
    for name in gpus.GPU_NAMES:
        spec = gpus.gpu_spec(name)
        assert all(0 < spec.large_gemm_share(f) <= 1 for f in spec.peak_flops)
    with pytest.raises(UsageError, match="v100 has no bf16 peak"):
        gpus.gpu_spec("v100").large_gemm_share("bf16")


def test_h200_is_the_h100_die_with_more_and_faster_memory() -> None:
    h100, h200 = gpus.gpu_spec("h100"), gpus.gpu_spec("h200")
    assert dict(h200.peak_flops) == dict(h100.peak_flops) and h200.sm_count == h100.sm_count == 132
    assert h200.memory_bytes == 140 * 2**30 and h200.memory_bandwidth_Bps == 4.8e12
    assert h200.large_gemm_share("bf16") == h100.large_gemm_share("bf16")


def test_the_h100_holds_the_memory_the_card_reports_and_its_preset_agrees() -> None:
    """An H100 80GB reports 81559 MiB (nvidia-smi), less than 80 GiB: a plan filled to 80 GiB would not run."""
    from planner.cluster import load_cluster

    assert gpus.gpu_spec("h100").memory_bytes == 81559 * 2**20 < 80 * gpus.GIB
    assert {g.memory_bytes for g in load_cluster("h100-8x8-nvlink-ib").gpus} == {81559 * 2**20}


def test_training_share_is_the_rooflines_for_a_catalogued_peak_and_none_elsewhere() -> None:
    for name in ("a100", "h100", "v100", "rtx2080ti"):
        spec = gpus.gpu_spec(name)
        for fmt in spec.peak_flops:
            roofline = gpus.roofline_of(name, fmt)
            assert gpus.training_share(spec.peak(fmt) * (1 + gpus.PEAK_MATCH / 2)) == pytest.approx(
                roofline.gemm_share)
    assert gpus.training_share(40e9) is None  # a CPU's measured rate
    assert gpus.training_share(312e12 * (1 + 3 * gpus.PEAK_MATCH)) is None  # a cluster file's own figure


def test_peak_format_names_the_format_a_catalogued_peak_is_in() -> None:
    assert gpus.peak_format(156e12) == "tf32" and gpus.peak_format(19.5e12) == "fp32"
    assert gpus.peak_format(312e12) is None  # bf16 and fp16 alike: either
    assert gpus.peak_format(40e9) is None

"""Analytic times: a layer's FLOPs over the device's peak FLOP/s times an efficiency.

``time = flops / (device_flops * efficiency)``, forward and backward alike. The peak
figures are dense fp32 throughput (the paper's RTX 2080Ti figure is 13.4 TFLOP/s);
for the A100 and H100 the fp32 figures are given, plus ``-tf32`` entries with the dense
TF32 tensor-core peak that PyTorch uses for fp32 matmuls/convolutions when TF32 is on.

The default efficiency, 0.5, is the share of peak that fp32 training of convolution and
GEMM layers typically sustains on these GPUs (cuDNN/cuBLAS reach 40-70% on large layers;
small layers and memory-bound element-wise work pull the average down). It is one number
for every layer, so it scales all times alike and does not change which plan is fastest
when every device in a cluster is described the same way; pass ``--efficiency`` to change it.
"""

from __future__ import annotations

from planner.errors import UsageError

GPU_PEAK_FLOPS: dict[str, float] = {
    "rtx2080ti": 13.4e12,   # PipePar paper's figure (fp32, boost clock)
    "v100": 15.7e12,        # V100 SXM2, fp32
    "a100": 19.5e12,        # A100, fp32 (non-tensor-core)
    "a100-tf32": 156e12,    # A100, dense TF32 tensor cores
    "h100": 67e12,          # H100 SXM, fp32 (non-tensor-core)
    "h100-tf32": 494.7e12,  # H100 SXM, dense TF32 tensor cores
}
"""Peak FLOP/s of named GPUs, as accepted by ``--device-flops``."""

DEFAULT_GPU = "rtx2080ti"
ANALYTIC_EFFICIENCY = 0.5
"""Share of peak FLOP/s an analytic profile assumes every layer reaches."""


def resolve_device_flops(value: str | float | None, default: str | None = DEFAULT_GPU) -> tuple[float | None, str]:
    """``"rtx2080ti"``, ``"13.4e12"`` or a number -> (FLOP/s, label); None -> the default GPU."""
    if value is None:
        if default is None:
            return None, ""
        return GPU_PEAK_FLOPS[default], default
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
        label = f"{number:g} FLOP/s"
    else:
        text = str(value).strip().lower()
        if text in GPU_PEAK_FLOPS:
            return GPU_PEAK_FLOPS[text], text
        try:
            number = float(text)
        except ValueError:
            raise UsageError(f"--device-flops {value!r} is neither a number nor a known GPU",
                             f"use a FLOP/s figure such as 13.4e12 or one of {', '.join(GPU_PEAK_FLOPS)}") from None
        label = f"{number:g} FLOP/s"
    if not number > 0 or number == float("inf"):
        raise UsageError(f"--device-flops must be a positive number, got {value!r}", "e.g. 13.4e12")
    return number, label


def analytic_time(flops: float, device_flops: float, efficiency: float = ANALYTIC_EFFICIENCY) -> float:
    """Seconds to do ``flops`` on a device of ``device_flops`` peak at ``efficiency``."""
    return float(flops) / (device_flops * efficiency)

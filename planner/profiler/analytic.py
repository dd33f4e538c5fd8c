"""Analytic times: which peak a ``--device-flops`` value means, and the flat-efficiency formula.

By default an analytic profile on a named GPU is timed by the roofline
(``planner.profiler.roofline``: per kernel, compute at a shape-dependent share of peak or
memory traffic at the GPU's bandwidth, whichever is longer, plus a launch cost). An explicit
``--efficiency E``, or a ``--device-flops`` number (no GPU, so no bandwidth), times every layer
flat: ``time = flops / (device_flops * efficiency)``, forward and backward alike. A GPU name
(``planner.gpus``: rtx2080ti, v100, a100, h100, ...) gives the dense peak for the number
format the profile computes in: float32 -> fp32 (or the TF32 tensor-core peak, which PyTorch
uses for fp32 matmuls when TF32 is on, for a name ending in ``-tf32``: ``a100-tf32``),
bfloat16 -> bf16, float16 -> fp16 (tensor cores). The paper's RTX 2080Ti fp32 figure is
13.4 TFLOP/s; the A100's bf16 peak is 312 TFLOP/s.

The flat efficiency for a FLOP/s number, 0.5, is the share of peak that fp32 training of
convolution and GEMM layers typically sustains on these GPUs (cuDNN/cuBLAS reach 40-70% on
large layers; small layers and memory-bound element-wise work pull the average down). It is
one number for every layer, so it scales all times alike; the shipped 2080Ti profiles were
made with it (``profiles/README.md``).
"""

from __future__ import annotations

from planner import gpus
from planner.errors import UsageError
from planner.schemas.build import MAX_FLOPS, MAX_TIME_S

TF32_SUFFIX = "-tf32"
DEFAULT_GPU = "rtx2080ti"
ANALYTIC_EFFICIENCY = 0.5
"""Share of peak FLOP/s a flat analytic profile assumes every layer reaches (no GPU name, or ``--efficiency``)."""
LOSS_FLOPS_PER_LOGIT = 8
"""The cross-entropy's work per logit, forward and backward, in a flat profile: log-softmax's max, subtraction,
exponential, sum and logarithm, and its gradient's softmax less the one-hot (a count of element-wise operations,
where the roofline times the kernels). A flat profile times its loss with it, so the profile says it takes one:
the cost model then counts the loss's memory (planner.costmodel.layers.loss_workspace), which it left out."""

DEVICE_FLOPS_NAMES: tuple[str, ...] = gpus.GPU_NAMES + tuple(
    name + TF32_SUFFIX for name in gpus.GPU_NAMES if "tf32" in gpus.GPUS[name].peak_flops)
"""GPU names ``--device-flops`` accepts: the catalog's, plus ``NAME-tf32`` where the GPU has TF32."""

GPU_PEAK_FLOPS: dict[str, float] = {
    name: gpus.peak_flops(name.removesuffix(TF32_SUFFIX), "tf32" if name.endswith(TF32_SUFFIX) else "fp32")
    for name in DEVICE_FLOPS_NAMES}
"""fp32 (or, for ``-tf32`` names, TF32) peak FLOP/s of every name ``--device-flops`` accepts."""


def gpu_format(name: str, dtype: str = "float32") -> tuple[str, str]:
    """(catalogued GPU, number format) that ``--device-flops NAME`` means for a ``dtype`` profile."""
    base = name.removesuffix(TF32_SUFFIX)
    number_format = gpus.number_format_of_dtype(dtype)
    if name.endswith(TF32_SUFFIX):
        if number_format != "fp32":
            raise UsageError(f"--device-flops {name} is the TF32 peak, for float32 profiles, not {dtype}",
                             f"use --device-flops {base}")
        number_format = "tf32"
    return base, number_format


def named_peak(name: str, dtype: str = "float32") -> float:
    """Peak FLOP/s of GPU ``name`` (``a100``, ``a100-tf32``, ...) for a profile computing in ``dtype``."""
    return gpus.peak_flops(*gpu_format(name, dtype))


def resolve_device_flops(value: str | float | None, default: str | None = DEFAULT_GPU,
                         dtype: str = "float32") -> tuple[float | None, str]:
    """``"a100"``, ``"13.4e12"`` or a number -> (FLOP/s, label); None -> the default GPU.

    A GPU name gives its peak in the number format of ``dtype`` (see the module docstring).
    """
    if value is None:
        if default is None:
            return None, ""
        return named_peak(default, dtype), default
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        text = str(value).strip().lower()
        if text in DEVICE_FLOPS_NAMES:
            return named_peak(text, dtype), text
        try:
            number = float(text)
        except ValueError:
            raise UsageError(f"--device-flops {value!r} is neither a number nor a known GPU",
                             f"use a FLOP/s figure such as 13.4e12 or one of {', '.join(DEVICE_FLOPS_NAMES)}"
                             ) from None
    if not 0 < number <= MAX_FLOPS:
        raise UsageError(f"--device-flops must be a FLOP/s figure above 0 and at most {MAX_FLOPS:.0e} (one "
                         f"device's peak, the most a profile holds), got {value!r}",
                         "e.g. 13.4e12 for an RTX 2080Ti, or a GPU name such as h100")
    return number, f"{number:g} FLOP/s"


def check_flat_rate(device_flops: float | None, efficiency: float | None) -> None:
    """A UsageError when a flat analytic time's FLOP/s (``device_flops`` x ``efficiency``, default
    :data:`ANALYTIC_EFFICIENCY`) would take longer than the longest time a profile holds for one FLOP."""
    if device_flops is None:
        return
    share = ANALYTIC_EFFICIENCY if efficiency is None else efficiency
    if device_flops * share * MAX_TIME_S < 1:
        raise UsageError(f"--device-flops {device_flops:g} x --efficiency {share:g} is {device_flops * share:.3g} "
                         f"FLOP/s: one FLOP would take longer than {MAX_TIME_S:.0e} s, the longest time a profile "
                         "holds", "give the device's real peak (e.g. 13.4e12) and a share of it such as 0.5")


def flat_loss_s(logits: int, device_flops: float, efficiency: float) -> float:
    """Seconds of the cross-entropy over ``logits`` values in a flat profile (:data:`LOSS_FLOPS_PER_LOGIT`)."""
    return analytic_time(LOSS_FLOPS_PER_LOGIT * logits, device_flops, efficiency)


def analytic_time(flops: float, device_flops: float, efficiency: float = ANALYTIC_EFFICIENCY) -> float:
    """Seconds to do ``flops`` on a device of ``device_flops`` peak at ``efficiency``."""
    return float(flops) / (device_flops * efficiency)

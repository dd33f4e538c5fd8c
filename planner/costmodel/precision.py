"""Bytes and FLOP/s by number format: what a precision costs per parameter and per activation.

Pure. Sources:

- Mixed precision (Micikevicius et al., ICLR'18; ZeRO, Rajbhandari et al. SC'20, section 3):
  16-bit (bf16/fp16) weights and gradients, 2 bytes each, plus ``K`` bytes of optimizer
  state per parameter in fp32: the fp32 master weight (4) and the optimizer's own state
  (Adam: momentum and variance, 8), so mixed-precision Adam keeps 2 + 2 + 12 = 16 bytes per
  parameter. fp32 training keeps 4 + 4 bytes plus the state (Adam: 16 in all as well; SGD 8).
- Activations are kept at the compute dtype: a profile measured in fp32 keeps 4-byte
  activations, a bf16 plan of it 2-byte ones (the profile's bytes times 2/4).
- Compute: a layer's profiled time is scaled by ``profile.device_flops / peak`` where
  ``peak`` is the GPU's peak in the plan's number format (``ir.GPU.flops_for``: tensor-core
  bf16/fp16 peaks where the cluster file gives them, else the fp32 ``flops``), and, where both
  peaks are catalogued GPUs' (``planner.gpus.training_share``), by the ratio of the shares of
  them training sustains: a profile of an A100 (GEMMs sustained at 0.70 of its peak) moved to an
  H100 (0.51, fitted on MosaicML's runs) runs 2.31x faster there, not the peaks' 3.17x, as the
  analytic profiler times the model on each GPU. The shares are the GEMMs'; memory-bound work,
  which scales with the GPUs' bandwidths instead, is scaled the same way (a profile's times do
  not say which part is which).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from planner import ir
from planner.errors import UsageError
from planner.gpus import number_format_of_dtype, peak_format, training_share

OPTIMIZER_BYTES_PER_PARAM = {"sgd": 0, "momentum": 4, "adam": 8, "rmsprop": 4}
"""Optimizer state in fp32 bytes per parameter beyond weight and gradient (Adam: m and v)."""

OPTIMIZER_TRAFFIC = {"sgd": (3, 0), "momentum": (3, 2), "adam": (3, 2), "rmsprop": (3, 2)}
"""Memory traffic of one optimizer step per parameter: (passes over the parameter's own
bytes, passes over its fp32 state bytes). Every update reads the weight and the gradient and
writes the weight (3); momentum/adam/rmsprop also read and write their state (2). E.g. fp32
adam: 3 * 4 + 2 * 8 = 28 bytes per parameter (ZeRO-Offload, Ren et al. ATC'21, section 4.1)."""



def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a profile's ``dtype`` (4 when unknown: profiles default to fp32)."""
    return ir.DTYPE_BYTES.get(ir.dtype_key(dtype), 4)


def default_precision(profile: ir.ModelProfile) -> str:
    """The precision a profile was made in: fp32, bf16 or fp16 (planner.gpus; fp32 for other dtypes)."""
    try:
        fmt = number_format_of_dtype(ir.dtype_key(profile.dtype))
    except UsageError:
        return "fp32"
    return fmt if fmt in ir.PRECISIONS else "fp32"


def check_precision(precision: str) -> str:
    if precision not in ir.PRECISIONS:
        raise UsageError(f"unknown precision {precision!r}", f"use one of {', '.join(ir.PRECISIONS)}")
    return precision


def check_optimizer(optimizer: str) -> str:
    if optimizer not in OPTIMIZER_BYTES_PER_PARAM:
        raise UsageError(f"unknown optimizer {optimizer!r}", f"use one of {', '.join(OPTIMIZER_BYTES_PER_PARAM)}")
    return optimizer


@dataclass(frozen=True)
class Bytes:
    """Per-parameter and per-activation bytes of one (profile, precision, optimizer).

    ``weight_scale`` multiplies a layer's profiled ``param_bytes`` into its weight bytes at
    the precision (1 when the precision is the profile's), ``grad`` likewise for gradients;
    ``state_per_param`` is the fp32 optimizer state (master weights included when mixed);
    ``activation_scale`` multiplies profiled activation bytes.
    """

    weight_scale: float
    state_per_param: float
    activation_scale: float
    traffic_own: int
    traffic_state: int

    @classmethod
    def of(cls, profile: ir.ModelProfile, precision: str, optimizer: str) -> Bytes:
        check_optimizer(optimizer)
        check_precision(precision)
        own = dtype_bytes(profile.dtype)
        width = 4 if precision == "fp32" else 2
        master = 0 if precision == "fp32" else 4
        traffic = OPTIMIZER_TRAFFIC[optimizer]
        return cls(width / own, float(OPTIMIZER_BYTES_PER_PARAM[optimizer] + master), width / own, *traffic)


def number_format(precision: str) -> str:
    """The GPU number format a precision computes in (its key in ``ir.GPU.peak_flops``)."""
    return check_precision(precision)


def share_ratio(profile_flops: float, peak_flops: float) -> float:
    """The share of its peak training sustains on the profile's GPU over that on a device of ``peak_flops``
    (module doc), where both are catalogued GPUs; else 1."""
    mine, theirs = training_share(profile_flops), training_share(peak_flops)
    return mine / theirs if mine is not None and theirs is not None else 1.0


def flop_scale(profile: ir.ModelProfile, peak_flops: float) -> float:
    """Factor from the profile's times to times on a device of ``peak_flops`` (module doc)."""
    return profile.device_flops / peak_flops * share_ratio(profile.device_flops, peak_flops)


def slowest_peak(profile: ir.ModelProfile, peaks: Iterable[float]) -> float:
    """Of a group's ``peaks``, the one the profile's times take longest on (the largest :func:`flop_scale`): a
    group waits for its slowest GPU, and beside sustained shares the lowest peak need not be it (an H100 and a
    GPU of 756 TFLOP/s no catalogued GPU has: at an A100 profile's share the other is the faster)."""
    return max(peaks, key=lambda peak: flop_scale(profile, peak))


def fixed_scale(profile: ir.ModelProfile, peak_flops: float) -> float:
    """Factor on the fixed part of a layer's time (:mod:`planner.costmodel.batch`): :func:`flop_scale` for a
    profile measured on a CPU, whose fixed part is work its cores do (a core share slows it), and 1 for a GPU's:
    host time launching kernels, which a faster GPU does not shorten (the analytic roofline's GPT-2 at 16 samples
    has 18.0, 20.1 and 20.1 ms of it on a V100, an A100 and an H100; moved by the peaks, a V100 profile searched
    on H100s was predicted 4.3x faster than the H100's own)."""
    return flop_scale(profile, peak_flops) if _on_cpu(profile) else 1.0


def _on_cpu(profile: ir.ModelProfile) -> bool:
    """Whether ``profile``'s times were taken on a CPU (its ``device``), not for a GPU."""
    return profile.device.lower().startswith("cpu")


MATCH_TOLERANCE = 1.5
"""How far (either way) a CPU profile's factor on a calibrated CPU cluster may be from the one a
profile of the model the cluster was matched to has before search warns (:attr:`Rescale.warning`)."""


@dataclass(frozen=True)
class Rescale:
    """A profile's times moved to a cluster's GPUs: the two peaks and the factor.

    ``matched_factor``: for a profile measured on a CPU and a cluster of CPU processes sharing
    cores (``planner calibrate``), the factor a profile of the model the cluster was matched to
    has (1 / the node's core share: the cluster's flops are the processes' speed when all compute
    at once); None elsewhere. Two models' measured FLOP/s on one CPU differ by up to 100x (a tiny
    MLP 0.5 GFLOP/s, a small Llama 40 here), so a factor far from it means the cluster was
    calibrated against another model's profile (or the matmul benchmark), and the times it scales
    are not this machine's.
    """

    profile_device: str
    profile_flops: float
    cluster: str
    cluster_flops: float
    number_format: str
    matched_factor: float | None = None
    profile_format: str | None = None
    """The number format the profile's times are in (:func:`profile_format`); None: unknown."""

    @property
    def shares(self) -> float:
        """The two GPUs' sustained shares, the profile's over the cluster's (:func:`share_ratio`; 1 unless both
        are catalogued)."""
        return share_ratio(self.profile_flops, self.cluster_flops)

    @property
    def factor(self) -> float:
        """Multiplier on the profile's times (> 1: the cluster's GPUs are slower): :func:`flop_scale`'s."""
        return self.profile_flops / self.cluster_flops * self.shares

    @property
    def warning(self) -> str | None:
        """Why the factor is suspect, with what to do; None when it is not (class doc, :attr:`format_warning`)."""
        if self.matched_factor is None:
            return self.format_warning
        off = self.factor / self.matched_factor
        if 1 / MATCH_TOLERANCE <= off <= MATCH_TOLERANCE:
            return None
        return (f"this CPU profile's times are scaled x{self.factor:.4g} onto {self.cluster!r}, {off:.3g} times "
                f"the x{self.matched_factor:.4g} of a profile of the model its speed was measured on: its FLOP/s "
                "come from another model (or the matmul benchmark), and the prediction is not this machine's; "
                "run planner calibrate --match-profile with this profile")

    @property
    def format_warning(self) -> str | None:
        """When the profile's times are in another number format than the plan computes in: the factor is the
        peaks', memory-bound work included, which moves with the bytes instead (an fp32 profile searched at bf16 is
        predicted about 20% fast); None when the formats agree or one is unknown."""
        if self.profile_format is None or _KIND.get(self.profile_format) == _KIND.get(self.number_format):
            return None
        return (f"the profile's times are {self.profile_format} and the plan computes in {self.number_format}: "
                f"scaled x{self.factor:.4g} by the GPUs' rates, memory-bound work included, which moves with the bytes "
                f"and not the peak, so the prediction is off by the share of that work; profile the model again "
                f"for the cluster's GPU {_PROFILE_AGAIN.get(self.number_format, 'in the plan precision')}")

    @property
    def text(self) -> str:
        return (f"profile times for {self.profile_device} ({self.profile_flops / 1e12:.4g} TFLOP/s) rescaled to "
                f"{self.cluster}'s slowest GPU ({self.cluster_flops / 1e12:.4g} TFLOP/s {self.number_format}): "
                f"x{self.factor:.4g}" + ("" if self.shares == 1.0 else
                                         f" (the peaks' ratio x{self.shares:.3g}, the GPUs' sustained shares)"))

    def to_dict(self) -> dict[str, object]:
        return {"profile_device": self.profile_device, "profile_flops": self.profile_flops, "cluster": self.cluster,
                "cluster_flops": self.cluster_flops, "number_format": self.number_format, "factor": self.factor,
                "shares": self.shares,
                "warning": self.warning}


_KIND = {"fp32": "fp32", "tf32": "tf32", "bf16": "16-bit", "fp16": "16-bit"}
"""Number formats whose times move alike between GPUs: bf16 and fp16 have the same bytes and tensor-core peaks."""

_PROFILE_AGAIN = {"bf16": "with --dtype bfloat16", "fp16": "with --dtype float16",
                  "fp32": "with --dtype float32 and the GPU's fp32 peak (--device-flops NAME, not NAME-tf32)"}
"""How to profile a model in each number format a plan computes in (the format warning's fix)."""


def profile_format(profile: ir.ModelProfile) -> str:
    """The number format a profile's times are in: the catalogued format of its peak (``tf32`` for a profile at the
    A100's TF32 peak), else its dtype's (:func:`default_precision`)."""
    return peak_format(profile.device_flops) or default_precision(profile)


def rescale_note(profile: ir.ModelProfile, cluster: ir.Cluster, precision: str) -> Rescale | None:
    """The rescaling a search of ``profile`` on ``cluster`` applies, when the peaks differ by over 1%."""
    fmt = number_format(precision)
    peak = slowest_peak(profile, {g.flops_for(fmt) for g in cluster.gpus})
    gpu = next(g for g in cluster.gpus if g.flops_for(fmt) == peak)
    if abs(profile.device_flops / peak - 1.0) <= 0.01:
        return None
    used = fmt if fmt in dict(gpu.peak_flops) else "fp32"  # a GPU without the format's peak computes in fp32
    return Rescale(profile.device, profile.device_flops, cluster.name, peak, used, _matched_factor(profile, cluster),
                   profile_format(profile))


def _matched_factor(profile: ir.ModelProfile, cluster: ir.Cluster) -> float | None:
    """:attr:`Rescale.matched_factor`: 1 / the least core share, for a CPU profile on a cluster whose
    every node shares its cores among CPU processes; else None."""
    shared = all(node.shares_cores for node in cluster.nodes)
    if not _on_cpu(profile) or not shared or not cluster.nodes:
        return None
    return 1.0 / min(node.core_share for node in cluster.nodes)

"""A catalog of named GPUs: dense peak FLOP/s per number format, memory, memory bandwidth, and
what the analytic roofline needs (SMs, achievable GEMM share of peak, kernel launch cost).

Pure (no torch). Each entry is a vendor data-sheet figure, dense (no structured sparsity):

- RTX 2080Ti: fp32 13.4 TFLOP/s, the PipePar paper's figure (boost clock); fp16 tensor cores
  53.8 TFLOP/s with fp32 accumulate (NVIDIA Turing GPU architecture whitepaper, GeForce RTX
  2080 Ti Founders Edition); no tf32 or bf16 (Turing has neither); 11 GiB GDDR6 at 616 GB/s.
- V100 SXM2: fp32 15.7, fp16 tensor 125 TFLOP/s; no tf32 or bf16 (Volta); 16 or 32 GiB HBM2
  at 900 GB/s (NVIDIA Tesla V100 data sheet).
- A100 SXM: fp32 19.5, tf32 156, bf16 and fp16 312 TFLOP/s; 40 GiB at 1.555 TB/s or 80 GiB
  at 2.039 TB/s (NVIDIA A100 Tensor Core GPU data sheet).
- H100 SXM: fp32 67, tf32 494.7, bf16 and fp16 989.4 TFLOP/s; 80 GB HBM3 at 3.35 TB/s
  (NVIDIA H100 Tensor Core GPU data sheet; half the sparsity figures); catalogued as the 81559 MiB the
  card reports (``nvidia-smi``, "NVIDIA H100 80GB HBM3"), 79.6 GiB, not 80: a plan the search fills to
  the last GiB must fit the card. The A100 80GB reports 81920 MiB, its 80 GiB.
- H200 SXM: the H100's die (the same peaks, 132 SMs) with 141 GB HBM3e at 4.8 TB/s (NVIDIA H200
  data sheet); catalogued as 140 GiB, the 143771 MiB the card reports. It takes the H100's GEMM
  and attention shares; ``scripts/gpu_checks.py`` measures the product rate on one.

A format a GPU has no fast path for (bf16 on Turing and Volta) is absent from its
``peak_flops``; asking for it is an error rather than a silent fp32 figure.

For the analytic roofline (``planner.profiler.roofline``):

- ``sm_count``: streaming multiprocessors (NVIDIA architecture whitepapers: Turing TU102 in the
  2080 Ti 68, Volta GV100 in the V100 80, Ampere GA100 in the A100 108, Hopper GH100 in the
  H100 SXM5 132).
- ``gemm_share``: the share of the dense peak that a large, well-shaped matrix multiply reaches,
  per number format. Measured figures: Bekman's Maximum Achievable Matmul FLOPS (MAMF) table
  (stas00/ml-engineering, compute/accelerator/README.md, ``mamf-finder.py``, bf16 ``torch.matmul``
  over a sweep of shapes, CUDA 12.1): A100 SXM 267.9 of 312 TFLOP/s (85.9%), H100 SXM 792.1 of
  989 (80.1%). fp16 runs on the same tensor cores at the same peak, so it takes the bf16 share.
  Where no measurement is published there (every fp32 and tf32 figure, the V100 and the 2080 Ti)
  the share is :data:`DEFAULT_GEMM_SHARE`, 0.80, the low end of that table's NVIDIA range
  (80.1-85.9%): an assumption, not a measurement.
- ``attention_share``: the share of the dense peak fused attention (PyTorch's SDPA flash backend,
  FlashAttention-2) reaches, forward and backward. A100: 50-73% (Dao, "FlashAttention-2", 2023,
  abstract), taken at the middle, 61.5%; H100: 35% (Shah et al., "FlashAttention-3", 2024, abstract:
  FlashAttention-2 "achieving only 35% utilization on the H100"). Elsewhere the GEMM share.
- ``sustained`` (:data:`SUSTAINED`, an argument of :func:`roofline_of`): the share of those
  benchmark figures a training run sustains, for GEMMs and fused attention alike. The figures
  above are best cases of one kernel on one GPU; published training runs are slower. Fitted,
  not measured: with Megatron-LM's kernels timed by this roofline (scripts/megatron_roofline.py),
  the A100 bf16 GEMM share that predicts SC'21's six smallest published runs (Narayanan et al.,
  Table 1) with a median predicted/published throughput of 1 is 0.697 of the peak, 0.81 of the
  MAMF figure (``python scripts/bench_published.py --fit``); their four largest runs and
  BLOOM-176B, held out, are then predicted within 0.95-1.11. The H100 sustains less of its best case:
  MosaicML's llm-foundry ran the same MPT models, code and settings on both GPUs at 55-64% of the A100's
  peak and 38-46% of the H100's (scripts/published_mpt.py), so at the A100's share every H100 row was
  predicted 1.08-1.44x too fast. :data:`SUSTAINED_H100`, 0.632 of the MAMF figure (0.51 of the peak), is
  fitted on its four 8-GPU rows at 2048 tokens (``python scripts/published_mpt.py --fit``); its nine other
  H100 rows, held out, are then 0.84-1.14, and torchtitan's H100 runs (published_h100_fsdp.py) lie between
  full and no recomputation at the SXM peak. The H200 (the H100's die and power) takes the H100's share, an
  assumption; every other GPU and number format takes :data:`SUSTAINED` (no other fit is published).
  ``sustained=1`` gives the best cases.
- ``launch_s``: :data:`LAUNCH_S`, 4 microseconds per kernel: PyTorch's eager dispatch plus the CUDA
  launch, of the order of the few microseconds per launch NVIDIA reports ("Getting Started with
  CUDA Graphs", NVIDIA technical blog, 2019); the same for every GPU, since the host pays most of it.
- ``host_s``: :data:`HOST_S`, 35 microseconds per kernel: what the host spends, in Python modules,
  autograd and dispatch, per kernel of a layer run eagerly, so that a layer of many small kernels
  is host-bound (its time is its kernels times ``host_s``, not their sum on the GPU). Measured on an
  H200 machine's host with PyTorch 2.11 (``scripts/gpu_checks.py``, docs/fidelity.md): a 2-block
  Llama at 16 tokens, whose GPU work is nil, took 40 microseconds per kernel of its blocks and 49 of
  its head, forward and backward; a loop of bare in-place adds 8.3 (``scripts/gpu_rates.py``). A host
  property more than a GPU one: the same for every GPU.
- ``unaligned_share``: :data:`UNALIGNED_GEMM_SHARE`, 0.17: a bf16, fp16 or tf32 matrix product
  with M, K or N not a multiple of 16 bytes (8 elements of bf16) misses the tensor cores' fast
  kernels (NVIDIA's Matrix Multiplication Background guide, section 4.1, "Tensor Core
  Requirements"). Measured on an H200 (``scripts/gpu_rates.py``): GPT-2's output layer, 8192 x
  768 x 50257, ran its forward and both backward products at 118-148 TFLOP/s against 711-816 with
  the vocabulary padded to 50304 (0.15-0.18), and an 8191-cubed product at 150 against 801 for
  8192 (0.19); 0.17 is their median. A multiple of 8 not of 64 (50264) kept 0.84-0.95.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import MappingProxyType

from planner import ir
from planner.errors import UsageError

GIB = 1 << 30
NUMBER_FORMATS: tuple[str, ...] = ir.NUMBER_FORMATS
"""fp32, tf32, bf16, fp16: the number formats a peak is given for."""

DEFAULT_GEMM_SHARE = 0.80
"""Large-GEMM share of peak where no measurement is catalogued (module docstring)."""
LAUNCH_S = 4e-6
"""Seconds per kernel launch (module docstring)."""
SUSTAINED = 0.81
"""Share of the best-case GEMM and attention figures a training run sustains (module docstring: fitted by
``scripts/bench_published.py --fit``), on every GPU but the H100 and H200."""
SUSTAINED_H100 = 0.632
"""The same share on the H100 and H200 (module docstring: fitted by ``scripts/published_mpt.py --fit`` on MPT's H100
runs, 0.6321)."""


@dataclass(frozen=True)
class GPUSpec:
    """One GPU model: dense peak FLOP/s per number format, memory and its bandwidth."""

    name: str
    description: str
    peak_flops: MappingProxyType[str, float]
    """Number format (``fp32``, ``tf32``, ``bf16``, ``fp16``) -> dense peak FLOP/s."""
    memory_bytes: int
    memory_bandwidth_Bps: float
    sm_count: int
    gemm_share: MappingProxyType[str, float]
    """Number format -> share of the dense peak a large GEMM reaches (module docstring: sources)."""
    attention_share: MappingProxyType[str, float]
    """Number format -> share of the dense peak fused attention reaches (module docstring: sources)."""
    launch_s: float = LAUNCH_S
    """Seconds a kernel launch costs on top of its run time (module docstring)."""
    sustained: float = SUSTAINED
    """Share of its best-case GEMM and attention figures a training run sustains (module docstring:
    :data:`SUSTAINED`, :data:`SUSTAINED_H100`)."""

    def peak(self, number_format: str) -> float:
        """Peak FLOP/s in ``number_format``; a UsageError when the GPU has no fast path for it."""
        if number_format not in NUMBER_FORMATS:
            raise UsageError(f"unknown number format {number_format!r}", f"use one of {', '.join(NUMBER_FORMATS)}")
        if number_format not in self.peak_flops:
            raise UsageError(f"{self.name} has no {number_format} peak (it computes in "
                             f"{', '.join(self.peak_flops)})", "choose another --dtype or another GPU")
        return self.peak_flops[number_format]

    def to_gpu(self, device_name: str) -> ir.GPU:
        """This GPU as a cluster device called ``device_name`` (``flops`` is the fp32 peak)."""
        return ir.GPU(device_name, self.peak_flops["fp32"], self.memory_bytes, self.memory_bandwidth_Bps,
                      tuple((f, self.peak_flops[f]) for f in NUMBER_FORMATS if f in self.peak_flops))


    def large_gemm_share(self, number_format: str) -> float:
        """Share of the ``number_format`` peak a large GEMM reaches (:data:`DEFAULT_GEMM_SHARE` if unmeasured)."""
        self.peak(number_format)  # the format must exist on this GPU
        return self.gemm_share.get(number_format, DEFAULT_GEMM_SHARE)

    def fused_attention_share(self, number_format: str) -> float:
        """Share of the ``number_format`` peak fused attention reaches (the GEMM share if unpublished)."""
        return self.attention_share.get(number_format, self.large_gemm_share(number_format))


HOST_S = 35e-6
"""Host seconds per kernel of a layer run eagerly (module docstring): a layer's forward or backward takes at least
its kernels times this, however fast the GPU."""
UNALIGNED_GEMM_SHARE = 0.17
"""Share of its aligned rate a tensor-core matrix product keeps when a size is not a multiple of 16 bytes (module
docstring)."""
TENSOR_CORE_FORMATS = frozenset({"bf16", "fp16", "tf32"})
"""The number formats whose matrix products run on tensor cores (and so want 16-byte sizes)."""
MAMF_A100_SXM = 267.9 / 312.0
"""Bekman's MAMF table: A100 SXM bf16 matmul, 267.9 of 312 TFLOP/s."""
MAMF_H100_SXM = 792.1 / 989.0
"""Bekman's MAMF table: H100 SXM bf16 matmul, 792.1 of 989 TFLOP/s."""
FA2_A100 = (0.50 + 0.73) / 2
"""FlashAttention-2 on the A100: 50-73% of peak (Dao 2023), the middle of the range."""
FA2_H100 = 0.35
"""FlashAttention-2 on the H100: 35% of peak (Shah et al. 2024, FlashAttention-3)."""


def _tensor_shares(peaks: dict[str, float], share: float | None) -> MappingProxyType[str, float]:
    """``share`` for the tensor-core half-precision formats the GPU has (none if ``share`` is None)."""
    formats: list[str] = [] if share is None else [f for f in ("bf16", "fp16") if f in peaks]
    return MappingProxyType({f: float(share or 0.0) for f in formats})


def _spec(name: str, description: str, memory_gib: float, bandwidth_Bps: float, sm_count: int,
          shares: tuple[float, float] | None = None, sustained: float = SUSTAINED, **peaks_tflops: float) -> GPUSpec:
    """A catalogue entry; ``shares``: the published bf16/fp16 (large-GEMM, fused-attention) shares of peak;
    ``sustained``: the share of them training sustains."""
    peaks = {fmt: tflops * 1e12 for fmt, tflops in peaks_tflops.items()}
    gemm, attention = shares if shares is not None else (None, None)
    return GPUSpec(name, description, MappingProxyType(peaks), int(memory_gib * GIB), bandwidth_Bps, sm_count,
                   _tensor_shares(peaks, gemm), _tensor_shares(peaks, attention), LAUNCH_S, sustained)


_CATALOG: tuple[GPUSpec, ...] = (
    _spec("rtx2080ti", "NVIDIA GeForce RTX 2080 Ti (Turing), 11 GiB", 11, 616e9, 68, fp32=13.4, fp16=53.8),
    _spec("v100", "NVIDIA V100 SXM2 16GB", 16, 900e9, 80, fp32=15.7, fp16=125.0),
    _spec("v100-32gb", "NVIDIA V100 SXM2 32GB", 32, 900e9, 80, fp32=15.7, fp16=125.0),
    _spec("a100-40gb", "NVIDIA A100 SXM 40GB", 40, 1.555e12, 108, (MAMF_A100_SXM, FA2_A100),
          fp32=19.5, tf32=156.0, bf16=312.0, fp16=312.0),
    _spec("a100", "NVIDIA A100 SXM 80GB", 80, 2.039e12, 108, (MAMF_A100_SXM, FA2_A100),
          fp32=19.5, tf32=156.0, bf16=312.0, fp16=312.0),
    _spec("h100", "NVIDIA H100 SXM 80GB", 81559 / 1024, 3.35e12, 132, (MAMF_H100_SXM, FA2_H100), SUSTAINED_H100,
          fp32=67.0, tf32=494.7, bf16=989.4, fp16=989.4),
    _spec("h200", "NVIDIA H200 SXM 141GB", 140, 4.8e12, 132, (MAMF_H100_SXM, FA2_H100), SUSTAINED_H100,
          fp32=67.0, tf32=494.7, bf16=989.4, fp16=989.4),
)
GPUS: MappingProxyType[str, GPUSpec] = MappingProxyType({g.name: g for g in _CATALOG})
GPU_NAMES: tuple[str, ...] = tuple(GPUS)
"""Every catalogued GPU name."""

_DTYPE_FORMATS = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def gpu_spec(name: str) -> GPUSpec:
    """The catalogued GPU ``name`` (case-insensitive); a UsageError listing the names otherwise."""
    key = name.strip().lower()
    if key not in GPUS:
        raise UsageError(f"unknown GPU {name!r}", f"use one of {', '.join(GPU_NAMES)}")
    return GPUS[key]


def peak_flops(name: str, number_format: str) -> float:
    """Dense peak FLOP/s of GPU ``name`` in ``number_format`` (fp32, tf32, bf16, fp16)."""
    return gpu_spec(name).peak(number_format)


PEAK_MATCH = 1e-3
"""Relative tolerance within which a FLOP/s figure is a catalogued GPU's peak (:func:`training_share`)."""


def _at_peak(peak_flops: float) -> list[tuple[GPUSpec, str]]:
    """(GPU, number format) of every catalogued peak within :data:`PEAK_MATCH` of ``peak_flops``."""
    return [(spec, fmt) for spec in _CATALOG for fmt, peak in spec.peak_flops.items()
            if abs(peak - peak_flops) <= PEAK_MATCH * peak]


def peak_format(peak_flops: float) -> str | None:
    """The number format whose peak ``peak_flops`` is on the catalogued GPUs that have it (``tf32`` for the A100's
    156 TFLOP/s), or None where none or several formats do."""
    formats = {fmt for _, fmt in _at_peak(peak_flops)}
    return formats.pop() if len(formats) == 1 else None


@functools.lru_cache(maxsize=256)
def training_share(peak_flops: float) -> float | None:
    """The share of ``peak_flops`` a training run's GEMMs sustain on the catalogued GPU whose peak in some number
    format it is (within :data:`PEAK_MATCH`): its large-GEMM share times its ``sustained`` (the analytic
    profiler's roofline, :func:`roofline_of`). None where no catalogued GPU has that peak, or GPUs that do differ
    in it (a measured CPU's rate, a cluster file's own figure): a time moved between two such peaks then scales by
    the peaks alone. The H100 and H200, or the A100's two memories, share their figures."""
    shares = {round(spec.large_gemm_share(fmt) * spec.sustained, 12) for spec, fmt in _at_peak(peak_flops)}
    return shares.pop() if len(shares) == 1 else None


def number_format_of_dtype(dtype: str) -> str:
    """The number format a profile's dtype computes in: float32 -> fp32, bfloat16 -> bf16, float16 -> fp16."""
    key = dtype.removeprefix("torch.")
    if key not in _DTYPE_FORMATS:
        raise UsageError(f"no number format for dtype {dtype!r}", f"use one of {', '.join(_DTYPE_FORMATS)}")
    return _DTYPE_FORMATS[key]


TILE_ELEMENTS = 128 * 128
"""Output elements of one GEMM tile (NVIDIA's Matrix Multiplication Background guide, section 2.3)."""


@dataclass(frozen=True)
class Roofline:
    """One GPU in one number format, as the roofline sees it: a kernel's time from its FLOPs, bytes
    and size in tiles (the law and its sources: ``planner.profiler.roofline``, which applies it to
    every kernel a layer runs)."""

    peak_flops: float
    gemm_share: float
    sm_count: int
    bandwidth_Bps: float
    launch_s: float
    attention_share: float | None = None
    """Large fused-attention share of peak (None: ``gemm_share``)."""
    unaligned_share: float = 1.0
    """Share of its rate a matrix product keeps with a size not a multiple of 16 bytes (:data:`UNALIGNED_GEMM_SHARE`
    for tensor-core formats, 1 elsewhere)."""
    host_s: float = 0.0
    """Host seconds per kernel (:data:`HOST_S`): a layer's walk takes at least its kernels times this."""

    def efficiency(self, tiles: float, attention: bool = False) -> float:
        """Share of peak a GEMM-like (or fused attention) kernel over ``tiles`` 128 x 128 tiles reaches
        (module docstring); at least one element's worth of a tile."""
        tiles = max(tiles, 1 / TILE_ELEMENTS)
        share = self.attention_share if attention and self.attention_share is not None else self.gemm_share
        return share * tiles / (tiles + self.sm_count / 2)

    def kernel(self, flops: float, bytes_moved: float, tiles: float, attention: bool = False,
               aligned: bool = True) -> tuple[float, bool]:
        """(seconds, memory-bound?) of one kernel: ``max(compute, memory) + launch_s``; a matrix product with a
        size off the 16-byte grid (``aligned`` False) computes at ``unaligned_share`` of the rate."""
        memory_s = bytes_moved / self.bandwidth_Bps
        rate = self.peak_flops * self.efficiency(tiles, attention) * (1.0 if aligned else self.unaligned_share)
        compute_s = flops / rate if flops > 0 else 0.0
        return max(compute_s, memory_s) + self.launch_s, memory_s >= compute_s


def roofline_of(gpu: str, number_format: str, sustained: float | None = None) -> Roofline:
    """The roofline of catalogued GPU ``gpu`` computing in ``number_format`` (fp32, tf32, bf16, fp16), its
    GEMM and attention shares at ``sustained`` of their best cases (None: the GPU's own, ``GPUSpec.sustained``)."""
    spec = gpu_spec(gpu)
    sustained = spec.sustained if sustained is None else sustained
    unaligned = UNALIGNED_GEMM_SHARE if number_format in TENSOR_CORE_FORMATS else 1.0
    return Roofline(spec.peak(number_format), spec.large_gemm_share(number_format) * sustained, spec.sm_count,
                    spec.memory_bandwidth_Bps, spec.launch_s, spec.fused_attention_share(number_format) * sustained,
                    unaligned, HOST_S)

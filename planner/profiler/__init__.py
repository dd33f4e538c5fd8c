"""The profiler: the only part of planner (with export and the runner) that imports torch.

- ``zoo``: built-in models (``ZOO_NAMES``; transformers in ``hfzoo``); ``loader.load_model``: a
  zoo name or ``package.module:factory`` -> LoadedModel.
- ``layers.split_model``: cut points where one tensor crosses -> runnable layers (``fxsplit`` for
  models torch.fx traces, ``hfsplit`` for GPT-2/BERT/Llama by structure, ``verify`` checks those).
- ``profile_model``: per-layer times (measured or analytic), FLOPs, parameters and bytes
  -> ``planner.ir.ModelProfile`` (``measure``: the passes; ``repeats``: identical blocks counted
  once on the meta device). ``analytic``: times from FLOPs and a named GPU's peak (``planner.gpus``).
"""

from __future__ import annotations

from planner.profiler.analytic import ANALYTIC_EFFICIENCY, GPU_PEAK_FLOPS, resolve_device_flops
from planner.profiler.core import DEFAULT_REPEATS, DEFAULT_WARMUP, Progress, profile_model
from planner.profiler.layers import LayeredModel, primary_output, split_model
from planner.profiler.loader import LoadedModel, load_model
from planner.profiler.zoo import ZOO_NAMES

__all__ = [
    "ANALYTIC_EFFICIENCY",
    "DEFAULT_REPEATS",
    "DEFAULT_WARMUP",
    "GPU_PEAK_FLOPS",
    "ZOO_NAMES",
    "LayeredModel",
    "LoadedModel",
    "Progress",
    "load_model",
    "primary_output",
    "profile_model",
    "resolve_device_flops",
    "split_model",
]

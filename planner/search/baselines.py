"""The baselines ``planner compare`` sets against the planner: what a user would otherwise run.

Pure (no torch, click or rich). Two parts here:

* Partitioners, reimplemented from each system's own algorithm and tested against it
  (re-exported here): DeepSpeed's and torchgpipe's (:mod:`planner.search.partitioners`) and
  PipeDream's (:mod:`planner.search.pipedream`).
* Layouts: each baseline's answer as stages on the same cluster (:class:`~planner.search.layout.Layout`,
  turned into an :class:`~planner.ir.Plan` by its ``plan``), so that the same cost model and
  simulator judge every strategy; Megatron-LM's in :mod:`planner.search.megatron` (re-exported here).
* The settings that run them: :mod:`planner.search.settings`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import accumulate

from planner import ir
from planner.search.layout import Layout, NotFitting, divisors
from planner.search.megatron import megatron_layouts, megatron_tp, megatron_tps
from planner.search.partitioners import (
    balance_by_size,
    balance_by_time,
    block_partition,
    deepspeed_layer_weights,
    deepspeed_parts,
    deepspeed_type_weights,
    partition_balanced,
    partition_balanced_fast,
    partition_uniform,
)
from planner.search.pipedream import (
    PIPEDREAM_FLAGS,
    PIPEDREAM_MODES,
    PipeDreamFlags,
    PipeDreamStage,
    pipedream_partition,
)

__all__ = ["BASELINE_SCHEDULES", "PIPEDREAM_FLAGS", "PIPEDREAM_MODES", "STRATEGIES", "Layout", "NotFitting",
           "PipeDreamFlags", "PipeDreamStage", "accpar_layout", "balance_by_size", "balance_by_time",
           "block_partition", "deepspeed_layer_weights", "deepspeed_layouts", "deepspeed_methods", "deepspeed_parts",
           "deepspeed_type_weights", "divisors", "dp_layout", "gpipe_uniform_layout", "megatron_layouts",
           "megatron_tp", "megatron_tps", "partition_balanced", "partition_balanced_fast", "partition_uniform",
           "pipedream_layout", "pipedream_partition", "torchgpipe_layout",
           "torchgpipe_param_scale"]


# ----------------------------------------------------------------------------- baselines as plans

STRATEGIES = ("dp", "accpar", "gpipe-uniform", "torchgpipe", "deepspeed", "deepspeed-parameters", "deepspeed-uniform",
              "pipedream", "megatron", "planner")
"""Every strategy ``planner compare`` runs, in the order it shows them (contract names, ../shared/DESIGN.md
section 4): ``deepspeed`` at the best of its settings, ``deepspeed-parameters`` and ``deepspeed-uniform`` at
one ``partition_method`` each (its default, and uniform layer counts), each with and without ZeRO-1."""

BASELINE_SCHEDULES = {"gpipe-uniform": ("gpipe",), "torchgpipe": ("gpipe",), "deepspeed": ("1f1b",),
                      "deepspeed-parameters": ("1f1b",), "deepspeed-uniform": ("1f1b",), "pipedream": ("1f1b",),
                      "megatron": ("1f1b",)}
"""The pipeline schedules each system runs, each a setting: GPipe and torchgpipe fill then drain
(F-then-B); DeepSpeed's ``TrainSchedule`` is 1F1B; PipeDream with a flush (``1f1b``,
PipeDream-Flush, Narayanan et al. ICML'21). PipeDream's own asynchronous runtime (weight
stashing, no flush; SOSP'19) trains with stale weights -- another optimisation than the
synchronous plans it is compared with -- so it is not one of its settings here; ``planner
simulate --schedule pipedream`` judges such a plan. ``dp`` and ``accpar`` have no pipeline (one
stage, one micro-batch); ``planner`` runs the schedule the user asks for."""


def _dp_forms(first: int, end: int) -> tuple[str, ...]:
    return ("dp",) * (end - first)


def _stages_from_parts(parts: Sequence[int], groups: Sequence[tuple[str, ...]]) -> tuple:
    return tuple(((parts[s], parts[s + 1]), groups[s], _dp_forms(parts[s], parts[s + 1]))
                 for s in range(len(groups)))


def _one_gpu_per_stage(name: str, profile: ir.ModelProfile, cluster: ir.Cluster,
                       balance_of: Callable[[int], list[int]],
                       microbatches: tuple[int, ...]) -> Layout | NotFitting:
    """One stage per GPU in cluster order; ``balance_of(k)`` gives the k stages' layer counts."""
    n, k = len(profile.layers), len(cluster.gpus)
    if k > n:
        return NotFitting(name, f"{k} stages (one per GPU) but the model has only {n} layers")
    balance = balance_of(k)
    if min(balance) < 1:
        return NotFitting(name, f"the balance {balance} has an empty partition, which GPipe refuses")
    parts = list(accumulate(balance, initial=0))
    groups = [(g.name,) for g in cluster.gpus]
    return Layout(name, _stages_from_parts(parts, groups), BASELINE_SCHEDULES[name][0], microbatches)


def dp_layout(profile: ir.ModelProfile, cluster: ir.Cluster) -> Layout:
    """``dp``: every layer data parallel over every GPU, one stage, no micro-batching."""
    n = len(profile.layers)
    devices = tuple(g.name for g in cluster.gpus)
    return Layout("dp", (((0, n), devices, _dp_forms(0, n)),), "1f1b", (1,))


def accpar_layout(profile: ir.ModelProfile, cluster: ir.Cluster, optimizer: str) -> Layout:
    """``accpar``: AccPar's per-layer forms over every GPU, no pipeline (one stage, M = 1).

    AccPar (Song et al., HPCA'20) picks, layer by layer, between batch (data) parallel and
    the two weight partitions with a chain search over the layer sequence; that is the
    HPP chain DP (:func:`planner.search.hpp.hpp`) on the group of every GPU, so a split
    form spans every GPU (``tp`` = the GPU count when any layer is split).
    """
    from planner.cluster import group_of
    from planner.costmodel import layer_table
    from planner.search.hpp import hpp

    n = len(profile.layers)
    devices = tuple(g.name for g in cluster.gpus)
    table = layer_table(profile, group_of(cluster, devices), 1, optimizer)
    forms, _ = hpp(table, 0, n, 1)
    tp = len(devices) if any(f != "dp" for f in forms) else 1
    return Layout("accpar", (((0, n), devices, tuple(forms)),), "1f1b", (1,), tp)


def gpipe_uniform_layout(profile: ir.ModelProfile, cluster: ir.Cluster,
                         microbatches: tuple[int, ...]) -> Layout | NotFitting:
    """``gpipe-uniform``: one GPU per stage, equal layer counts (the first stages take the rest)."""
    def balance_of(k: int) -> list[int]:
        parts = partition_uniform(len(profile.layers), k)
        return [parts[s + 1] - parts[s] for s in range(k)]
    return _one_gpu_per_stage("gpipe-uniform", profile, cluster, balance_of, microbatches)


def torchgpipe_layout(profile: ir.ModelProfile, cluster: ir.Cluster, microbatches: tuple[int, ...],
                      param_scale: float | None = None) -> Layout | NotFitting:
    """``torchgpipe``: one GPU per stage, split by ``balance_by_time`` on the forward + backward times, or,
    given ``param_scale``, by ``balance_by_size`` for ``chunks`` = the one micro-batch count given."""
    if param_scale is None:
        return _one_gpu_per_stage("torchgpipe", profile, cluster, lambda k: balance_by_time(profile, k),
                                  microbatches)
    (chunks,) = microbatches
    return _one_gpu_per_stage("torchgpipe", profile, cluster,
                              lambda k: balance_by_size(profile, k, chunks, param_scale), microbatches)


def torchgpipe_param_scale(optimizer: str) -> float:
    """``balance_by_size``'s ``param_scale``: copies of the parameters training allocates (torchgpipe's
    guide: the weight and its gradient, 2 for SGD, plus the optimizer's state: 3 with momentum or
    RMSProp, 4 for Adam)."""
    from planner.costmodel.precision import OPTIMIZER_BYTES_PER_PARAM

    return 2 + OPTIMIZER_BYTES_PER_PARAM[optimizer] / 4


def deepspeed_layouts(profile: ir.ModelProfile, cluster: ir.Cluster, method: str,
                      microbatches: tuple[int, ...]) -> list[Layout] | NotFitting:
    """``deepspeed`` with ``partition_method=method``: a pipeline x data-parallel grid, every stage
    the same width.

    DeepSpeed's ``PipeDataParallelTopology`` puts the data axis innermost, so stage s holds
    ranks [s*D, (s+1)*D): consecutive GPUs. Every pipeline depth K that divides the GPU
    count (and is at most the layer count) is a layout; the judge keeps the fastest, as a
    user tuning ``num_stages`` would.
    """
    gpus = [g.name for g in cluster.gpus]
    n, total = len(profile.layers), len(gpus)
    layouts = []
    for k in divisors(total):
        if k > n:
            break
        width = total // k
        groups = [tuple(gpus[s * width:(s + 1) * width]) for s in range(k)]
        parts = deepspeed_parts(profile, k, method)
        layouts.append(Layout("deepspeed", _stages_from_parts(parts, groups), "1f1b", microbatches))
    return layouts or NotFitting("deepspeed", "no pipeline depth divides the GPU count")


def deepspeed_methods(profile: ir.ModelProfile) -> tuple[str, ...]:
    """DeepSpeed's ``partition_method`` values worth trying on ``profile``: ``parameters`` (its
    default), ``uniform``, and ``type:<T>`` for each layer type T of the model (the regex a user
    would write for the repeated block, e.g. ``type:transformer`` in Megatron-DeepSpeed)."""
    types = dict.fromkeys(layer.type for layer in profile.layers)
    return ("parameters", "uniform", *(f"type:{t}" for t in types))


def pipedream_layout(profile: ir.ModelProfile, cluster: ir.Cluster, microbatches: tuple[int, ...],
                     activation_compression_ratio: float | None = None, flags: PipeDreamFlags | None = None,
                     schedule: str = "1f1b") -> Layout | NotFitting:
    """``pipedream``: PipeDream's hierarchical partitioner, data-parallel replicas per stage.

    Its two levels are the GPUs of a server (``intra_node`` bandwidth) and the servers
    (``inter_node``); servers of different sizes break PipeDream's assumption, and then it
    runs one level over every GPU on the slower link. Layer times are the profile's
    forward+backward on the cluster's slowest GPU at the peak of the profile's number format (as the layout
    is judged: a bf16 profile at the bf16 peak, not the fp32 one, which made its compute 15x too slow beside
    the links on H100s and sent it to data parallelism that cannot split the batch);
    ``activation_compression_ratio`` as PipeDream's flag (None, its default: activation transfers not counted;
    its top-level README runs 1); ``flags``: ``--straight_pipeline`` and ``--use_fewer_machines``
    (:class:`PipeDreamFlags`; None: neither). NotFitting only for a straight pipeline that must use more GPUs
    than the model has layers.
    """
    from planner.costmodel import default_precision
    from planner.costmodel.precision import flop_scale, number_format, slowest_peak

    flags = flags or PipeDreamFlags()
    fmt = number_format(default_precision(profile))
    scale = flop_scale(profile, slowest_peak(profile, {g.flops_for(fmt) for g in cluster.gpus}))
    times = [(layer.forward_s + layer.backward_s) * scale for layer in profile.layers]
    params = [float(layer.param_bytes) for layer in profile.layers]
    outputs = [float(layer.output_bytes) for layer in profile.layers]
    levels, name_of = _pipedream_levels(cluster)
    found = pipedream_partition(times, params, levels, outputs, activation_compression_ratio, flags)
    if not found:
        return NotFitting("pipedream", f"{flags.label} puts one stage on each of the {len(cluster.gpus)} GPUs, but "
                                       f"the model has only {len(profile.layers)} layers (add --use_fewer_machines)")
    stages = tuple(((s.first, s.end), tuple(name_of(d) for d in s.devices), _dp_forms(s.first, s.end))
                   for s in found)
    return Layout("pipedream", stages, schedule, microbatches)


def _pipedream_levels(cluster: ir.Cluster) -> tuple[list[tuple[int, float]], Callable[[tuple[int, ...]], str]]:
    """PipeDream's levels (units, bandwidth) for ``cluster`` and the device name of a path in them."""
    sizes = {len(node.gpus) for node in cluster.nodes}
    inter = cluster.link("inter_node").bandwidth_Bps
    if len(sizes) == 1:
        def name_of(path: tuple[int, ...]) -> str:
            return cluster.nodes[path[0]].gpus[path[1]].name
        return [(sizes.pop(), cluster.link("intra_node").bandwidth_Bps), (len(cluster.nodes), inter)], name_of
    flat = [g.name for g in cluster.gpus]
    return [(len(flat), inter)], lambda path: flat[path[0]]

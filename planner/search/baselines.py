"""The baselines ``planner compare`` sets against the planner: what a user would otherwise run.

Pure (no torch, click or rich). Two parts:

* Partitioners, reimplemented from each system's own algorithm and tested against it
  (:mod:`planner.search.partitioners`, re-exported here): DeepSpeed's, torchgpipe's and
  PipeDream's.
* Plan builders (:func:`baseline_plans`): each baseline as an :class:`~planner.ir.Plan` on the
  same cluster, so that the same cost model and simulator judge every strategy. A baseline
  that cannot run on the cluster comes back as a :class:`NotFitting` with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate

from planner import ir
from planner.search.partitioners import (
    PipeDreamStage,
    balance_by_time,
    block_partition,
    deepspeed_layer_weights,
    deepspeed_parts,
    partition_balanced,
    partition_balanced_fast,
    partition_uniform,
    pipedream_partition,
)

__all__ = ["BASELINE_SCHEDULES", "STRATEGIES", "Layout", "NotFitting", "PipeDreamStage", "accpar_layout",
           "balance_by_time", "block_partition", "deepspeed_layer_weights", "deepspeed_layouts",
           "deepspeed_parts", "divisors", "dp_layout", "gpipe_uniform_layout", "partition_balanced",
           "partition_balanced_fast", "partition_uniform", "pipedream_layout", "pipedream_partition",
           "torchgpipe_layout"]


# ----------------------------------------------------------------------------- baselines as plans

STRATEGIES = ("dp", "accpar", "gpipe-uniform", "torchgpipe", "deepspeed-uniform", "deepspeed-parameters",
              "pipedream", "planner")
"""Every strategy ``planner compare`` runs, in the order it shows them (contract names)."""

BASELINE_SCHEDULES = {"gpipe-uniform": "gpipe", "torchgpipe": "gpipe", "deepspeed-uniform": "1f1b",
                      "deepspeed-parameters": "1f1b", "pipedream": "1f1b"}
"""The pipeline schedule each system runs: GPipe and torchgpipe fill then drain (F-then-B);
DeepSpeed's ``TrainSchedule`` and PipeDream-Flush are 1F1B. ``dp`` and ``accpar`` have no
pipeline (one stage, one micro-batch); ``planner`` runs the schedule the user asks for."""


@dataclass(frozen=True)
class NotFitting:
    """A strategy that cannot run on this cluster, and why (one line)."""

    name: str
    reason: str


@dataclass(frozen=True)
class Layout:
    """A strategy's answer before it is judged: stages (layers, devices, forms) and a schedule.

    ``microbatches`` lists the micro-batch counts the strategy may use; the comparison
    simulates each and keeps the fastest that fits (a user would tune it too).
    """

    name: str
    stages: tuple[tuple[tuple[int, int], tuple[str, ...], tuple[str, ...]], ...]
    schedule: str
    microbatches: tuple[int, ...]

    @property
    def config(self) -> str:
        return ir.config_string([len(devices) for _, devices, _ in self.stages])

    def plan(self, profile: ir.ModelProfile, cluster: ir.Cluster, microbatches: int, optimizer: str,
             recompute: Sequence[bool] | None = None) -> ir.Plan:
        """This layout as an unjudged plan: memory and prediction are filled in by the judge."""
        flags = list(recompute) if recompute is not None else [False] * len(self.stages)
        stages = tuple(ir.Stage(layers, devices, forms, 0, "full" if flag else "none")
                       for (layers, devices, forms), flag in zip(self.stages, flags, strict=True))
        return ir.Plan(profile=profile, cluster=cluster, schedule=self.schedule, microbatches=microbatches,
                       optimizer=optimizer, stages=stages, predicted=ir.Prediction(0.0, 0.0, 0.0, 0),
                       engine="any", solver=self.name)


def divisors(n: int) -> tuple[int, ...]:
    """The positive divisors of ``n``, ascending."""
    return tuple(d for d in range(1, n + 1) if n % d == 0)


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
    return Layout(name, _stages_from_parts(parts, groups), BASELINE_SCHEDULES[name], microbatches)


def dp_layout(profile: ir.ModelProfile, cluster: ir.Cluster) -> Layout:
    """``dp``: every layer data parallel over every GPU, one stage, no micro-batching."""
    n = len(profile.layers)
    devices = tuple(g.name for g in cluster.gpus)
    return Layout("dp", (((0, n), devices, _dp_forms(0, n)),), "1f1b", (1,))


def accpar_layout(profile: ir.ModelProfile, cluster: ir.Cluster, optimizer: str) -> Layout:
    """``accpar``: AccPar's per-layer forms over every GPU, no pipeline (one stage, M = 1).

    AccPar (Song et al., HPCA'20) picks, layer by layer, between batch (data) parallel and
    the two weight partitions with a chain search over the layer sequence; that is the
    HPP chain DP (:func:`planner.search.hpp.hpp`) on the group of every GPU.
    """
    from planner.cluster import group_of
    from planner.costmodel import layer_table
    from planner.search.hpp import hpp

    n = len(profile.layers)
    devices = tuple(g.name for g in cluster.gpus)
    table = layer_table(profile, group_of(cluster, devices), 1, optimizer)
    forms, _ = hpp(table, 0, n, 1)
    return Layout("accpar", (((0, n), devices, tuple(forms)),), "1f1b", (1,))


def gpipe_uniform_layout(profile: ir.ModelProfile, cluster: ir.Cluster,
                         microbatches: tuple[int, ...]) -> Layout | NotFitting:
    """``gpipe-uniform``: one GPU per stage, equal layer counts (the first stages take the rest)."""
    def balance_of(k: int) -> list[int]:
        parts = partition_uniform(len(profile.layers), k)
        return [parts[s + 1] - parts[s] for s in range(k)]
    return _one_gpu_per_stage("gpipe-uniform", profile, cluster, balance_of, microbatches)


def torchgpipe_layout(profile: ir.ModelProfile, cluster: ir.Cluster,
                      microbatches: tuple[int, ...]) -> Layout | NotFitting:
    """``torchgpipe``: one GPU per stage, split by ``balance_by_time`` on the forward times."""
    return _one_gpu_per_stage("torchgpipe", profile, cluster, lambda k: balance_by_time(profile, k),
                              microbatches)


def deepspeed_layouts(profile: ir.ModelProfile, cluster: ir.Cluster, method: str,
                      microbatches: tuple[int, ...]) -> list[Layout] | NotFitting:
    """``deepspeed-<method>``: a pipeline x data-parallel grid, every stage the same width.

    DeepSpeed's ``PipeDataParallelTopology`` puts the data axis innermost, so stage s holds
    ranks [s*D, (s+1)*D): consecutive GPUs. Every pipeline depth K that divides the GPU
    count (and is at most the layer count) is a layout; the judge keeps the fastest, as a
    user tuning ``num_stages`` would.
    """
    name = f"deepspeed-{method}"
    gpus = [g.name for g in cluster.gpus]
    n, total = len(profile.layers), len(gpus)
    layouts = []
    for k in divisors(total):
        if k > n:
            break
        width = total // k
        groups = [tuple(gpus[s * width:(s + 1) * width]) for s in range(k)]
        parts = deepspeed_parts(profile, k, method)
        layouts.append(Layout(name, _stages_from_parts(parts, groups), BASELINE_SCHEDULES[name], microbatches))
    return layouts or NotFitting(name, "no pipeline depth divides the GPU count")


def pipedream_layout(profile: ir.ModelProfile, cluster: ir.Cluster,
                     microbatches: tuple[int, ...]) -> Layout:
    """``pipedream``: PipeDream's hierarchical partitioner, data-parallel replicas per stage.

    Its two levels are the GPUs of a server (``intra_node`` bandwidth) and the servers
    (``inter_node``); servers of different sizes break PipeDream's assumption, and then it
    runs one level over every GPU on the slower link. Layer times are the profile's
    forward+backward on the cluster's slowest GPU.
    """
    slowest = min(g.flops for g in cluster.gpus)
    scale = profile.device_flops / slowest
    times = [(layer.forward_s + layer.backward_s) * scale for layer in profile.layers]
    params = [float(layer.param_bytes) for layer in profile.layers]
    sizes = {len(node.gpus) for node in cluster.nodes}
    inter = cluster.link("inter_node").bandwidth_Bps
    if len(sizes) == 1:
        levels = [(sizes.pop(), cluster.link("intra_node").bandwidth_Bps), (len(cluster.nodes), inter)]

        def name_of(path: tuple[int, ...]) -> str:
            return cluster.nodes[path[0]].gpus[path[1]].name
    else:
        flat = [g.name for g in cluster.gpus]
        levels = [(len(flat), inter)]

        def name_of(path: tuple[int, ...]) -> str:
            return flat[path[0]]
    stages = tuple(((s.first, s.end), tuple(name_of(d) for d in s.devices), _dp_forms(s.first, s.end))
                   for s in pipedream_partition(times, params, levels))
    return Layout("pipedream", stages, BASELINE_SCHEDULES["pipedream"], microbatches)

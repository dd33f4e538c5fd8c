"""The baselines ``planner compare`` sets against the planner: what a user would otherwise run.

Pure (no torch, click or rich). Two parts here:

* Partitioners, reimplemented from each system's own algorithm and tested against it
  (re-exported here): DeepSpeed's and torchgpipe's (:mod:`planner.search.partitioners`) and
  PipeDream's (:mod:`planner.search.pipedream`).
* Layouts: each baseline's answer as stages on the same cluster (:class:`Layout`, turned
  into an :class:`~planner.ir.Plan` by :meth:`Layout.plan`), so that the same cost model and
  simulator judge every strategy.
* The settings that run them: :mod:`planner.search.settings`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate

from planner import ir
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


@dataclass(frozen=True)
class NotFitting:
    """A strategy that cannot run on this cluster, and why (one line)."""

    name: str
    reason: str


@dataclass(frozen=True)
class Layout:
    """A strategy's answer before it is judged: stages (layers, devices, forms) and a schedule.

    ``microbatches`` lists the micro-batch counts the strategy may use; the comparison
    simulates each and keeps the fastest that fits (a user would tune it too). ``tp``: the
    tensor degree of every stage (1: data parallel only; AccPar's split forms span the
    whole stage). ``zero``: the ZeRO stage of every stage with two or more data-parallel ranks (the
    others run 0: there is nothing to shard over). ``recompute``: every stage's recomputation before
    the judge gives an overflowing stage ``full``; ``sequence_parallel``: Megatron-LM's sequence
    parallelism on the blocks of every tensor-parallel stage; ``virtual_stages``: the model chunks per device
    group of an interleaved schedule (``stages`` then lists the chunks, chunk c on the devices of chunk c mod K).
    """

    name: str
    stages: tuple[tuple[tuple[int, int], tuple[str, ...], tuple[str, ...]], ...]
    schedule: str
    microbatches: tuple[int, ...]
    tp: int = 1
    zero: int = 0
    recompute: str = "none"
    sequence_parallel: bool = False
    virtual_stages: int = 1

    def _zero_of(self, devices: Sequence[str]) -> int:
        """The stage's ZeRO stage: :attr:`zero` over two or more data-parallel ranks, else 0."""
        return self.zero if len(devices) // self.tp >= 2 else 0

    @property
    def data_parallel(self) -> bool:
        """Whether a stage has two or more data-parallel ranks (a ZeRO stage then shards something)."""
        return any(len(devices) // self.tp >= 2 for _, devices, _ in self.stages)

    @property
    def config(self) -> str:
        groups = self.stages[:len(self.stages) // self.virtual_stages]  # interleaved: the first chunk of each group
        return ir.config_string([len(devices) for _, devices, _ in groups])

    def plan(self, profile: ir.ModelProfile, cluster: ir.Cluster, microbatches: int, optimizer: str,
             recompute: Sequence[bool] | None = None) -> ir.Plan:
        """This layout as an unjudged plan, in the profile's own precision (as ``planner search`` trains
        by default, so that a baseline and the planner's row compute in the same number format):
        memory and prediction are filled in by the judge."""
        from planner.costmodel import default_precision

        flags = list(recompute) if recompute is not None else [False] * len(self.stages)
        stages = tuple(ir.Stage(layers, devices, forms, 0, "full" if flag else self.recompute, tp=self.tp,
                                zero=self._zero_of(devices),
                                sequence_parallel=self.sequence_parallel and self.tp > 1)
                       for (layers, devices, forms), flag in zip(self.stages, flags, strict=True))
        return ir.Plan(profile=profile, cluster=cluster, schedule=self.schedule, microbatches=microbatches,
                       optimizer=optimizer, stages=stages, predicted=ir.Prediction(0.0, 0.0, 0.0, 0),
                       engine="any", solver=self.name, precision=default_precision(profile),
                       virtual_stages=self.virtual_stages)


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


def megatron_tps(profile: ir.ModelProfile, cluster: ir.Cluster) -> tuple[int, ...]:
    """Every ``--tensor-model-parallel-size`` Megatron-LM runs here inside a server, largest first: the divisors
    of a server's GPUs (its smallest) that divide every transformer block's attention heads (Megatron-Core's
    ``TransformerConfig``: "num_attention_heads must be a multiple of tensor_model_parallel_size") and KV heads
    (Megatron also replicates KV heads where tp is a multiple of them, which the planner's engines do not run)."""
    per_server = min(len(node.gpus) for node in cluster.nodes)
    blocks = [layer.block for layer in profile.layers if layer.block is not None]
    return tuple(t for t in reversed(divisors(per_server)) if all(b.heads % t == 0 and b.kv_heads % t == 0
                                                                    for b in blocks))


def megatron_tp(profile: ir.ModelProfile, cluster: ir.Cluster) -> int:
    """Megatron-LM's tensor degree in its SC'21 recipe: the GPUs of a server (its smallest), lowered to the
    largest divisor that divides every transformer block's attention heads and KV heads (Megatron shards whole
    heads): the first of :func:`megatron_tps`."""
    return megatron_tps(profile, cluster)[0]


def megatron_form(layer: ir.LayerProfile) -> str:
    """A layer's form in Megatron-LM's tensor group (Shoeybi et al. 2019, section 3): a transformer
    block ``tp``; the input embedding sharded over the vocabulary, its partial outputs all-reduced
    (``split_in``); the output layer, and any other layer, column-parallel (``split_out``): every rank
    takes the whole micro-batch, so a micro-batch of one sample runs. ``dp`` where the weight's shape
    is unknown (the split forms are closed to it)."""
    if layer.block is not None:
        return "tp"
    if layer.param_count and not layer.splittable:
        return "dp"
    return "split_in" if layer.type == "Embedding" else "split_out"


def megatron_parts(profile: ir.ModelProfile, chunks: int) -> list[int]:
    """Megatron-LM's cut of the model into ``chunks`` pipeline stages (or interleaved chunks): the transformer
    blocks in equal counts, the layers before them (the embedding) with the first chunk and those after them (the
    final norm and the output layer) with the last, where the blocks are contiguous and their count divides
    (Megatron's ``--num-layers`` rule); else equal layer counts (:func:`partition_uniform`)."""
    blocks = [i for i, layer in enumerate(profile.layers) if layer.block is not None]
    if not blocks or blocks[-1] - blocks[0] + 1 != len(blocks) or len(blocks) % chunks:
        return partition_uniform(len(profile.layers), chunks)
    per = len(blocks) // chunks
    return [0, *(blocks[0] + c * per for c in range(1, chunks)), len(profile.layers)]


def megatron_layouts(profile: ir.ModelProfile, cluster: ir.Cluster, microbatches: tuple[int, ...],
                     interleaved: bool = False, tp: int | None = None) -> list[Layout] | NotFitting:
    """``megatron``: Megatron-LM's default 3-D layout (Narayanan et al., SC'21, section 3.3).

    Tensor parallel inside a server (``tp``, one of :func:`megatron_tps`; None: :func:`megatron_tp`, the
    server's GPUs; 1: data and pipeline parallel only; every layer in its
    :func:`megatron_form`: the blocks ``tp``, the embedding and the output layer sharded), pipeline
    parallel across servers with uniform block counts per stage (:func:`megatron_parts`), data parallel for the
    rest, 1F1B; ranks in Megatron's order (tensor innermost, then data, then pipeline), so a
    stage holds consecutive GPUs. Every pipeline depth pp that divides the GPUs left by tp
    (at most the layer count) is a layout: the judge keeps the fastest that fits, at least
    as fast as Megatron's rule (the smallest pp that fits), and gives overflowing stages
    full recomputation, as Megatron's users turn it on when memory runs out.

    ``interleaved``: Megatron's interleaved schedule instead (SC'21 section 2.2,
    ``--num-layers-per-virtual-pipeline-stage``): for pp >= 2 (:func:`_virtual_stages`), every v >= 2 chunks per
    stage with the blocks' count divisible by pp x v (Megatron's rule), chunk c on pipeline rank c mod pp, at the
    micro-batch counts that are multiples of pp (its schedule's rule at its default
    ``--microbatch-group-size-per-virtual-pipeline-stage``, pp); none where no pp and v qualify.
    """
    if not any(layer.block is not None for layer in profile.layers):
        return NotFitting("megatron", "Megatron-LM's tensor parallelism shards transformer blocks; the model has none")
    gpus = [g.name for g in cluster.gpus]
    tp, n = tp or megatron_tp(profile, cluster), len(profile.layers)
    forms = tuple(megatron_form(layer) if tp > 1 else "dp" for layer in profile.layers)
    layouts = []
    for pp in divisors(len(gpus) // tp):
        if pp > n:
            break
        width = len(gpus) // pp
        for v in _virtual_stages(profile, pp) if interleaved else (1,):
            choices = tuple(m for m in microbatches if m % pp == 0) if interleaved else microbatches
            parts = megatron_parts(profile, pp * v)
            stages = tuple(((parts[c], parts[c + 1]), tuple(gpus[c % pp * width:(c % pp + 1) * width]),
                            forms[parts[c]:parts[c + 1]]) for c in range(pp * v))
            if choices:
                layouts.append(Layout("megatron", stages, "interleaved" if interleaved else "1f1b", choices, tp,
                                      virtual_stages=v))
    return layouts


def _virtual_stages(profile: ir.ModelProfile, pp: int) -> list[int]:
    """The chunks per stage Megatron's interleaved schedule can run on ``pp`` stages: v >= 2 with the transformer
    blocks' count divisible by pp x v, on 2 stages or more. Megatron-LM (NVIDIA/Megatron-LM d98e8a6, 2026-08-22,
    ``megatron/training/arguments.py``) asks for pp > 2 only with ``--no-overlap-p2p-communication``; with its
    default p2p overlap, pp > 1 ("Enable virtual pipelining and P2P communication overlap at PP=2", 3ee489d,
    2024-05-31), as Megatron-Core's ``parallel_state`` ("pipeline-model-parallel size should be greater than 1
    with interleaved schedule")."""
    blocks = sum(layer.block is not None for layer in profile.layers)
    return [] if pp < 2 else [v for v in range(2, blocks // pp + 1) if blocks % (pp * v) == 0]

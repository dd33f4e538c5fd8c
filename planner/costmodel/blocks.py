"""What a transformer block costs under Megatron-LM's ``tp`` form beyond an even division over its tensor group.

Pure (numpy). Which blocks a tensor group of ``t`` may split (:func:`tp_open`: heads and KV heads divide), the share of
a block's batch-proportional time each rank runs (:func:`tp_shares`: the norms, dropouts and residual adds run whole on
every rank without sequence parallelism), the activations it keeps (:func:`block_activation_ratios`, Korthikanti et
al. 2022, Table 2) and the attention core's share of its forward, which selective recomputation repeats
(:func:`core_share`, Narayanan et al. SC'21, section 5.1). :mod:`planner.costmodel.layers` builds its tables with them.
"""

from __future__ import annotations

import numpy as np

from planner import ir


def block_activation_ratios(profile: ir.ModelProfile, tp: int, sequence_parallel: bool
                            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per layer: (tp-form activations, tp-form with selective recomputation, dp-form with selective
    recomputation) as shares of the layer's profiled saved bytes (Korthikanti et al. Table 2);
    1 for layers that are not blocks. Also the attention core's share of forward, :func:`core_share`."""
    tp_act, tp_sel, dp_sel = [], [], []
    for layer in profile.layers:
        b = layer.block
        if b is None:
            tp_act.append(1.0 / tp)
            tp_sel.append(1.0 / tp)
            dp_sel.append(1.0)
            continue
        core = 5.0 * b.heads * b.seq_len / b.hidden if b.attention_saved else 0.0  # fused: no s x s weights kept
        base = 34.0 + core
        rest = 34.0 / tp if sequence_parallel else 10.0 + 24.0 / tp
        tp_act.append((rest + core / tp) / base)
        tp_sel.append(rest / base)
        dp_sel.append(34.0 / base)
    return np.array(tp_act), np.array(tp_sel), np.array(dp_sel)


def core_share(profile: ir.ModelProfile) -> np.ndarray:
    """Per layer, the attention core's share of its forward FLOPs: ``s w / (6h^2 + s w)`` for blocks, else 0."""
    return np.array([0.0 if (b := x.block) is None else b.seq_len * b.attention_width
                     / (6.0 * b.hidden ** 2 + b.seq_len * b.attention_width) for x in profile.layers])


def tp_open(profile: ir.ModelProfile, tp: int) -> np.ndarray:
    """Which layers may run the ``tp`` form on a tensor group of ``tp``: blocks it splits (shardable, whose heads and KV
    heads it divides: ``BlockShape.splits_over``)."""
    return np.array([tp > 1 and x.block is not None and x.block.splits_over(tp) for x in profile.layers])


def tp_shares(profile: ir.ModelProfile, tp: int, sequence_parallel: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per layer, the share of its forward's and its backward's batch-proportional time each rank of a tensor group
    of ``tp`` runs under the ``tp`` form: ``1/tp`` of the sharded part, and the part Megatron-LM runs whole on every
    rank without sequence parallelism (``LayerProfile.replicated_shares``: norms, dropouts, residual adds; Korthikanti
    et al. 2022, section 4.2.2), whole, or ``1/tp`` of it with sequence parallelism."""
    shares = np.array([x.replicated_shares for x in profile.layers]).reshape(len(profile.layers), 2)
    kept = 1.0 / tp if sequence_parallel else 1.0
    whole = (1.0 - shares) / tp + shares * kept
    return whole[:, 0], whole[:, 1]

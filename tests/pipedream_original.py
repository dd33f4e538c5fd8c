"""PipeDream's ``optimizer/optimizer_graph_hierarchical.py`` (msr-fiddle/pipedream, 7db6a1c), for a chain of layers:
the oracle that ``planner.search.pipedream`` is tested against.

``compute_partitioning`` is kept as PipeDream wrote it, its module globals (``straight_pipeline``,
``use_fewer_machines``, ``activation_compression_ratio``; ``use_memory_constraint`` off, its default) made
arguments; ``levels`` is ``main``'s loop over the levels and the unwinding of their splits. A chain's
antichain predecessors of layer j are the layers before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def compute_partitioning(compute_times: list[list[Any]], parameter_sizes: list[list[Any]],
                         output_activation_sizes: Sequence[float], num_machines: int,
                         num_machines_within_machine: int, bandwidth: float, final_level: bool, *,
                         straight_pipeline: bool, use_fewer_machines: bool,
                         activation_compression_ratio: float | None) -> list[list[list[Any]]]:
    n = len(compute_times[0])
    all_predecessor_ids = [list(range(j)) for j in range(n)]
    A: list[list[list[Any]]] = [[[(None, None, None)] * num_machines for _ in range(n)] for _ in range(n)]
    for i in range(n):
        for j in range(i, n):
            cum_compute_time = compute_times[i][j]
            cum_parameter_size = parameter_sizes[i][j]
            max_m = 1 if straight_pipeline else num_machines
            for m in range(max_m):
                data_parallel_communication_time = (4 * m * cum_parameter_size) / (bandwidth * (m + 1))
                data_parallel_communication_time /= num_machines_within_machine
                if cum_compute_time is None:
                    A[i][j][m] = (None, None, None)
                else:
                    A[i][j][m] = (sum([cum_compute_time, data_parallel_communication_time]) / (m + 1), None, (m + 1))
    max_i = n if not final_level else 1
    for i in range(max_i):
        for m in range(1, num_machines):
            for j in range(i + 1, n):
                (min_pipeline_time, optimal_split, optimal_num_machines) = A[i][j][m]
                if use_fewer_machines and m > 0 and (min_pipeline_time is None
                                                     or A[i][j][m - 1][0] < min_pipeline_time):
                    (min_pipeline_time, optimal_split, optimal_num_machines) = A[i][j][m - 1]
                for k in all_predecessor_ids[j]:
                    if i > 0 and k in all_predecessor_ids[i - 1]:
                        continue
                    max_m_prime = 2 if straight_pipeline else (m + 1)
                    for m_prime in range(1, max_m_prime):
                        input_transfer_time = (2.0 * output_activation_sizes[k]) / (bandwidth * m_prime)
                        output_transfer_time = None
                        if j < len(output_activation_sizes) - 1:
                            output_transfer_time = (2.0 * output_activation_sizes[j]) / (bandwidth * m_prime)
                        last_stage_time = compute_times[k + 1][j]
                        if last_stage_time is None:
                            continue
                        last_stage_parameter_size = parameter_sizes[k + 1][j]
                        last_stage_time = sum([last_stage_time, ((4 * (m_prime - 1) * last_stage_parameter_size)
                                                                 / (bandwidth * m_prime))])
                        last_stage_time /= m_prime
                        if A[i][k][m - m_prime][0] is None:
                            continue
                        pipeline_time = max(A[i][k][m - m_prime][0], last_stage_time)
                        if activation_compression_ratio is not None:
                            input_transfer_time /= activation_compression_ratio
                            if output_transfer_time is not None:
                                output_transfer_time /= activation_compression_ratio
                            pipeline_time = max(pipeline_time, input_transfer_time)
                            if output_transfer_time is not None:
                                pipeline_time = max(pipeline_time, output_transfer_time)
                        if min_pipeline_time is None or min_pipeline_time > pipeline_time:
                            optimal_split = (k, m - m_prime)
                            optimal_num_machines = m_prime
                            min_pipeline_time = pipeline_time
                A[i][j][m] = (min_pipeline_time, optimal_split, optimal_num_machines)
    return A


def _analyze(A: list[list[list[Any]]], start: int, end: int, num_machines: int) -> list[tuple[int, int]]:
    """``analyze_partitioning``'s splits and replication factors: (first layer, replicas) per stage."""
    metadata = A[start][end - 1][num_machines - 1]
    next_split = metadata[1]
    splits, replication_factors = [], []
    while next_split is not None:
        splits.append(next_split[0] + 1)
        replication_factors.append(metadata[2])
        metadata = A[start][next_split[0]][next_split[1]]
        next_split = metadata[1]
    splits.append(start)
    replication_factors.append(metadata[2])
    return list(zip(reversed(splits), reversed(replication_factors), strict=True))


def levels(stage_times: Sequence[float], param_bytes: Sequence[float], all_num_machines: Sequence[int],
           bandwidths: Sequence[float], output_bytes: Sequence[float], *, straight_pipeline: bool = False,
           use_fewer_machines: bool = False, activation_compression_ratio: float | None = None
           ) -> tuple[float | None, list[tuple[int, int]]]:
    """``main``'s levels: the best time per batch and the innermost level's stages as (first layer, replicas per
    unit of the level above); (None, []) when PipeDream finds no answer."""
    n = len(stage_times)
    cum = [sum(stage_times[:j + 1]) for j in range(n)]
    cum_p = [sum(param_bytes[:j + 1]) for j in range(n)]
    compute = [[(cum[j] - (cum[i - 1] if i else 0.0)) if j >= i else None for j in range(n)] for i in range(n)]
    params = [[(cum_p[j] - (cum_p[i - 1] if i else 0.0)) if j >= i else None for j in range(n)] for i in range(n)]
    tables, within = [], 1
    for depth, (machines, bandwidth) in enumerate(zip(all_num_machines, bandwidths, strict=True)):
        A = compute_partitioning(compute, params, output_bytes, machines, within, bandwidth,
                                 depth == len(bandwidths) - 1, straight_pipeline=straight_pipeline,
                                 use_fewer_machines=use_fewer_machines,
                                 activation_compression_ratio=activation_compression_ratio)
        within = machines
        compute = [[A[i][j][-1][0] for j in range(n)] for i in range(n)]
        tables.append(A)
    best = tables[-1][0][n - 1][all_num_machines[-1] - 1][0]
    if best is None:
        return None, []
    spans = [(0, n)]
    stages: list[tuple[int, int]] = []
    for depth in range(len(tables) - 1, -1, -1):
        found = [(s, r) for first, end in spans for s, r in _analyze(tables[depth], first, end,
                                                                     all_num_machines[depth])]
        ends = [s for s, _ in found[1:]] + [n]
        spans = [(s, e) for (s, _), e in zip(found, ends, strict=True)]
        stages = found
    return best, stages

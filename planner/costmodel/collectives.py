"""Collectives under the alpha-beta model: point-to-point, ring and hierarchical all-reduce, all-gather.

Pure. Sources: alpha-beta communication (Hockney 1994; PipePar eq. 4): ``alpha + S/B`` on
the slowest link a group spans; ring all-reduce (Patarasuk & Yuan 2009; Thakur,
Rabenseifner & Gropp 2005): ``2(n-1)/n * S/B + 2(n-1) * alpha``, ring all-gather and
reduce-scatter ``(n-1)/n * S/B + (n-1) * alpha`` each (half an all-reduce); hierarchical
all-reduce for a group spanning servers (Jia et al. 2018, 2D/hierarchical ring; Horovod/
NCCL tree-of-rings): reduce-scatter inside each server, ring all-reduce of the ``S/g``
shards across the ``m`` servers, all-gather inside each server. The collectives divide by the
link's bus bandwidth for their kind (``Link.allreduce_Bps``, ``Link.allgather_Bps``: nccl-tests'
``busbw``, measured where the cluster gives it), a point-to-point transfer by its own bandwidth.
Each collective call also pays its link's ``collective_latency_s`` once (the intercept of a
collective's time over its size beyond the ring's latencies: the library's set-up of a call, which
``planner calibrate`` fits; a hierarchical all-reduce is one call, at the larger of its two links').
"""

from __future__ import annotations

from planner import ir
from planner.cluster import Group


def p2p_s(nbytes: float, link: ir.Link) -> float:
    """Point-to-point transfer, alpha-beta (Hockney): ``alpha + S/B``; 0 bytes are free."""
    return 0.0 if nbytes <= 0 else link.latency_s + nbytes / link.bandwidth_Bps


def ring_allreduce_s(nbytes: float, n: int, link: ir.Link) -> float:
    """Ring all-reduce (Patarasuk & Yuan 2009): ``2(n-1)/n * S/B + 2(n-1) alpha``."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (n - 1) / n * nbytes / link.allreduce_Bps + 2 * (n - 1) * link.latency_s + link.collective_latency_s


def ring_allgather_s(nbytes: float, n: int, link: ir.Link) -> float:
    """Ring all-gather of a tensor of ``nbytes`` in total: ``(n-1)/n * S/B + (n-1) alpha``."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (n - 1) / n * nbytes / link.allgather_Bps + (n - 1) * link.latency_s + link.collective_latency_s


def allreduce_coefficients(group: Group) -> tuple[float, float]:
    """Gradient all-reduce time of a group as ``coef * S + const`` (for S > 0).

    Inside one server: a ring on ``intra_node``. Spanning ``m`` servers with ``g`` GPUs
    each: hierarchical (Jia et al. 2018): reduce-scatter in the server
    ``(g-1)/g S/B_in + (g-1) a_in``, ring all-reduce of ``S/g`` over the servers
    ``2(m-1)/m (S/g)/B_out + 2(m-1) a_out``, all-gather in the server (as reduce-scatter); the
    call's fixed cost once (module doc).
    """
    n = group.n
    if n <= 1:
        return 0.0, 0.0
    if not group.spans_servers:
        link = group.intra
        return 2 * (n - 1) / n / link.allreduce_Bps, 2 * (n - 1) * link.latency_s + link.collective_latency_s
    g, m = group.per_node, group.nodes
    coef = 2 * (g - 1) / g / group.intra.allgather_Bps + 2 * (m - 1) / m / g / group.inter.allreduce_Bps
    const = 2 * (g - 1) * group.intra.latency_s + 2 * (m - 1) * group.inter.latency_s
    return coef, const + max(group.intra.collective_latency_s, group.inter.collective_latency_s)


def allreduce_s(nbytes: float, group: Group) -> float:
    """Gradient all-reduce of ``nbytes`` over ``group`` (ring, or hierarchical across servers)."""
    if nbytes <= 0 or group.n <= 1:
        return 0.0
    coef, const = allreduce_coefficients(group)
    return coef * nbytes + const

"""Which server runs which ranks, and the torchrun command of each server (pure: no torch).

Both engines give stage ``s``'s device ``j`` global rank ``s * W + j`` (the first K stages;
interleaved chunks reuse their devices). torchrun gives each server consecutive global
ranks: node rank ``R`` runs ranks ``R * P .. R * P + P - 1`` (``P`` = ``--nproc-per-node``,
the same on every server). So a plan runs on ``N`` servers when its ranks, in order, visit
each server once with ``P`` devices each; node rank ``R`` is the ``R``-th server so visited
(the cluster's order for plans whose stages take devices in order, as the search does), and
a tensor group (consecutive devices of a stage) stays inside its server.

Several servers meet at torchrun's static rendezvous (a TCPStore at ``HOST:PORT`` on node
rank 0). torchrun's c10d backend would ignore ``--node-rank`` (torch/distributed/run.py: "only
used for static rendezvous"; dynamic rendezvous orders nodes by host name and process id),
and the plan's device names would no longer say which server runs which rank.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from planner import ir
from planner.cluster import uneven_servers
from planner.errors import ExportError, PlannerError, UsageError

DEFAULT_RDZV_PORT = 29500
DEFAULT_RDZV_TIMEOUT_S = 60
HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
"""A host name as DeepSpeed's hostfile and ssh take it: letters, digits, '-', '.' and '_', starting with a
letter or digit, at most 253 characters (no whitespace, control characters, quotes or shell syntax)."""
ENDPOINT_HOST = re.compile(r"[A-Za-z0-9._:-]{1,253}")
"""The host of ``--rdzv-endpoint`` (brackets of an IPv6 address removed) as torchrun's rendezvous takes it
(torch.distributed.elastic.rendezvous.utils.parse_rendezvous_endpoint: ``[\\w.:-]+``), in ASCII: a name or
address with a space, quote or control character is refused before any process starts, not by the workers."""


@dataclass(frozen=True)
class NodeLayout:
    """The plan's ranks on servers: ``devices[r]`` runs rank ``r``; server ``servers[R]`` is node rank ``R``."""

    servers: tuple[str, ...]
    devices: tuple[str, ...]
    nproc_per_node: int

    @property
    def nnodes(self) -> int:
        return len(self.servers)

    @property
    def world_size(self) -> int:
        return len(self.devices)

    def ranks(self, node_rank: int) -> range:
        """The global ranks node ``node_rank`` runs."""
        return range(node_rank * self.nproc_per_node, (node_rank + 1) * self.nproc_per_node)


def rank_devices(plan: ir.Plan) -> tuple[str, ...]:
    """The device of every global rank as the engines place them: stage by stage, then within a stage."""
    k = len(plan.stages) // max(plan.virtual_stages, 1)
    return tuple(d for st in plan.stages[:k] for d in st.devices)


def rank_stage(plan: ir.Plan, rank: int) -> int:
    """The pipeline position (0..K-1) of global ``rank``."""
    return rank // plan.stages[0].width


def rank_chunks(plan: ir.Plan, rank: int) -> tuple[ir.Stage, ...]:
    """The plan stages global ``rank`` runs: its pipeline position's, one per virtual stage."""
    positions = len(rank_devices(plan)) // plan.stages[0].width
    return tuple(plan.stages[rank_stage(plan, rank)::positions])


def node_layout(plan: ir.Plan, error: type[PlannerError] = ExportError) -> NodeLayout:
    """The servers the plan's ranks run on, in node-rank order; ``error`` when torchrun cannot start it."""
    server_of = {g.name: node.name for node in plan.cluster.nodes for g in node.gpus}
    devices = rank_devices(plan)
    servers: list[str] = []
    counts: dict[str, int] = {}
    for rank, dev in enumerate(devices):
        server = server_of[dev]
        if servers and servers[-1] != server and server in counts:
            raise error(f"rank {rank} ({dev}) returns to server {server} after {servers[-1]}: torchrun gives "
                        "each server consecutive ranks (stage by stage)",
                        "search the plan again, so that stages take devices server by server")
        if server not in counts:
            servers.append(server)
        counts[server] = counts.get(server, 0) + 1
    used = uneven_servers(plan)
    if used is not None:
        raise error(f"the plan uses different numbers of GPUs per server ({used}); torchrun starts the same "
                    "number of processes on every server (--nproc-per-node)",
                    "search a plan that uses as many GPUs on every server it uses (e.g. with --config)")
    return NodeLayout(tuple(servers), devices, counts[servers[0]])


def check_host_names(names: Iterable[str], where: str = "DeepSpeed's hostfile") -> None:
    """ExportError naming the first of ``names`` that is not a host name (:data:`HOST_NAME`)."""
    for name in names:
        if not HOST_NAME.fullmatch(name):
            raise ExportError(f"server name {name!r} cannot go into {where}: a host name is letters, digits, '-', "
                              "'.' and '_', starting with a letter or digit (at most 253 characters; no spaces, "
                              "control characters or quotes)",
                              "rename the server (the cluster's nodes[].name in the plan) to its host name, "
                              "e.g. node-01, or export --to torch")


def check_node_rank(nnodes: int, node_rank: int) -> None:
    """UsageError unless ``0 <= node_rank < nnodes``."""
    if nnodes < 1 or not 0 <= node_rank < nnodes:
        raise UsageError(f"--node-rank {node_rank} is outside 0..{nnodes - 1} for --nnodes {nnodes}",
                         "number the servers 0 to nnodes-1; node rank 0 hosts the rendezvous")


def check_nnodes(layout: NodeLayout, nnodes: int) -> None:
    """``--nnodes`` must be the number of servers the plan uses (1 runs every rank on this machine)."""
    if nnodes != 1 and nnodes != layout.nnodes:
        used = ", ".join(f"{s}: {layout.nproc_per_node}" for s in layout.servers)
        raise UsageError(f"--nnodes {nnodes} does not fit the plan: its {layout.world_size} ranks run on "
                         f"{layout.nnodes} server(s) (GPUs per server: {used})",
                         "leave out --nnodes: every rank runs on this machine" if layout.nnodes == 1 else
                         f"use --nnodes {layout.nnodes} (one launch per server), or --nnodes 1 for every rank "
                         "on this machine")


def torchrun_args(nproc_per_node: int, nnodes: int = 1, node_rank: int = 0, endpoint: str = "",
                  rdzv_timeout_s: float = DEFAULT_RDZV_TIMEOUT_S) -> list[str]:
    """torchrun's arguments (before the script) for node ``node_rank`` of ``nnodes``."""
    if nnodes == 1:
        return ["--standalone", f"--nproc-per-node={nproc_per_node}"]
    return [f"--nnodes={nnodes}", f"--node-rank={node_rank}", f"--nproc-per-node={nproc_per_node}",
            "--rdzv-backend=static", f"--rdzv-endpoint={endpoint}", f"--rdzv-conf=timeout={int(rdzv_timeout_s)}"]


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port); UsageError when it is not one."""
    host, sep, port = endpoint.rpartition(":")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    ok_port = port.isascii() and port.isdigit() and 0 < int(port) < 65536  # int() also reads '٢' but not '²'
    if not sep or not ENDPOINT_HOST.fullmatch(bare) or not ok_port:
        raise UsageError(f"--rdzv-endpoint {endpoint!r} is not HOST:PORT (a host name, an IPv4 address or an "
                         "[IPv6] address, and a port 1-65535)",
                         f"give node rank 0's address and a free port, e.g. 10.0.0.1:{DEFAULT_RDZV_PORT}")
    return bare, int(port)

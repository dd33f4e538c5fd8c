"""The endpoint of a run on several servers, checked before torchrun starts: free on node rank 0, a rendezvous
(not another program) on the others.

torchrun's static rendezvous is a TCPStore that node rank 0 hosts at ``--rdzv-endpoint``. Where another program
already listens on that port, node rank 0 cannot host it (torch says EADDRINUSE after a few seconds), and every
other server's torchrun connects to that program instead and waits for its answer for ever: torch 2.13's TCPStore
client reads the reply to its handshake without a timeout, ``--rdzv-timeout`` notwithstanding, so node rank 1
trained nothing until ``--timeout`` (900 s) ended it. :func:`check_endpoint` fails both at once, naming the port
and, where it is on this machine, the process that holds it (:func:`port_holder`, from ``/proc``).

:func:`probe` speaks the two messages every TCPStore client sends first (torch/csrc/distributed/c10d/TCPStore.cpp:
``VALIDATE`` with the magic number, then ``PING`` with a nonce the server sends back), so it tells a rendezvous
from another program without joining it (a client that adds no key is not counted as a server).
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from pathlib import Path

from planner.errors import RunError
from planner.export.nodes import parse_endpoint
from planner.export.quoting import one_line

PROBE_S = 5.0
"""Seconds a rendezvous has to answer the ping (it answers at once; the endpoint's round trip, not the run)."""
_VALIDATE = struct.pack("=BI", 0, 0x3C85F7CE)  # QueryType::VALIDATE, validationMagicNumber
_PING = 13  # QueryType::PING
_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column


def probe(host: str, port: int, timeout_s: float = PROBE_S) -> str:
    """What listens at ``host:port``: ``"none"`` (nothing yet: refused, unreachable or no answer to the connect),
    ``"store"`` (a TCPStore answered the ping) or ``"other"`` (a program that took the connection and did not)."""
    try:
        conn = socket.create_connection((host, port), timeout=timeout_s)
    except OSError:
        return "none"
    nonce = os.getpid() & 0xFFFFFFFF
    with conn:
        try:
            conn.sendall(_VALIDATE + struct.pack("=BI", _PING, nonce))
            reply = b""
            while len(reply) < 4:
                chunk = conn.recv(4 - len(reply))
                if not chunk:
                    break
                reply += chunk
        except OSError:
            return "other"
    return "store" if reply == struct.pack("=I", nonce) else "other"


def port_holder(port: int, proc: Path = Path("/proc")) -> str | None:
    """``process PID (command line)`` of a process on this machine listening on TCP ``port`` (None where none is
    found: another machine's, another user's without the right to read it, or no ``/proc``)."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            rows = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()  # sl, local address (hex IP:port), remote, st, ..., uid, timeout, inode
            if len(fields) > 9 and fields[3] == _LISTEN and int(fields[1].rpartition(":")[2], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    for fd_dir in proc.glob("[0-9]*/fd") if inodes else ():
        try:
            if any(os.readlink(fd) in inodes for fd in fd_dir.iterdir()):
                pid = fd_dir.parent.name
                command = (fd_dir.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                return f"process {pid} ({one_line(command.strip()[:120])})"
        except OSError:
            continue
    return None


def _bind_error(port: int) -> OSError | None:
    """The error binding ``port`` on every address of this machine gives (None: free), as node rank 0's TCPStore
    binds it (SO_REUSEADDR: a port left in TIME_WAIT by an earlier run is free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError as exc:
            return exc
    return None


def _is_here(host: str) -> bool:
    """Whether ``host`` is an address of this machine (a socket can be bound to it)."""
    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, kind, _, _, address in infos:
        with socket.socket(family, kind) as s:
            try:
                s.bind(address)
            except OSError:
                continue
            return True
    return False


def _held_by(port: int, host: str = "") -> str:
    """`` by process PID (command)`` where ``host`` (empty: every address) is this machine and a process here
    listens on ``port``; else empty."""
    holder = port_holder(port) if not host or _is_here(host) else None
    return f" by {holder}" if holder else ""


def in_use_error(endpoint: str, node_rank: int, detail: str = "") -> RunError:
    """The error of node rank 0 whose endpoint's port another program holds on this server."""
    port = parse_endpoint(endpoint)[1]
    return RunError(f"port {port} is already in use on this server{_held_by(port)}, so node rank {node_rank} could "
                    f"not host the rendezvous at {endpoint}{f': {detail}' if detail else ''}",
                    "choose a free port, the same --rdzv-endpoint HOST:PORT on every server (`ss -ltn` lists the "
                    "ports in use), or end what holds this one")


def check_endpoint(endpoint: str, node_rank: int, timeout_s: float = PROBE_S) -> None:
    """RunError when the rendezvous at ``endpoint`` cannot happen (module doc): on node rank 0, its port is taken
    here; on the others, a program that is not a rendezvous answers there. Nothing listening yet is fine: node rank
    0 may start later, and torchrun waits ``--rdzv-timeout`` for it."""
    host, port = parse_endpoint(endpoint)
    if node_rank == 0:
        found = _bind_error(port)
        if found is not None and found.errno == errno.EADDRINUSE:
            raise in_use_error(endpoint, node_rank)
        return
    if probe(host, port, timeout_s) == "other":
        here = _held_by(port, host)
        raise RunError(f"a program that is not a torch rendezvous listens at {endpoint}{here} (it took the "
                       f"connection and did not answer a rendezvous' ping within {timeout_s:g} s): node rank 0 "
                       f"cannot host the rendezvous on port {port}, and node rank {node_rank} would wait for it "
                       "for ever",
                       f"choose a free port on node rank 0's server (`ss -ltnp 'sport = :{port}'` there names the "
                       "program) and give every server's `planner run` the same --rdzv-endpoint HOST:PORT")

"""runner.rendezvous: the endpoint of a run on several servers is checked before torchrun starts."""

from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from planner.errors import RunError
from planner.runner.rendezvous import check_endpoint, port_holder, probe
from tests.test_runner import free_port


@contextmanager
def squatter() -> Iterator[int]:
    """A program that listens on a port and never answers (the connection waits in its backlog); its port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def test_probe_tells_a_rendezvous_from_another_program_and_from_nothing() -> None:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=5))
    assert probe("127.0.0.1", store.port, 2.0) == "store"
    store.set("k", "v")  # the probe left it serving
    assert store.get("k") == b"v"
    with squatter() as port:
        assert probe("127.0.0.1", port, 0.3) == "other"
    assert probe("127.0.0.1", free_port(), 0.3) == "none"


def test_port_holder_names_the_listening_process() -> None:
    with squatter() as port:
        holder = port_holder(port)
    assert holder is not None and holder.startswith(f"process {os.getpid()} (")
    assert port_holder(free_port()) is None


def test_node_rank_0_refuses_a_port_another_process_holds() -> None:
    with squatter() as port, pytest.raises(RunError) as err:
        check_endpoint(f"127.0.0.1:{port}", 0)
    assert err.value.cause.startswith(f"port {port} is already in use on this server by process {os.getpid()} (")
    assert "free port" in err.value.hint
    check_endpoint(f"127.0.0.1:{free_port()}", 0)


def test_another_node_refuses_an_endpoint_that_is_not_a_rendezvous() -> None:
    """torch's TCPStore client waits for such a program's answer for ever (--rdzv-timeout notwithstanding)."""
    with squatter() as port, pytest.raises(RunError) as err:
        check_endpoint(f"127.0.0.1:{port}", 1, 0.3)
    assert err.value.cause.startswith(f"a program that is not a torch rendezvous listens at 127.0.0.1:{port} by "
                                      f"process {os.getpid()} (")
    assert "node rank 1 would wait for it for ever" in err.value.cause
    assert f"sport = :{port}" in err.value.hint and "--rdzv-endpoint" in err.value.hint
    check_endpoint(f"127.0.0.1:{free_port()}", 1, 0.3)  # nothing yet: node rank 0 may start later

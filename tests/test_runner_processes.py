"""runner.processes: the workers' cause of failure, rendezvous failures, the process group killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from planner.errors import PlanError, RunError
from planner.runner.processes import (
    error_line,
    port_in_use,
    rendezvous_failure,
    wait_workers,
    worker_cause,
    write_error,
)


def test_worker_cause_reads_past_torchrun_summary(tmp_path: Path) -> None:
    log = "\n".join(["Traceback (most recent call last):", '  File "x.py", line 1', "RuntimeError: gloo connect failed",
                     "[0]:", "  time      : 2026", "  rank      : 1 (local_rank: 1)", "  exitcode  : 1 (pid: 42)",
                     "  error_file: <N/A>", "  traceback : To enable traceback see: https://pytorch.org/docs"])
    cause = worker_cause(tmp_path, log)
    assert cause.startswith("RuntimeError: gloo connect failed") and "exitcode  : 1" in cause
    killed = "\n".join(["[0]:", "  exitcode  : -9 (pid: 7)", "  error_file: <N/A>",
                        "  traceback : Signal 9 (SIGKILL) received by PID 7"])
    cause = worker_cause(tmp_path, killed)
    assert "exitcode  : -9" in cause and "SIGKILL" in cause


def test_worker_cause_prefers_the_first_ranks_own_message(tmp_path: Path) -> None:
    (tmp_path / "error-rank3.txt").write_text("ValueError: later")
    (tmp_path / "error-rank1.txt").write_text("ValueError: first")
    assert worker_cause(tmp_path, "RuntimeError: other") == "rank 1: ValueError: first"


def test_worker_cause_is_the_rank_that_failed_first_not_its_peers(tmp_path: Path) -> None:
    """Rank 0's broken-connection error follows rank 1's own failure: the earlier one is the cause."""
    (tmp_path / "error-rank0.txt").write_text("1000.5\nRuntimeError: Connection closed by peer")
    (tmp_path / "error-rank1.txt").write_text("1000.2\nValueError: boom")
    assert worker_cause(tmp_path, "") == "rank 1: ValueError: boom"


def test_worker_cause_skips_an_error_file_left_empty(tmp_path: Path) -> None:
    (tmp_path / "error-rank0.txt").write_text("")
    (tmp_path / "error-rank2.txt").write_text("5.0\nValueError: real")
    assert worker_cause(tmp_path, "") == "rank 2: ValueError: real"
    (tmp_path / "error-rank2.txt").write_text("")
    assert worker_cause(tmp_path, "RuntimeError: from the log") == "RuntimeError: from the log"


def test_write_error_leaves_one_whole_file(tmp_path: Path) -> None:
    write_error(tmp_path, "3", "ValueError: x")
    assert [p.name for p in tmp_path.iterdir()] == ["error-rank3.txt"]
    assert worker_cause(tmp_path, "") == "rank 3: ValueError: x"


def test_rendezvous_failure_lines() -> None:
    text = "starting\ntorch.distributed.DistNetworkError: The client socket has timed out after 3000ms while trying " \
           "to connect to (127.0.0.1, 1234).\n"
    assert rendezvous_failure(text) is not None and "trying to connect" in str(rendezvous_failure(text))
    assert rendezvous_failure("RuntimeError: boom") is None


def test_rendezvous_failure_is_the_exception_not_a_cpp_frame_that_names_it() -> None:
    """A node rank 1 whose endpoint answered and hung up: torch prints its C++ stack (whose frames name
    DistNetworkError) before the Python exception; `planner run` quoted ``frame #2: c10::DistNetworkError::...``."""
    text = ("[W1128 TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl(fd=3): Connection reset by peer\n"
            "Exception raised from recvBytes at torch/csrc/distributed/c10d/Utils.hpp:784 (most recent call first):\n"
            "frame #2: c10::DistNetworkError::DistNetworkError(c10::SourceLocation, std::string) + 0x72\n"
            "    self._store = TCPStore(  # type: ignore[call-arg]\n"
            "torch.distributed.DistNetworkError: Connection reset by peer\n")
    assert rendezvous_failure(text) == "torch.distributed.DistNetworkError: Connection reset by peer"
    in_use = ("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
              "address. port: 29556, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use")
    assert port_in_use(str(rendezvous_failure(in_use))) and not port_in_use(str(rendezvous_failure(text)))


def _parent_of_a_sleeper(tmp_path: Path, child: str, session: bool) -> tuple[str, Path]:
    """A parent's code that starts ``child`` (in a session of its own where ``session``), writes its pid, sleeps."""
    pid_file = tmp_path / "child.pid"
    code = ("import subprocess, sys, time\n"
            f"p = subprocess.Popen([sys.executable, '-c', {child!r}], start_new_session={session})\n"
            f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
            "time.sleep(60)\n")
    return code, pid_file


def test_timeout_kills_the_whole_group(tmp_path: Path) -> None:
    """A parent that starts a child and both sleep: after the timeout neither is left."""
    code, pid_file = _parent_of_a_sleeper(tmp_path, "import time; time.sleep(60)", False)
    with pytest.raises(RunError, match="did not finish within 2 s"):
        wait_workers([sys.executable, "-c", code], dict(os.environ), tmp_path / "log", 2.0)
    assert not _alive(int(pid_file.read_text()))


def test_timeout_kills_a_worker_in_a_session_of_its_own_that_ignores_sigterm(tmp_path: Path) -> None:
    """torchrun starts each worker in a session of its own and waits 30 s for one to heed SIGTERM: a launcher
    killed before that left such a worker training on, orphaned (seen with a model factory that ignored
    SIGTERM). Every worker's group is signalled, SIGKILL after the wait, and none outlives the launcher."""
    worker = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    code, pid_file = _parent_of_a_sleeper(tmp_path, worker, True)
    with pytest.raises(RunError, match="did not finish within 2 s"):
        wait_workers([sys.executable, "-c", code], dict(os.environ), tmp_path / "log", 2.0)
    assert not _alive(int(pid_file.read_text()))


def test_a_timeout_says_what_the_workers_printed_before_the_kill_and_ends_at_once(tmp_path: Path) -> None:
    """The cause quotes the workers' own last lines, not the traceback of the SIGTERM that ended them; a
    launcher that exits on SIGTERM is reaped at once (its zombie kept its group alive: 10 s of each kill)."""
    code = "import sys, time; print('step 3 of 9', flush=True); time.sleep(60)"
    t0 = time.monotonic()
    with pytest.raises(RunError) as err:
        wait_workers([sys.executable, "-c", code], dict(os.environ), tmp_path / "log", 2.0)
    assert err.value.cause == "the workers did not finish within 2 s (their last output: step 3 of 9)"
    assert "--timeout" in err.value.hint and time.monotonic() - t0 < 4.5
    with pytest.raises(RunError, match=r"within 1\.5 s \(they printed nothing\)"):
        wait_workers([sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ), tmp_path / "l2", 1.5)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    out = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True).stdout.strip()
    return bool(out) and not out.startswith("Z")


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_a_terminated_launcher_kills_the_whole_group(tmp_path: Path, sig: str) -> None:
    """`kill`, `timeout` or a closed terminal ends `planner run`: its workers (their own group) end with it, not
    orphaned training on; the launcher reports the signal."""
    pid_file = tmp_path / "child.pid"
    worker = ("import subprocess, sys, time\n"
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
              f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
              "time.sleep(60)\n")
    # The signal's default action, as a terminal gives it: a suite started under nohup passes SIGHUP on ignored,
    # which the launcher rightly keeps (signals_interrupt), and it then never ended.
    launcher = ("import os, signal, sys\n"
                f"signal.signal(signal.{sig}, signal.SIG_DFL)\n"
                "from pathlib import Path\n"
                "from planner.runner.processes import Terminated, wait_workers\n"
                "try:\n"
                f"    wait_workers([sys.executable, '-c', {worker!r}], dict(os.environ),\n"
                f"                 Path({str(tmp_path)!r}) / 'log', 60.0)\n"
                "except Terminated as exc:\n"
                "    sys.exit(128 + exc.signum)\n")
    proc = subprocess.Popen([sys.executable, "-c", launcher], cwd=Path(__file__).resolve().parents[1])
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(getattr(signal, sig))
    assert proc.wait(timeout=30) == 128 + getattr(signal, sig)
    assert not _alive(int(pid_file.read_text()))


def test_error_line_reads_past_a_blank_first_line_to_the_wrapped_cause(tmp_path: Path) -> None:
    """torch's pipelining raises ``RuntimeError("\\n  Failed to run stage backward: ...")`` from the stage's own error:
    the worker records a line that says both, not a bare "RuntimeError:" (as `planner run` printed it)."""
    try:
        try:
            raise ValueError("Recomputed values have different metadata\ntensor at position 0")
        except ValueError as inner:
            raise RuntimeError("\n        Failed to run stage backward:\n        Stage output: Tensor") from inner
    except RuntimeError as exc:
        line = error_line(exc)
    assert line == ("RuntimeError: Failed to run stage backward: (caused by ValueError: Recomputed values have "
                    "different metadata)")
    assert error_line(RuntimeError()) == "RuntimeError"
    assert error_line(PlanError("stage 0 is wrong\nmore", "fix it")) == "stage 0 is wrong"
    write_error(tmp_path, "1", line)
    assert worker_cause(tmp_path, "") == f"rank 1: {line}"


_KILLED = """[W1128 17:29:08] Sending process 32058 closing signal SIGTERM
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
=======================================================
planner.runner.worker FAILED
-------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-28_17:29:08
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 32058)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 32058
-------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-28_17:29:08
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 32059)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 32059
=======================================================
"""


def test_a_worker_killed_without_a_message_is_named_with_the_likely_cause(tmp_path: Path) -> None:
    """A worker killed by SIGKILL (the out-of-memory killer) writes no error file: the cause read
    "ChildFailedError:; exitcode  : -9 (pid: 32059)  (SIGKILL)", naming neither the rank nor why."""
    from planner.runner.processes import worker_cause

    cause = worker_cause(tmp_path, _KILLED)
    assert cause.startswith("rank 1 (local rank: 1) on localhost (pid 32059) was killed by SIGKILL (exit code -9)")
    assert "out-of-memory killer" in cause and "ChildFailedError" not in cause
    ended = _KILLED.replace("-9 (pid: 32059)  (SIGKILL)", "3 (pid: 32059)")
    assert worker_cause(tmp_path, ended) == "rank 1 (local rank: 1) on localhost (pid 32059) ended with exit code 3 " \
                                            "without a message"
    (tmp_path / "error-rank1.txt").write_text("1.5\nValueError: boom")
    assert worker_cause(tmp_path, _KILLED) == "rank 1: ValueError: boom"  # a worker's own message comes first

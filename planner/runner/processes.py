"""The launcher's processes: torchrun in its own process group, killed however the run ends.

torchrun runs in a process group of its own (``start_new_session``) and starts each worker in
another; on success, error, timeout, interrupt, SIGTERM or SIGHUP torchrun's group and every
worker's get SIGTERM, then SIGKILL, so no worker outlives ``planner run``. When the run fails,
the cause is the worker's own message (each worker writes ``error-rank<N>.txt`` before it exits),
else the last error line of the output, or the rendezvous failure torchrun reports.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from planner.errors import PlannerError, RunError


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP while the workers run: an interrupt, so that ``finally`` kills their group (``signum``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated(signum)


@contextmanager
def signals_interrupt() -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP (``kill``, ``timeout``, a job scheduler, a closed terminal) raise
    :class:`Terminated` where their default action would end this process at once and leave torchrun and its
    workers (their own process group) training on, orphaned. Signals set to another handler or ignored (nohup)
    keep it; outside the main thread nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}
    for sig, handler in previous.items():
        if handler == signal.SIG_DFL:
            signal.signal(sig, _raise_terminated)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def wait_workers(cmd: list[str], env: dict[str, str], log_path: Path, timeout_s: float) -> int:
    """Run ``cmd`` in its own process group, output to ``log_path``; the group is killed however it ends
    (SIGTERM and SIGHUP included: :func:`signals_interrupt`)."""
    with open(log_path, "wb") as out, signals_interrupt():
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            said = last_lines(log_path)  # before the kill, whose own tracebacks would say nothing of the run
            kill_group(proc)
            said = "they printed nothing" if said == "no output" else f"their last output: {said}"
            raise RunError(f"the workers did not finish within {timeout_s:g} s ({said})",
                           "use fewer --steps or a smaller model, or raise --timeout") from None
        finally:
            kill_group(proc)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Terminate the workers' process groups (torchrun's and every worker's), then make sure."""
    groups = _groups(proc)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [g for g in groups if _signal_group(g, sig)]
        if not alive or _groups_gone(alive, 5.0, proc):
            break
    if proc.poll() is None:
        proc.wait()


def _groups(proc: subprocess.Popen[bytes]) -> list[int]:
    """torchrun's process group and, while it runs, its children's: torchrun starts each worker in a session
    of its own, so signalling torchrun's group alone reached them only through torchrun, which waits 30 s
    for a worker to heed SIGTERM; killed before that, it left them running."""
    try:
        own = os.getpgid(proc.pid)
    except ProcessLookupError:
        own = proc.pid
    children = _child_groups(proc.pid) if proc.poll() is None else set()
    return [own, *sorted(children - {own})]


def _child_groups(pid: int) -> set[int]:
    """The process groups of ``pid``'s children, read from ``/proc`` (none where there is no ``/proc``)."""
    groups = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()  # after "pid (comm)": state, ppid, pgrp, ...
        except OSError:
            continue
        if len(fields) > 2 and fields[1] == str(pid):
            groups.add(int(fields[2]))
    return groups


def _signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to the process group ``pgid``; whether it still had a process to send it to."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _groups_gone(groups: list[int], wait_s: float, leader: subprocess.Popen[bytes]) -> bool:
    """Whether the process groups are empty within ``wait_s`` seconds. torchrun (``leader``, this process's
    child) is reaped as it ends: a zombie is still a member of its group, and waiting on it took the whole
    ``wait_s`` after each signal (10 s of every timeout and Ctrl-C)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        leader.poll()
        if not any(_signal_group(g, 0) for g in groups):
            return True
        time.sleep(0.05)
    return False


def last_lines(path: Path, n: int = 3) -> str:
    """The last ``n`` non-empty lines of a log, joined by `` | ``."""
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no output"
    return " | ".join(lines[-n:]) if lines else "no output"


_TORCHRUN_SUMMARY = ("error_file", "time ", "time:", "host ", "host:", "rank ", "rank:", "traceback :", "traceback:",
                     "root cause", "failures:", "[")

# what torchrun's static rendezvous (a TCPStore at the endpoint) says when the servers do not meet
_RENDEZVOUS_FAILURES = ("waiting for clients", "trying to connect", "RendezvousTimeoutError",
                        "RendezvousConnectionError", "DistNetworkError", "DistStoreError")


# a line of a C++ stack torch prints beside its exception (it names the error's class, not what went wrong)
_STACK_LINES = ("frame #", "Exception raised from")
_EXCEPTION_LINE = re.compile(r"[\w.]*(Error|Exception): ")


def rendezvous_failure(text: str) -> str | None:
    """torchrun's line saying that the rendezvous failed, if it did: the Python exception's where there is one
    (``torch.distributed.DistNetworkError: Connection reset by peer``), not a C++ stack frame that names it."""
    lines = [ln.strip() for ln in text.splitlines()
             if any(key in ln for key in _RENDEZVOUS_FAILURES) and not ln.strip().startswith(_STACK_LINES)]
    return next((ln for ln in lines if _EXCEPTION_LINE.match(ln)), lines[0] if lines else None)


def port_in_use(line: str) -> bool:
    """Whether a rendezvous failure says that the endpoint's port is taken on this server."""
    return "EADDRINUSE" in line or "address already in use" in line.lower()


def _first_line(exc: BaseException) -> str:
    """``Type: first non-blank line of its message`` (torch's messages may open with a newline)."""
    text = exc.cause if isinstance(exc, PlannerError) else str(exc)
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if isinstance(exc, PlannerError):
        return line
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__


def error_line(exc: BaseException) -> str:
    """One line for a failing worker's exception: its first non-blank line, and where it wraps another (``raise ...
    from``, as torch's pipelining wraps a stage's backward error), the innermost one's, which says what went wrong."""
    root = exc
    while root.__cause__ is not None and root.__cause__ is not root:
        root = root.__cause__
    line = _first_line(exc)
    return line if root is exc else f"{line} (caused by {_first_line(root)})"


def write_error(out: Path, rank: str, cause: str) -> None:
    """Record a failing worker's cause in ``out/error-rank<rank>.txt``: when it failed, then the message.

    Written whole or not at all (a temporary file renamed), so a worker killed while writing
    leaves no empty file behind; the time lets the reader pick the failure that came first.
    """
    tmp = out / f".error-rank{rank}.{os.getpid()}"
    tmp.write_text(f"{time.time():.6f}\n{cause}")
    os.replace(tmp, out / f"error-rank{rank}.txt")


def _recorded_errors(tmp: Path) -> list[tuple[float, int, str]]:
    """(time, rank, message) of each worker's error file; files without a time sort last."""
    found = []
    for path in tmp.glob("error-rank*.txt"):
        rank_text = path.stem.split("rank")[1]
        head, _, rest = path.read_text(errors="replace").partition("\n")
        try:
            when, message = float(head), rest.strip()
        except ValueError:
            when, message = float("inf"), f"{head}\n{rest}".strip()
        if message and rank_text.isdigit():
            found.append((when, int(rank_text), message))
    return sorted(found)


_ROOT_FIELD = re.compile(r"^\s*(rank|host|exitcode)\s*:\s*(.*)$")
_EXIT = re.compile(r"(-?\d+) \(pid: (\d+)\)(?:\s+\((SIG\w+)\))?")


def root_cause(text: str) -> str | None:
    """What torchrun's summary says of the worker that failed first ("Root Cause"), where it left no message of its
    own (killed by a signal, or ended with an exit code before Python could write one): which rank, where, how."""
    _, found, block = text.partition("Root Cause")
    if not found:
        return None
    fields: dict[str, str] = {}
    for line in block.splitlines()[1:]:
        if line.startswith("="):
            break
        match = _ROOT_FIELD.match(line)
        if match:
            fields.setdefault(match.group(1), match.group(2).strip())
    code = _EXIT.match(fields.get("exitcode", ""))
    if code is None:
        return None
    rank, host = fields.get("rank", "?").replace("local_rank", "local rank"), fields.get("host", "?")
    who = f"rank {rank} on {host} (pid {code.group(2)})"
    if code.group(3) is None:
        return f"{who} ended with exit code {code.group(1)} without a message"
    killed = f"{who} was killed by {code.group(3)} (exit code {code.group(1)}) without a message"
    if code.group(3) == "SIGKILL":
        return (f"{killed}: the kernel's out-of-memory killer ends a process so (`dmesg` or `journalctl -k` says "
                "so), else a job scheduler or another program did; a plan whose processes build or train beyond "
                "the host's memory needs a smaller batch, more stages or more servers")
    return killed


def worker_cause(tmp: Path, text: str) -> str:
    """The message of the rank that failed first (its peers' errors follow from it); else what torchrun says of it
    (:func:`root_cause`); else the workers' last error line and torchrun's exit code."""
    errors = _recorded_errors(tmp)
    if errors:
        _, rank, message = errors[0]
        return f"rank {rank}: {message}"
    summary = root_cause(text)
    if summary is not None:
        return summary
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    exit_line = next((ln for ln in reversed(lines) if ln.startswith("exitcode")), "")
    signal_line = next((ln for ln in reversed(lines) if "Signal" in ln or "signal" in ln), "")
    for ln in reversed(lines):
        if ("Error" in ln or "error" in ln) and not ln.startswith(("File ", *_TORCHRUN_SUMMARY)):
            return "; ".join(filter(None, [ln, exit_line]))
    found = "; ".join(filter(None, [exit_line, signal_line]))
    return found or (lines[-1] if lines else "no output")

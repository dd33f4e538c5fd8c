"""The launcher's processes: torchrun in its own process group, killed however the run ends.

torchrun and every worker share one process group (``start_new_session``); on success,
error, timeout, interrupt, SIGTERM or SIGHUP the whole group gets SIGTERM, then SIGKILL, so no worker
outlives ``planner run``. When the run fails, the cause is the worker's own message (each
worker writes ``error-rank<N>.txt`` before it exits), else the last error line of the
output, or the rendezvous failure torchrun reports.
"""

from __future__ import annotations

import os
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
            kill_group(proc)
            raise RunError(f"the workers did not finish within {timeout_s:.0f} s "
                           f"({last_lines(log_path)})", "use fewer --steps or a smaller model") from None
        finally:
            kill_group(proc)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Terminate the workers' process group (torchrun and every worker), then make sure."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = proc.pid
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            break
        if _group_gone(pgid, 5.0):
            break
    if proc.poll() is None:
        proc.wait()


def _group_gone(pgid: int, wait_s: float) -> bool:
    """Whether the process group ``pgid`` is empty within ``wait_s`` seconds."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
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


def rendezvous_failure(text: str) -> str | None:
    """torchrun's line saying that the rendezvous failed, if it did."""
    for ln in text.splitlines():
        if any(key in ln for key in _RENDEZVOUS_FAILURES):
            return ln.strip()
    return None


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


def worker_cause(tmp: Path, text: str) -> str:
    """The message of the rank that failed first (its peers' errors follow from it); else the
    workers' last error line and torchrun's exit code."""
    errors = _recorded_errors(tmp)
    if errors:
        _, rank, message = errors[0]
        return f"rank {rank}: {message}"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    exit_line = next((ln for ln in reversed(lines) if ln.startswith("exitcode")), "")
    signal_line = next((ln for ln in reversed(lines) if "Signal" in ln or "signal" in ln), "")
    for ln in reversed(lines):
        if ("Error" in ln or "error" in ln) and not ln.startswith(("File ", *_TORCHRUN_SUMMARY)):
            return "; ".join(filter(None, [ln, exit_line]))
    found = "; ".join(filter(None, [exit_line, signal_line]))
    return found or (lines[-1] if lines else "no output")

"""Every process builds the whole model and keeps its own stages' weights: in turns per server, within its memory.

Every rank of a plan builds the whole model from the same seed, so that the weights of its stages are exactly
those of one process building the model (which ``planner run --check`` trains as the reference), then splits it
into the profiled layers. Left at that, every process of a server would hold the whole model in fp32 on the host
for the whole run: an 8B model is 32 GB, 256 GB for the 8 processes of an 8-GPU server. Two things bound it:

* :func:`release_others` frees the storage of every weight and buffer of the layers this rank does not run
  (:func:`kept_layers`: its stages' layers, and every layer of a tie group one of them belongs to, which
  DeepSpeed builds as one module on each stage holding a member). The layers keep their structure, shapes and
  parameter objects (ties are found by identity, and every rank must find the same), as FSDP frees a sharded
  parameter's storage (``untyped_storage().resize_(0)``);
* :func:`build_turn` lets at most :func:`build_slots` processes of one server build at a time (a lock file per
  slot, per job, in the temporary folder), so that a server's peak is about ``slots`` whole models plus every
  other process's own stages, not ``processes`` whole models. Slots: as many whole fp32 models as fit in half the
  host's memory (:data:`HOST_SHARE`; a cgroup's limit counts), at least one, at most the server's processes; a
  model that fits many times over is built by all at once, as before. Where they take turns, each process then
  waits for the server's others to have built before it goes on to the engine's collectives. That wait is
  bounded without cutting a long build short: it fails (:class:`~planner.errors.RunError`, naming the local ranks
  missing and the count file) once :data:`STALL_S` seconds pass in which no build turn is held (the kernel drops
  the lock of a process that ended, so a held turn is a living build) and no build is counted: a process that
  ended before its build, or a launcher whose ``LOCAL_WORLD_SIZE`` counts processes it did not start, would
  otherwise keep every other waiting for ever.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from torch import nn

from planner import ir
from planner.errors import RunError
from planner.export.nodes import rank_chunks
from planner.export.ties import find_ties, tie_groups

HOST_SHARE = 0.5
"""The share of the host's memory the whole models built at once may take (the rest: the stages kept, the
engine, the data, the operating system)."""
FP32_BYTES = 4
STALL_S = 300.0
"""How long a process waits for its server's others to build while none holds a build turn and no build is
counted: the time a living process may take to reach its build after joining the process group (imports,
another engine's set-up), far above seconds; a build that holds its turn for an hour does not count against it."""


def kept_layers(layers: Sequence[nn.Module], plan: ir.Plan, rank: int) -> frozenset[int]:
    """The layers global ``rank`` keeps: those of its stages (chunks), and every member of a tie group that one
    of them belongs to (planner.export.ties.tie_groups)."""
    own = {i for st in rank_chunks(plan, rank) for i in range(*st.layers)}
    for members, _ in tie_groups(find_ties(layers)):
        if own.intersection(members):
            own.update(members)
    return frozenset(own)


def release_others(layers: Sequence[nn.Module], plan: ir.Plan, rank: int) -> int:
    """Free the weights and buffers of the layers ``rank`` does not keep (:func:`kept_layers`), except those
    whose storage a kept layer uses too; returns the bytes freed. The layers stay, shapes and all; computing with
    a released one is an error."""
    keep = kept_layers(layers, plan, rank)
    used = {_storage_key(t) for i in keep for t in _tensors(layers[i])}
    freed = 0
    for i, layer in enumerate(layers):
        if i in keep:
            continue
        for t in _tensors(layer):
            storage = t.untyped_storage()
            key = _storage_key(t)
            if key in used or storage.nbytes() == 0:
                continue
            freed += storage.nbytes()
            storage.resize_(0)
            used.add(key)  # a storage two released layers share is freed once
    return freed


def released_layers(layers: Sequence[nn.Module]) -> list[int]:
    """The layers whose weights or buffers :func:`release_others` freed (read back from their storage: a tensor of
    elements without bytes); a sharded or tensor-parallel parameter (a DTensor) counts as held."""
    out = []
    for i, layer in enumerate(layers):
        for t in _tensors(layer):
            try:
                if t.numel() and not t.untyped_storage().nbytes():
                    out.append(i)
                    break
            except (RuntimeError, NotImplementedError):  # a tensor subclass without one storage
                continue
    return out


def _tensors(layer: nn.Module) -> list[torch.Tensor]:
    """The layer's parameters and buffers held in memory (not on the meta device)."""
    found = [*layer.parameters(), *layer.buffers()]
    return [t for t in found if t.device.type != "meta"]


def _storage_key(t: torch.Tensor) -> tuple[str, int]:
    return t.device.type, t.untyped_storage().data_ptr()


def build_slots(model_bytes: int, local_processes: int, host_bytes: int | None) -> int:
    """How many of a server's ``local_processes`` may build a model of ``model_bytes`` at once: as many as fit in
    :data:`HOST_SHARE` of ``host_bytes`` (all of them where the host's memory is unknown), at least one."""
    if host_bytes is None or model_bytes <= 0:
        return max(1, local_processes)
    fit = int(HOST_SHARE * host_bytes // model_bytes)
    return max(1, min(local_processes, fit))


def model_build_bytes(plan: ir.Plan) -> int:
    """The bytes one whole build of the plan's model takes: its parameters in fp32 (as a model is built) or in
    the profile's bytes where larger."""
    profile = plan.profile
    return max(profile.param_bytes, FP32_BYTES * profile.param_count)


@contextlib.contextmanager
def build_turn(plan: ir.Plan, env: dict[str, str] | None = None, host_bytes: int | None = None,
               folder: str | None = None, poll_s: float = 0.2, stall_s: float = STALL_S) -> Iterator[None]:
    """Hold this process's turn to build the model (module doc): the lock of slot ``LOCAL_RANK % slots`` of this
    job (its ``MASTER_ADDR``/``MASTER_PORT`` and torchrun's run id). Where the server's processes take turns, each
    then waits until every one of them has built (a count in a file: :func:`_all_built`), so that none enters a
    collective while another still builds: a collective's timeout (NCCL's 10 minutes, gloo's 30) would otherwise
    run over the turns of a large model; RunError where ``stall_s`` pass with no turn held and no build counted
    (:func:`_all_built`). Without a launcher's environment, or where no lock file can be made, it does not wait."""
    env = dict(os.environ) if env is None else env
    local = _whole(env.get("LOCAL_WORLD_SIZE") or env.get("LOCAL_SIZE"))
    port = env.get("MASTER_PORT")
    slots = local or 1
    if local is not None and local > 1 and port:
        from planner.runner.machine import machine_memory_bytes  # planner.runner imports the exports

        host = machine_memory_bytes() if host_bytes is None else host_bytes
        slots = build_slots(model_build_bytes(plan), local, host)
    if local is None or slots >= local:
        yield
        return
    job = _safe(f"{_user()}-{env.get('MASTER_ADDR', 'local')}-{port}-{env.get('TORCHELASTIC_RUN_ID', '')}")
    local_rank = _whole(env.get("LOCAL_RANK")) or 0
    slot = local_rank % slots
    base = Path(folder or tempfile.gettempdir())
    locks = [base / f"planner-build-{job}-{s}.lock" for s in range(slots)]
    try:
        handle = open(locks[slot], "a")  # noqa: SIM115 (held across the yield)
    except OSError:
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
    _all_built(base / f"planner-build-{job}.count", local, poll_s, local_rank, locks, stall_s)


_BUILDS: dict[tuple[Path, int], int] = {}
"""How many builds this process (per local rank: the tests' threads) has counted in each count file."""


def _all_built(path: Path, local: int, poll_s: float, local_rank: int = 0, locks: Sequence[Path] = (),
               stall_s: float = STALL_S) -> None:
    """Count this process's build in ``path`` (a line: its process id, local rank and build's number in this
    process) and wait until ``local`` living processes have counted that build (no wait where the file cannot be
    used). A job name comes back (the DeepSpeed launcher's port 29500 and no run id; torchrun's static rendezvous,
    run id ``none``; a restart; ``train_plan`` called again): the lines of processes that have ended, or of their
    earlier builds, do not count. RunError once ``stall_s`` pass in which none of ``locks`` (the build turns) is
    held and the count does not change: no living process is building, so the missing ones will not come."""
    n = _BUILDS.get((path, local_rank), 0) + 1
    _BUILDS[path, local_rank] = n
    try:
        with open(path, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.write(f"{os.getpid()} {local_rank} {n}\n")
        seen, since = -1, time.monotonic()
        while len(built := _counted(path.read_text(), n)) < local:
            if len(built) != seen or _any_held(locks):
                seen, since = len(built), time.monotonic()
            elif time.monotonic() - since > stall_s:
                raise _stalled(path, local, local_rank, built, stall_s)
            time.sleep(poll_s)
    except (OSError, ValueError):  # a file that cannot be read, or not as text: no wait
        return


def _counted(text: str, n: int) -> set[tuple[int, int]]:
    """The living processes (process id, local rank) that have counted their ``n``-th build in ``text``."""
    found = set()
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 3 and all(f.isascii() and f.isdigit() for f in fields) and fields[2] == str(n):
            found.add((int(fields[0]), int(fields[1])))
    return {(pid, rank) for pid, rank in found if pid > 0 and _alive(pid)}


def _any_held(locks: Sequence[Path]) -> bool:
    """Whether a living process holds one of the build turns' lock files (a lock that can be taken is free: the
    kernel drops the lock of a process that ended, however it ended)."""
    for lock in locks:
        try:
            with open(lock, "rb") as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return True
                fcntl.flock(f, fcntl.LOCK_UN)
        except OSError:  # never made, or removed: not held
            continue
    return False


def _stalled(path: Path, local: int, local_rank: int, built: set[tuple[int, int]], stall_s: float) -> RunError:
    """The error of a wait for builds that will not come: who has built, who has not, the file."""
    done = sorted({rank for _, rank in built})
    missing = [r for r in range(local) if r not in done]
    return RunError(
        f"local rank {local_rank} waited {stall_s:g} s for the other processes of this server to build the model "
        f"with none building: {len(built)} of {local} (LOCAL_WORLD_SIZE) have built (local ranks "
        f"{_ranks_text(done)}), local ranks {_ranks_text(missing)} have not (counted in {path})",
        "a process that ended before its build says why earlier in the launcher's output; if none ended, the "
        f"launcher started fewer processes on this server than LOCAL_WORLD_SIZE={local}: start the plan's "
        "processes per server (torchrun --nproc-per-node, or the exported launch_node<R>.sh)")


def _ranks_text(ranks: Sequence[int]) -> str:
    return ", ".join(map(str, ranks)) if ranks else "none"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _whole(text: str | None) -> int | None:
    return int(text) if text is not None and text.strip().isdigit() else None


def _safe(text: str) -> str:
    """``text`` as a file name: letters, digits, dots and dashes only."""
    return "".join(c if c.isalnum() or c in ".-" else "_" for c in text)[:120]


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())

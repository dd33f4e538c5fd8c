"""Pipeline schedules as small immutable values (pure; no torch, click or rich).

A schedule is, per device (pipeline rank), an ordered tuple of actions written
``<stage><F|B|W><microbatch>`` (``2F0``: stage 2, forward, micro-batch 0), after
torch.distributed.pipelining's text form. For ``interleaved`` the stage is the model chunk
(chunk ``c`` runs on device ``c mod K``). ``B`` is the whole backward, except under
``zb-h1`` where it is the input-gradient part only and ``W`` the weight-gradient part.

Generators (pure functions of K devices, M micro-batches and v chunks per device):

* ``gpipe``: all forwards, then all backwards (F-then-B; GPipe, Huang et al. 2019).
* ``1f1b``: PipeDream-Flush (Narayanan et al. 2021): device d warms up with K-d-1
  forwards, then alternates one forward and one backward, then drains.
* ``interleaved``: Megatron-LM's interleaved 1F1B (Narayanan et al. SC'21, section 2.2):
  forwards go in groups of K micro-batches through chunk 0, then chunk 1, ...; device d
  warms up with (K-d-1)*2 + (v-1)*K chunk-forwards. M need not be a multiple of K (the
  last group is shorter, and the warm-up grows by the fewest forwards that avoid a
  deadlock); :func:`validate` proves every generated schedule deadlock-free.
* ``pipedream``: asynchronous 1F1B with weight stashing and no flush (PipeDream, Narayanan
  et al. SOSP'19). It never drains, so the schedule covers ``blocks`` consecutive
  iterations of M micro-batches run back to back; the simulator measures the last one
  (the steady state).
* ``zb-h1``: zero-bubble H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism",
  section 3.1): 1F1B order for F and B, with device d deferring its weight-gradient
  passes ``W`` by d micro-batches, so the W passes fill the tail where 1F1B idles. Every
  device holds at most min(K, M) micro-batches' activations (1F1B's peak, on every stage).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from planner.errors import ScheduleError

SCHEDULES = ("gpipe", "1f1b", "interleaved", "pipedream", "zb-h1")

KINDS = ("F", "B", "W")  # forward, backward (input gradient alone when split), weight gradient

_ACTION_RE = re.compile(r"^(\d+)([FBW])(\d+)$")


class Action(NamedTuple):
    """One compute step: ``stage`` (model chunk), ``kind`` F/B/W, micro-batch ``mb``."""

    stage: int
    kind: str
    mb: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.mb}"

    @classmethod
    def parse(cls, text: str) -> Action:
        """Read the compact form ``2F0``."""
        m = _ACTION_RE.match(text.strip())
        if not m:
            raise ScheduleError(f"bad action {text!r}", "write actions as <stage><F|B|W><microbatch>, e.g. 2F0")
        return cls(int(m.group(1)), m.group(2), int(m.group(3)))


@dataclass(frozen=True)
class Schedule:
    """Per-device ordered actions of one pipeline schedule.

    ``devices`` = K pipeline ranks, ``virtual_stages`` = v chunks per device (so the model
    has K*v chunks), ``microbatches`` = M per iteration; ``total_microbatches`` is M times
    the number of iterations the schedule covers (more than M only for ``pipedream``).
    ``split_backward``: B is the input gradient only and W the weight gradient.
    """

    name: str
    devices: int
    microbatches: int
    virtual_stages: int
    actions: tuple[tuple[Action, ...], ...]
    split_backward: bool = False
    total_microbatches: int = 0  # 0: one iteration, M

    def __post_init__(self) -> None:
        if not self.total_microbatches:
            object.__setattr__(self, "total_microbatches", self.microbatches)

    @property
    def chunks(self) -> int:
        """Model chunks (pipeline stages in model order): K * v."""
        return self.devices * self.virtual_stages

    @property
    def blocks(self) -> int:
        """Iterations of M micro-batches the schedule covers."""
        return max(1, self.total_microbatches // self.microbatches)

    def text(self) -> list[list[str]]:
        """Per device, the compact action strings."""
        return [[str(a) for a in acts] for acts in self.actions]

    def table(self) -> str:
        """A text table of the schedule, one row per time slot and one column per device
        (torch.distributed.pipelining's ``_format_pipeline_order`` style): every action
        takes one slot and waits for its inputs, so the blanks are the bubbles."""
        slots = unit_slots(self)
        n_slots = 1 + max((s for dev in slots for s in dev), default=-1)
        grid = [["" for _ in range(self.devices)] for _ in range(n_slots)]
        for d, acts in enumerate(self.actions):
            for a, s in zip(acts, slots[d], strict=True):
                grid[s][d] = str(a)
        width = max([len(f"Dev {self.devices - 1}")] + [len(c) for row in grid for c in row])
        label_w = len(f"Step {n_slots - 1:02d}:")
        lines = [" " * label_w + " " + " ".join(f"Dev {d}".ljust(width) for d in range(self.devices))]
        for i, row in enumerate(grid):
            lines.append(f"Step {i:02d}:".ljust(label_w) + " " + " ".join(c.ljust(width) for c in row).rstrip())
        return "\n".join(lines)


# ----------------------------------------------------------------------------- generators


def _check_sizes(k: int, m: int, v: int = 1) -> None:
    for name, value in (("devices", k), ("microbatches", m), ("virtual_stages", v)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ScheduleError(f"{name} must be a positive integer, got {value!r}", f"fix {name}")


def _one_f_one_b_order(k: int, d: int, n: int, stage: int) -> list[Action]:
    warmup = min(k - d - 1, n)
    acts = [Action(stage, "F", i) for i in range(warmup)]
    for j in range(n - warmup):
        acts.append(Action(stage, "F", warmup + j))
        acts.append(Action(stage, "B", j))
    acts.extend(Action(stage, "B", j) for j in range(n - warmup, n))
    return acts


def gpipe(k: int, m: int) -> Schedule:
    """GPipe's F-then-B: every forward, then every backward, on each device."""
    _check_sizes(k, m)
    acts = tuple(tuple([Action(d, "F", i) for i in range(m)] + [Action(d, "B", i) for i in range(m)])
                 for d in range(k))
    return Schedule("gpipe", k, m, 1, acts, total_microbatches=m)


def one_f_one_b(k: int, m: int) -> Schedule:
    """PipeDream-Flush (1F1B): K-d-1 warm-up forwards on device d, then F/B pairs, then drain."""
    _check_sizes(k, m)
    acts = tuple(tuple(_one_f_one_b_order(k, d, m, d)) for d in range(k))
    return Schedule("1f1b", k, m, 1, acts, total_microbatches=m)


def pipedream(k: int, m: int, blocks: int | None = None) -> Schedule:
    """Asynchronous 1F1B (PipeDream): ``blocks`` iterations of M micro-batches back to back,
    no flush between them. Default blocks: enough for the warm-up to end (ceil(2K/M) + 2)."""
    _check_sizes(k, m)
    if blocks is None:
        blocks = -(-2 * k // m) + 2
    _check_sizes(k, m, blocks)
    n = m * blocks
    acts = tuple(tuple(_one_f_one_b_order(k, d, n, d)) for d in range(k))
    return Schedule("pipedream", k, m, 1, acts, total_microbatches=n)


def zb_h1(k: int, m: int) -> Schedule:
    """Zero-bubble H1: 1F1B's F/B order with B = input gradient; device d runs the weight
    gradient W of a micro-batch once d later backwards have been issued (W deferred by d),
    the rest at the end. W fills the tail bubbles of the last devices."""
    _check_sizes(k, m)
    out = []
    for d in range(k):
        acts: list[Action] = []
        pending: list[int] = []
        for a in _one_f_one_b_order(k, d, m, d):
            acts.append(a)
            if a.kind == "B":
                pending.append(a.mb)
                if len(pending) > d:
                    acts.append(Action(d, "W", pending.pop(0)))
        acts.extend(Action(d, "W", i) for i in pending)
        out.append(tuple(acts))
    return Schedule("zb-h1", k, m, 1, tuple(out), split_backward=True, total_microbatches=m)


def interleaved(k: int, m: int, v: int) -> Schedule:
    """Megatron-LM interleaved 1F1B with v model chunks per device (chunk c on device c mod K).

    Forward order on every device: micro-batches in groups of K, each group through chunk
    0, 1, ..., v-1; backward order the same with the chunks reversed. Device d warms up
    with (K-d-1)*2 + (v-1)*K chunk-forwards, then alternates one forward and one backward.
    With v = 1 this is exactly :func:`one_f_one_b`.
    """
    _check_sizes(k, m, v)
    if v == 1:
        sched = one_f_one_b(k, m)
        return Schedule("interleaved", k, m, 1, sched.actions, total_microbatches=m)
    return _build_interleaved(k, m, v, interleaved_extra_warmup(k, m, v))


def _build_interleaved(k: int, m: int, v: int, extra: int) -> Schedule:
    fwd: list[tuple[int, int]] = []
    bwd: list[tuple[int, int]] = []
    for g in range(0, m, k):
        group = range(g, min(g + k, m))
        for c in range(v):
            fwd.extend((c, i) for i in group)
        for c in reversed(range(v)):
            bwd.extend((c, i) for i in group)
    total = m * v
    out = []
    for d in range(k):
        warmup = min((k - d - 1) * 2 + (v - 1) * k + extra, total)
        acts = [Action(c * k + d, "F", i) for c, i in fwd[:warmup]]
        for j in range(total - warmup):
            c, i = fwd[warmup + j]
            acts.append(Action(c * k + d, "F", i))
            c, i = bwd[j]
            acts.append(Action(c * k + d, "B", i))
        acts.extend(Action(c * k + d, "B", i) for c, i in bwd[total - warmup:])
        out.append(tuple(acts))
    return Schedule("interleaved", k, m, v, tuple(out), total_microbatches=m)


@functools.lru_cache(maxsize=4096)
def interleaved_extra_warmup(k: int, m: int, v: int) -> int:
    """Extra warm-up forwards every device of the interleaved schedule needs beyond
    Megatron's count: 0 when M is a multiple of K, else the fewest that avoid a deadlock."""
    if v == 1 or m % k == 0:
        return 0

    def runs(extra: int) -> bool:
        try:
            unit_slots(_build_interleaved(k, m, v, extra))
        except ScheduleError:
            return False
        return True

    if runs(0):
        return 0
    # Binary search; ``hi`` always runs (extra = M*v is F-then-B), so the answer is valid
    # even if runnability were not monotone in the warm-up.
    lo, hi = 0, m * v
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if runs(mid):
            hi = mid
        else:
            lo = mid
    return hi


def make_schedule(name: str, devices: int, microbatches: int, virtual_stages: int = 1,
                  *, pipedream_blocks: int | None = None) -> Schedule:
    """The schedule ``name`` for K devices, M micro-batches and v chunks per device, validated."""
    if name not in SCHEDULES:
        raise ScheduleError(f"unknown schedule {name!r}", f"choose one of {', '.join(SCHEDULES)}")
    if name != "interleaved" and virtual_stages != 1:
        raise ScheduleError(f"schedule {name!r} runs one chunk per device, got virtual_stages={virtual_stages}",
                            "use --schedule interleaved for virtual stages")
    if name == "gpipe":
        sched = gpipe(devices, microbatches)
    elif name == "1f1b":
        sched = one_f_one_b(devices, microbatches)
    elif name == "interleaved":
        sched = interleaved(devices, microbatches, virtual_stages)
    elif name == "pipedream":
        sched = pipedream(devices, microbatches, pipedream_blocks)
    else:
        sched = zb_h1(devices, microbatches)
    validate(sched)
    return sched


def from_text(name: str, rows: Sequence[Iterable[str]], microbatches: int, virtual_stages: int = 1,
              split_backward: bool = False) -> Schedule:
    """A schedule from per-device action strings (``[["0F0", "0B0"], ...]``), validated."""
    acts = tuple(tuple(Action.parse(t) for t in row) for row in rows)
    sched = Schedule(name, len(acts), microbatches, virtual_stages, acts, split_backward,
                     total_microbatches=microbatches)
    validate(sched)
    return sched


# ----------------------------------------------------------------------------- validation


def dependencies(sched: Schedule, a: Action) -> list[Action]:
    """The actions ``a`` needs finished first (data dependencies, across devices too)."""
    last = sched.chunks - 1
    if a.kind == "F":
        return [] if a.stage == 0 else [Action(a.stage - 1, "F", a.mb)]
    if a.kind == "B":
        deps = [Action(a.stage, "F", a.mb)]
        if a.stage < last:
            deps.append(Action(a.stage + 1, "B", a.mb))
        return deps
    return [Action(a.stage, "B", a.mb)]


def validate(sched: Schedule) -> None:
    """Raise ScheduleError unless every action appears exactly once, on its chunk's device,
    and a run exists that meets every dependency (no deadlock); see :func:`unit_slots`."""
    k, n, chunks = sched.devices, sched.total_microbatches, sched.chunks
    if len(sched.actions) != k:
        raise ScheduleError(f"schedule has {len(sched.actions)} device rows, expected {k}", "one row per device")
    kinds = KINDS if sched.split_backward else KINDS[:2]
    seen: set[Action] = set()
    for d, acts in enumerate(sched.actions):
        for a in acts:
            if not (0 <= a.stage < chunks and a.kind in kinds and 0 <= a.mb < n):
                raise ScheduleError(f"device {d}: action {a} is out of range ({chunks} stages, {n} micro-batches, "
                                    f"kinds {'/'.join(kinds)})", "fix the schedule generator")
            if a.stage % k != d:
                raise ScheduleError(f"device {d}: action {a} belongs to device {a.stage % k}",
                                    "chunk c runs on device c mod K")
            if a in seen:
                raise ScheduleError(f"device {d}: action {a} appears twice", "each action runs exactly once")
            seen.add(a)
    expected = chunks * n * len(kinds)
    if len(seen) != expected:
        missing = next(Action(s, kind, i) for s in range(chunks) for kind in kinds for i in range(n)
                       if Action(s, kind, i) not in seen)
        raise ScheduleError(f"schedule misses action {missing} ({len(seen)} of {expected} actions)",
                            "each action runs exactly once")
    unit_slots(sched)


def unit_slots(sched: Schedule) -> list[list[int]]:
    """Play the schedule with every action one time slot and free communication.

    Returns each action's slot per device; raises ScheduleError on a deadlock (a device
    whose next action waits for one that can never run), naming the stuck actions.
    """
    n = sched.total_microbatches
    size = sched.chunks * n
    f_end = [-1] * size  # end slot of chunk c's forward of micro-batch mb at c * n + mb (-1: not yet)
    b_end = [-1] * size
    pos = [0] * sched.devices
    slots: list[list[int]] = [[] for _ in range(sched.devices)]
    free = [0] * sched.devices
    last = sched.chunks - 1
    remaining = sum(len(a) for a in sched.actions)
    while remaining:
        progressed = False
        for d, acts in enumerate(sched.actions):
            p = pos[d]
            start = free[d]
            row = slots[d]
            while p < len(acts):
                c, kind, mb = acts[p]
                i = c * n + mb
                if kind == "F":
                    t = f_end[i - n] if c else 0
                    if t < 0:
                        break
                else:
                    t = f_end[i] if kind == "B" else b_end[i]
                    if t < 0:
                        break
                    if kind == "B" and c < last:
                        t2 = b_end[i + n]
                        if t2 < 0:
                            break
                        t = max(t, t2)
                if t > start:
                    start = t
                row.append(start)
                start += 1
                if kind == "F":
                    f_end[i] = start
                elif kind == "B":
                    b_end[i] = start
                p += 1
                remaining -= 1
                progressed = True
            pos[d] = p
            free[d] = start
        if not progressed:
            stuck = [str(acts[pos[d]]) for d, acts in enumerate(sched.actions) if pos[d] < len(acts)]
            raise ScheduleError(f"schedule {sched.name!r} deadlocks: devices wait on {', '.join(stuck[:6])}",
                                "every dependency (F before B, upstream F, downstream B) must come first")
    return slots


# ----------------------------------------------------------------------------- closed forms


def in_flight_microbatches(schedule: str, stages: int, microbatches: int, stage: int, virtual_stages: int = 1) -> int:
    """Peak number of micro-batches whose activations stage ``stage`` holds at once.

    gpipe keeps all M (GPipe, Huang et al. 2019); 1f1b and pipedream keep at most K - s
    on stage s (PipeDream-Flush, Narayanan et al. 2021; pipedream never drains, so K - s
    even when M < K); zb-h1 holds a micro-batch's
    activations until its deferred W pass, min(K, M) on every stage (1F1B's peak, now on
    every stage; checked against the simulator); interleaved (Megatron, Narayanan et al.
    2021, section 2.2) counts chunk micro-batches on the device: device d warms up with
    (K - d - 1) * 2 + (v - 1) * K forwards (plus :func:`interleaved_extra_warmup` when M is
    not a multiple of K) plus the one in steady state (v = 1: 1f1b).
    """
    k, m, s, v = stages, microbatches, stage, virtual_stages
    if schedule == "gpipe":
        return m
    if schedule == "1f1b":
        return min(k - s, m)
    if schedule == "pipedream":
        return k - s
    if schedule == "zb-h1":
        return min(k, m)
    if schedule == "interleaved":
        device = s % k
        if v == 1:
            return min(k - device, m)
        extra = interleaved_extra_warmup(k, m, v)
        return min((k - device - 1) * 2 + (v - 1) * k + extra + 1, m * v)
    raise ScheduleError(f"unknown schedule {schedule!r}", f"choose one of {', '.join(SCHEDULES)}")

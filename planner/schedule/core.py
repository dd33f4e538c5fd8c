"""Schedule values: actions, per-device orders, validation (pure; no torch, click or rich).

A schedule is, per device (pipeline rank), an ordered tuple of actions written
``<stage><F|B|W><microbatch>`` (``2F0``: stage 2, forward, micro-batch 0), after
torch.distributed.pipelining's text form. For a schedule with virtual stages the stage is
the model chunk (chunk ``c`` runs on device ``c mod K``). ``B`` is the whole backward,
except when the schedule splits the weight gradient (``split_backward``): then ``B`` is
the input-gradient part only and ``W`` the weight-gradient part.

Owns :class:`Action`, :class:`Schedule`, :func:`from_text`, :func:`validate` (every action
once, on its chunk's device, no deadlock) and :func:`unit_slots`. The named schedules and
what each implies live in :mod:`planner.schedule.kinds`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from planner.errors import ScheduleError

if TYPE_CHECKING:
    from planner.schedule.kinds import ScheduleKind

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
    def kind(self) -> ScheduleKind | None:
        """The named kind this schedule was made as (None: a custom one from :func:`from_text`)."""
        from planner.schedule.kinds import find_kind

        return find_kind(self.name)

    @property
    def flushes(self) -> bool:
        """Whether every iteration drains (a custom schedule does; pipedream does not)."""
        kind = self.kind
        return kind is None or kind.flushes

    @property
    def stashes_weights(self) -> bool:
        """Whether a stage keeps a weight version per extra micro-batch in flight (pipedream)."""
        kind = self.kind
        return kind is not None and kind.stashes_weights

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
    whose next action waits for one that can never run), naming the stuck actions. The
    hot loop of every schedule's validation: flat lists, one helper call per device and
    round (:func:`_play_device`), none per action.
    """
    n = sched.total_microbatches
    f_end = [-1] * (sched.chunks * n)  # end slot of chunk c's forward of micro-batch mb at c * n + mb (-1: not yet)
    b_end = [-1] * (sched.chunks * n)
    pos = [0] * sched.devices
    slots: list[list[int]] = [[] for _ in range(sched.devices)]
    free = [0] * sched.devices
    remaining = sum(len(a) for a in sched.actions)
    while remaining:
        played = 0
        for d, acts in enumerate(sched.actions):
            p, free[d] = _play_device(acts, pos[d], free[d], slots[d], f_end, b_end, n, sched.chunks - 1)
            played += p - pos[d]
            pos[d] = p
        if not played:
            stuck = [str(acts[pos[d]]) for d, acts in enumerate(sched.actions) if pos[d] < len(acts)]
            raise ScheduleError(f"schedule {sched.name!r} deadlocks: devices wait on {', '.join(stuck[:6])}",
                                "every dependency (F before B, upstream F, downstream B) must come first")
        remaining -= played
    return slots


def _play_device(acts: Sequence[Action], p: int, start: int, row: list[int], f_end: list[int], b_end: list[int],
                 n: int, last: int) -> tuple[int, int]:
    """Run one device's actions from ``p`` until one waits on an action not yet played; each
    takes the slot after its dependencies and the device's previous action. Returns the next
    action's index and the device's next free slot."""
    while p < len(acts):
        c, kind, mb = acts[p]
        i = c * n + mb
        if kind == "F":
            t = f_end[i - n] if c else 0
        else:
            t = f_end[i] if kind == "B" else b_end[i]
            if kind == "B" and c < last and t >= 0:
                t = -1 if b_end[i + n] < 0 else max(t, b_end[i + n])
        if t < 0:
            break
        start = max(start, t)
        row.append(start)
        start += 1
        if kind == "F":
            f_end[i] = start
        elif kind == "B":
            b_end[i] = start
        p += 1
    return p, start

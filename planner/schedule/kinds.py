"""The named pipeline schedules as values: what each one is and implies (pure; numpy only).

A schedule kind (:class:`ScheduleKind`) is the one home of everything that differs between
schedules; code asks the kind (``schedule_kind(name).flushes``) and never compares names.
A kind carries:

* ``generator``: builds the per-device action order (:meth:`ScheduleKind.make`, validated);
* ``in_flight``: peak micro-batches whose activations stage s of K holds
  (:meth:`ScheduleKind.in_flight_microbatches`; memory in planner.costmodel, the stage DP,
  the simulator's check);
* ``flushes``: drains every iteration (False for pipedream: the simulator measures the
  steady state of back-to-back iterations, the analytic objective has no fill/drain term);
  :meth:`ScheduleKind.objective_weights` is (1, M-1) when it flushes, (0, M) when not
  (``T = a sum_s l_s + max_s(b busy_s + ar_s)``, planner.costmodel);
* ``stashes_weights``: keeps one weight version per extra micro-batch in flight
  (:meth:`ScheduleKind.stash_bytes`; PipeDream section 3.3);
* ``splits_weight_grad``: B is the input gradient and W the weight gradient;
* ``phased``: forwards and backwards run as separate phases (gpipe's F-then-B), so the
  analytic steady state streams them separately (:meth:`ScheduleKind.steady_busy`);
* ``takes_virtual_stages``: runs v > 1 model chunks per device;
* ``engines``: the engines that run it (DeepSpeed: 1f1b only; torch.distributed.pipelining
  and torchtitan: gpipe, 1f1b, interleaved, zb-h1), ``torch_class`` its
  torch.distributed.pipelining class and ``torch_stage_list`` whether that class takes the
  rank's stages as a list (the multi-stage schedules).

The generators (the per-device action orders) live in :mod:`planner.schedule.generators`.

What the cost model, the stage DP and the engines ask (one call each, no name test):

* memory of stage s (``costmodel.stage_peak_memory``, ``sp._fit_limits``):
  ``n = kind.in_flight_microbatches(K, M, s, v)``, plus ``kind.stash_bytes(n, weight_bytes)``
  (works on numpy arrays: zeros when the kind does not stash);
* the analytic objective (``costmodel.schedule_weights``): ``kind.objective_weights(M)``;
* the steady-state term (``costmodel.stage_terms``, ``sp._periods_and_terms``):
  ``kind.steady_busy(t_f, t_b, x, total_s=t_f + t_b as computed)``, floats or arrays;
* an engine's schedules (``engines.ENGINES``): :func:`schedules_for` (``deepspeed``,
  ``torch``, ``torchtitan``); the torch export's class: ``kind.torch_class``;
* a name from the user: :func:`schedule_kind` (ScheduleError listing the names), or
  :func:`find_kind` (None) to raise one's own error.

A new schedule is one generator and one :class:`ScheduleKind` entry in :data:`SCHEDULE_KINDS`
here (plus its tests); the CLI choices, the cost model, the search, the simulator and the
exports follow from its attributes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from planner.errors import ScheduleError
from planner.schedule.core import Schedule, validate
from planner.schedule.generators import gpipe, interleaved, interleaved_extra_warmup, one_f_one_b, pipedream, zb_h1

# ----------------------------------------------------------------------------- micro-batches in flight


def _all(k: int, m: int, s: int, v: int) -> int:
    """gpipe keeps all M (GPipe, Huang et al. 2019)."""
    return m


def _k_minus_s(k: int, m: int, s: int, v: int) -> int:
    """1f1b keeps at most K - s on stage s (PipeDream-Flush, Narayanan et al. 2021)."""
    return min(k - s, m)


def _k_minus_s_unflushed(k: int, m: int, s: int, v: int) -> int:
    """pipedream never drains, so K - s even when M < K."""
    return k - s


def _min_k_m(k: int, m: int, s: int, v: int) -> int:
    """zb-h1 holds a micro-batch's activations until its deferred W pass: min(K, M) on
    every stage (1F1B's peak, now on every stage; checked against the simulator)."""
    return min(k, m)


def _interleaved_in_flight(k: int, m: int, s: int, v: int) -> int:
    """Chunk micro-batches on the device (Megatron, Narayanan et al. 2021, section 2.2):
    device d warms up with (K - d - 1) * 2 + (v - 1) * K forwards (plus
    :func:`interleaved_extra_warmup` when M is not a multiple of K) plus the one in steady
    state (v = 1: 1f1b)."""
    device = s % k
    if v == 1:
        return min(k - device, m)
    extra = interleaved_extra_warmup(k, m, v)
    return min((k - device - 1) * 2 + (v - 1) * k + extra + 1, m * v)


# ----------------------------------------------------------------------------- the kinds

Generator = Callable[[int, int, int, "int | None"], Schedule]
"""(K devices, M micro-batches, v chunks per device, pipedream blocks or None) -> the schedule."""
InFlight = Callable[[int, int, int, int], int]
"""(K stages, M micro-batches, stage s, v) -> micro-batches whose activations stage s holds at its peak."""
Num = TypeVar("Num", int, float, np.ndarray)

ENGINES = ("deepspeed", "torch", "torchtitan")
"""The engines a kind may name in ``engines`` (planner.engines.ENGINES)."""

_TORCH = frozenset({"torch", "torchtitan"})


def torch_order_matches(microbatches: int, groups: int, v: int) -> bool:
    """Whether torch's ScheduleInterleaved1F1B runs M micro-batches on K ranks in the order of
    :func:`planner.schedule.interleaved` (Megatron's): torch cuts them into rounds of ``M // max(1, M // K)``, not
    K, and warms rank d up with ``(v - 1)`` rounds plus ``2 (K - 1 - d)`` forwards, then one forward and one
    backward a step (torch/distributed/pipelining/schedules.py: ``_get_warmup_ops``); where a round is not K
    (M above K and not a multiple of it: K = 3, M = 8 warms rank 0 up with 8 chunk forwards, Megatron with 7) it
    holds more micro-batches than the simulation."""
    m, k = microbatches, groups
    if v == 1:
        return True
    per_round = m // max(1, m // k)
    if min(per_round, m) != min(k, m):
        return False
    extra = interleaved_extra_warmup(k, m, v)
    return all(min((v - 1) * per_round + 2 * (k - 1 - d) + 1, m * v)
               == min((k - d - 1) * 2 + (v - 1) * k + extra + 1, m * v) for d in range(k))


@dataclass(frozen=True)
class ScheduleKind:
    """One named schedule and everything that follows from it (see the module doc)."""

    name: str
    generator: Generator = field(repr=False, compare=False)
    in_flight: InFlight = field(repr=False, compare=False)
    flushes: bool = True
    stashes_weights: bool = False
    splits_weight_grad: bool = False
    phased: bool = False
    takes_virtual_stages: bool = False
    engines: frozenset[str] = frozenset()
    torch_class: str | None = None
    torch_stage_list: bool = False
    torch_needs_full_pipeline: bool = False
    """torch's class refuses fewer micro-batches than stages (Schedule1F1B's M >= K check)."""
    torch_rounds: bool = False
    """torch's class runs the micro-batches in rounds of K and refuses M that is not a multiple of
    ``max(1, M // K)`` (torch/distributed/pipelining/schedules.py, the interleaved schedules' check)."""

    def torch_refusal(self, microbatches: int, groups: int, virtual_stages: int = 1) -> str | None:
        """Why torch's class refuses M micro-batches on K pipeline ranks (with ``virtual_stages`` chunks each), or
        runs them in another order than the simulator plays (:func:`torch_order_matches`), or None."""
        if self.torch_needs_full_pipeline and microbatches < groups:
            return (f"torch's {self.torch_class} needs at least as many micro-batches as stages: the plan has "
                    f"{microbatches} on {groups} stages (use --microbatches {groups} or more)")
        rounds = max(1, microbatches // groups)
        if self.torch_rounds and microbatches % rounds:
            return (f"torch's {self.torch_class} runs micro-batches in rounds and needs their number to be a "
                    f"multiple of the rounds ({rounds} for {microbatches} on {groups} pipeline ranks) (use "
                    f"--microbatches {groups}, {2 * groups} or another multiple of {groups})")
        if self.torch_rounds and not torch_order_matches(microbatches, groups, virtual_stages):
            return (f"torch's {self.torch_class} warms up in rounds of {microbatches // rounds} micro-batches, not "
                    f"{groups}: {microbatches} on {groups} pipeline ranks hold more in flight than the plan counts "
                    f"(use --microbatches {groups}, {2 * groups} or another multiple of {groups})")
        return None

    def engine_refusal(self, engine: str, microbatches: int, groups: int, virtual_stages: int = 1) -> str | None:
        """Why ``engine`` refuses M micro-batches on K pipeline ranks of this schedule, or None (only torch's
        classes refuse counts; :meth:`torch_refusal`)."""
        return self.torch_refusal(microbatches, groups, virtual_stages) if engine in _TORCH else None

    def most_stages(self, engine: str, microbatches: int) -> int | None:
        """The most pipeline ranks ``engine`` runs this schedule on with M micro-batches (None: no bound):
        M where torch's class needs a micro-batch per stage (Schedule1F1B)."""
        return microbatches if engine in _TORCH and self.torch_needs_full_pipeline else None

    def __post_init__(self) -> None:
        unknown = sorted(set(self.engines) - set(ENGINES))
        if unknown:
            raise ScheduleError(f"schedule {self.name!r} names unknown engines {unknown}", f"use {', '.join(ENGINES)}")
        if (self.torch_class is None) == bool(self.engines & _TORCH):
            raise ScheduleError(f"schedule {self.name!r}: torch_class {self.torch_class!r} with engines "
                                f"{sorted(self.engines)}",
                                "torch and torchtitan run exactly the kinds with a torch_class")

    def check_virtual_stages(self, virtual_stages: int) -> None:
        """ScheduleError unless the kind runs ``virtual_stages`` chunks per device."""
        if virtual_stages != 1 and not self.takes_virtual_stages:
            raise ScheduleError(f"schedule {self.name!r} runs one chunk per device, got "
                                f"virtual_stages={virtual_stages}",
                                f"use --schedule {' or '.join(virtual_stage_schedules())} for virtual stages")

    def make(self, devices: int, microbatches: int, virtual_stages: int = 1, *,
             blocks: int | None = None) -> Schedule:
        """The schedule for K devices, M micro-batches and v chunks per device, validated.
        ``blocks``: iterations a schedule that does not flush covers (None: enough to settle)."""
        self.check_virtual_stages(virtual_stages)
        sched = self.generator(devices, microbatches, virtual_stages, blocks)
        validate(sched)
        return sched

    def in_flight_microbatches(self, stages: int, microbatches: int, stage: int, virtual_stages: int = 1) -> int:
        """Peak number of micro-batches whose activations stage ``stage`` of K holds at once."""
        return self.in_flight(stages, microbatches, stage, virtual_stages)

    def objective_weights(self, microbatches: int) -> tuple[float, float]:
        """(a, b) of the analytic ``T = a * sum_s l_s + max_s(b * busy_s + ar_s)``: (1, M-1)
        for a flushing schedule (fill and drain once, the bottleneck runs the other M-1),
        (0, M) for one that does not (PipeDream's steady state)."""
        if self.flushes:
            return 1.0, float(microbatches - 1)
        return 0.0, float(microbatches)

    def stash_bytes(self, in_flight: int, weight_bytes: Num) -> Num:
        """Extra weight versions a stage keeps: one per extra micro-batch in flight when the
        kind stashes weights (PipeDream section 3.3), else 0 (``weight_bytes * 0``, so an
        array stays an array)."""
        if self.stashes_weights:
            return (in_flight - 1) * weight_bytes
        return weight_bytes * 0

    def steady_busy(self, forward_s: Num, backward_s: Num, recv_s: Num, total_s: Num | None = None) -> Num:
        """A stage's time per micro-batch in steady state, transfers overlapping compute:
        ``max(t_f, x) + max(t_b, x)`` when forwards and backwards run as separate phases
        (GPipe section 2.2), else ``max(t_f + t_b, x)``. ``total_s`` (t_f + t_b as the
        caller computed it) is used as given when not phased; floats or numpy arrays."""
        if self.phased:
            return np.maximum(forward_s, recv_s) + np.maximum(backward_s, recv_s)  # type: ignore[no-any-return]
        total = forward_s + backward_s if total_s is None else total_s
        return np.maximum(total, recv_s)  # type: ignore[no-any-return]

    def runs_on(self, engine: str) -> bool:
        """Whether ``engine`` (one of :data:`ENGINES`; ``any`` runs everything) runs this schedule."""
        return engine == "any" or engine in self.engines


SCHEDULE_KINDS: dict[str, ScheduleKind] = {kind.name: kind for kind in (
    ScheduleKind("gpipe", lambda k, m, v, blocks: gpipe(k, m), _all, phased=True, engines=_TORCH,
                 torch_class="ScheduleGPipe"),
    ScheduleKind("1f1b", lambda k, m, v, blocks: one_f_one_b(k, m), _k_minus_s,
                 engines=_TORCH | {"deepspeed"}, torch_class="Schedule1F1B", torch_needs_full_pipeline=True),
    ScheduleKind("interleaved", lambda k, m, v, blocks: interleaved(k, m, v), _interleaved_in_flight,
                 takes_virtual_stages=True, engines=_TORCH, torch_class="ScheduleInterleaved1F1B",
                 torch_stage_list=True, torch_rounds=True),
    ScheduleKind("pipedream", lambda k, m, v, blocks: pipedream(k, m, blocks), _k_minus_s_unflushed,
                 flushes=False, stashes_weights=True),
    ScheduleKind("zb-h1", lambda k, m, v, blocks: zb_h1(k, m), _min_k_m, splits_weight_grad=True,
                 engines=_TORCH, torch_class="ScheduleInterleavedZeroBubble", torch_stage_list=True,
                 torch_rounds=True),
)}
"""Every named schedule, in the order the CLI lists them."""

SCHEDULES = tuple(SCHEDULE_KINDS)
"""The schedule names (``--schedule`` choices)."""


def find_kind(name: str) -> ScheduleKind | None:
    """The kind named ``name``, or None (a custom schedule built with from_text under its own name)."""
    return SCHEDULE_KINDS.get(name)


def schedule_kind(name: str | ScheduleKind) -> ScheduleKind:
    """The kind named ``name`` (a kind passes through); ScheduleError listing the names otherwise."""
    if isinstance(name, ScheduleKind):
        return name
    kind = SCHEDULE_KINDS.get(name)
    if kind is None:
        raise ScheduleError(f"unknown schedule {name!r}", f"choose one of {', '.join(SCHEDULES)}")
    return kind


def schedules_for(engine: str) -> tuple[str, ...]:
    """The schedule names ``engine`` runs, in registry order (``any``: all)."""
    return tuple(name for name, kind in SCHEDULE_KINDS.items() if kind.runs_on(engine))


def virtual_stage_schedules() -> tuple[str, ...]:
    """The schedule names that take v > 1 chunks per device."""
    return tuple(name for name, kind in SCHEDULE_KINDS.items() if kind.takes_virtual_stages)


def make_schedule(name: str, devices: int, microbatches: int, virtual_stages: int = 1,
                  *, pipedream_blocks: int | None = None) -> Schedule:
    """The schedule ``name`` for K devices, M micro-batches and v chunks per device, validated
    (``pipedream_blocks``: the iterations a schedule that does not flush covers)."""
    return schedule_kind(name).make(devices, microbatches, virtual_stages, blocks=pipedream_blocks)


def in_flight_microbatches(schedule: str, stages: int, microbatches: int, stage: int, virtual_stages: int = 1) -> int:
    """Peak number of micro-batches whose activations stage ``stage`` holds at once
    (:meth:`ScheduleKind.in_flight_microbatches` of the kind named ``schedule``)."""
    return schedule_kind(schedule).in_flight_microbatches(stages, microbatches, stage, virtual_stages)

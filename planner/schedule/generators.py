"""The pipeline schedules' per-device action orders: pure functions of K devices, M micro-batches and v
chunks per device (no torch, click or rich); :mod:`planner.schedule.kinds` names them and says what each implies.

* ``gpipe``: all forwards, then all backwards (F-then-B; GPipe, Huang et al. 2019).
* ``1f1b``: PipeDream-Flush (Narayanan et al. 2021): device d warms up with K-d-1
  forwards, then alternates one forward and one backward, then drains.
* ``interleaved``: Megatron-LM's interleaved 1F1B (Narayanan et al. SC'21, section 2.2):
  forwards go in groups of K micro-batches through chunk 0, then chunk 1, ...; device d
  warms up with (K-d-1)*2 + (v-1)*K chunk-forwards. M need not be a multiple of K (the
  last group is shorter, and the warm-up grows by the fewest forwards that avoid a
  deadlock); :func:`planner.schedule.validate` proves every generated schedule deadlock-free.
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

from planner.errors import ScheduleError
from planner.schedule.core import Action, Schedule, unit_slots


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

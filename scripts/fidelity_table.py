"""The rows of scripts/validate_fidelity.py's table: a plan's prediction and measurement as values, and the table.

:class:`Timed` holds one plan's timed rounds; :class:`Row` one row of the table (prediction,
measurement, the machine's state), which says whether it is inside :data:`TARGET`;
:func:`print_fidelity` prints them with their counts.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics

TARGET = (0.9, 1.1)
DRIFT = 0.05
"""A row whose rounds ran at a machine speed more than this away from the speed at its profile ran on a
machine that changed speed."""


@dataclasses.dataclass(frozen=True)
class Timed:
    """One plan's rounds: seconds per step of each, the median cores other work used, and the speed
    probe that followed each round (seconds of the model's whole step on rank 0, in the workers'
    process; empty when not probed)."""

    times_s: tuple[float, ...]
    background: float
    probes_s: tuple[float, ...] = ()

    @property
    def measured_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def spread(self) -> float:
        """The slowest round over the fastest."""
        return max(self.times_s) / min(self.times_s)

    def at_profile_s(self, scale_s: float) -> float:
        """The median round taken at the profile's speed: each round's time times ``scale_s`` (the
        profile's probe in the workers' units) over its own probe (rounds timed with probes only)."""
        return statistics.median(t * scale_s / p for t, p in zip(self.times_s, self.probes_s, strict=True))

    def speed(self, scale_s: float) -> float:
        """The rounds' median probe over the profile's (``scale_s``, in the workers' units): above 1,
        the machine ran slower than at the profile (rounds timed with probes only)."""
        return statistics.median(self.probes_s) / scale_s


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of the table: a plan's prediction (with and without its engine's overheads), its
    measurement (as measured, and taken at the profile's speed), the cores other work used, the
    machine's speed during its rounds over that at the profile, the spread of its rounds and the
    group's attempt."""

    name: str
    engine: str
    world: int
    microbatches: int
    predicted_s: float
    bare_s: float
    measured_s: float
    at_profile_s: float
    background: float
    drift: float
    spread: float
    attempts: int

    @property
    def ratio(self) -> float:
        return self.measured_s / self.predicted_s

    @property
    def bare_ratio(self) -> float:
        return self.measured_s / self.bare_s

    @property
    def at_profile_ratio(self) -> float:
        return self.at_profile_s / self.predicted_s

    @property
    def inside(self) -> bool:
        return within(self.ratio)


def within(ratio: float) -> bool:
    """Whether a measured/predicted ratio is inside :data:`TARGET`."""
    return TARGET[0] <= ratio <= TARGET[1]


def print_fidelity(rows: list[Row], load: tuple[float, ...], args: argparse.Namespace) -> None:
    print(f"\nfidelity: 1F1B, one stage per process (1 thread), median of {args.repeats} rounds of {args.steps} "
          f"steps ({args.steps - 2} timed); load average before {load[0]:.1f}, now {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores")
    print(f"{'model':7} {'engine':10} {'P':>2} {'M':>2} {'predicted_s':>11} {'measured_s':>10} {'ratio':>6}  "
          f"{'bare_s':>8} {'ratio':>6} {'at_prof':>7} {'other':>5} {'speed':>5} {'spread':>6} {'tries':>5}  "
          f"target {TARGET[0]}..{TARGET[1]}")
    for r in rows:
        print(f"{r.name:7} {r.engine:10} {r.world:2d} {r.microbatches:2d} {r.predicted_s:11.4f} {r.measured_s:10.4f} "
              f"{r.ratio:6.3f}  {r.bare_s:8.4f} {r.bare_ratio:6.3f} {r.at_profile_ratio:7.3f} "
              f"{r.background:5.2f} {r.drift:5.3f} {r.spread:6.2f} {r.attempts:5d}  {'PASS' if r.inside else 'FAIL'}")
    if rows:
        steady = [r for r in rows if abs(r.drift - 1) <= DRIFT]
        print(f"{sum(r.inside for r in rows)} of {len(rows)} inside the target; median ratio "
              f"{statistics.median(r.ratio for r in rows):.3f} (bare: "
              f"{statistics.median(r.bare_ratio for r in rows):.3f}); on a steady machine (speed within "
              f"{DRIFT:.0%}): {sum(r.inside for r in steady)} of {len(steady)} inside; at the profile's speed: "
              f"{sum(within(r.at_profile_ratio) for r in rows)} of {len(rows)} inside, median "
              f"{statistics.median(r.at_profile_ratio for r in rows):.3f}")
    print("predicted: the plan's prediction with its engine's measured overheads; bare: the same plan without "
          "them (the cost model alone, the node's hand-off cost included); at_prof: measured over predicted with "
          "each round taken at the machine's speed when the profile was measured (the round's time times the "
          "speed probe at the profile over the probe right after the round: a diagnosis, not the target); other: "
          "cores other work on the machine used during the row's rounds (median); speed: the probes after the "
          "row's rounds over the probe at its profile (median; above 1: the machine ran slower); spread: the "
          "row's slowest round over its fastest; tries: the attempt shown, the steadiest of the group's (measured "
          f"again while a row's speed moved by more than {DRIFT:.0%})")

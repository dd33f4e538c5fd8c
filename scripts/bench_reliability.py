"""The hostile battery's counts: cases, clean errors, crashes, accepted-bad, rejected-good, files left, misleading.

Runs every case of tests/hostile.py through the CLI in process (a fresh folder each) and prints the
counts per verdict and per command, then the cases that are not clean. Targets: 0 crashes,
0 accepted-bad, 0 files left.

    python scripts/bench_reliability.py                 # this tree's planner
    python scripts/bench_reliability.py --planner /work/main   # another checkout's planner, same cases
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def load_hostile(planner_root: Path) -> ModuleType:
    """tests/hostile.py of this tree, running against the planner package under ``planner_root``."""
    sys.path[:0] = [str(planner_root), str(ROOT)]
    spec = importlib.util.spec_from_file_location("hostile", ROOT / "tests" / "hostile.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["hostile"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--planner", type=Path, default=ROOT, help="checkout whose planner package is tested")
    parser.add_argument("--skip-heavy", action="store_true", help="leave out the run and calibrate cases")
    parser.add_argument("--show", type=int, default=40, help="list at most this many cases that are not clean")
    args = parser.parse_args()
    hostile = load_hostile(args.planner.resolve())
    cases = hostile.all_cases()
    if args.planner.resolve() != ROOT:  # an unguarded reader would read a zero device forever: not on a shared box
        cases = [c for c in cases if c.id != "input-is-device"]
    if args.skip_heavy:  # where checks come late, run and calibrate train and measure for real
        cases = [c for c in cases if c.args[0] not in ("run", "calibrate")]
    t0 = time.perf_counter()
    outcomes = []
    for case in cases:
        with tempfile.TemporaryDirectory() as tmp:
            outcomes.append(hostile.run_case(case, Path(tmp)))
    elapsed = time.perf_counter() - t0
    verdicts = collections.Counter(o.verdict for o in outcomes)
    clean_errors = sum(1 for o in outcomes if o.verdict == "clean" and o.case.expect == "error")
    print(f"planner from {args.planner}: {len(cases)} cases in {elapsed:.1f} s")
    print(f"  clean: {verdicts['clean']} ({clean_errors} clean errors, {verdicts['clean'] - clean_errors} accepted "
          "good inputs)")
    for verdict in hostile.VERDICTS[1:]:
        print(f"  {verdict}: {verdicts[verdict]}")
    by_command: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for o in outcomes:
        by_command[o.case.args[0]][o.verdict] += 1
    for command, counts in sorted(by_command.items()):
        print(f"  {command:9} " + ", ".join(f"{v} {counts[v]}" for v in hostile.VERDICTS if counts[v]))
    bad = [o for o in outcomes if o.verdict != "clean"]
    for o in bad[: args.show]:
        print(f"  [{o.verdict}] {o.case.id}: {o.why[:160]!r}")
    target = verdicts["crash"] == verdicts["accepted-bad"] == verdicts["files-left"] == 0
    print(f"target (0 crashes, 0 accepted-bad, 0 files left): {'met' if target else 'NOT met'}")


if __name__ == "__main__":
    main()

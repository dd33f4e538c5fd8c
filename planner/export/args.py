"""The command line of a generated ``train.py``: ``--model``, ``--steps``, ``--loss``, ``--seed``, ``--lr``
(and, for torch, ``--report DIR``: each rank writes what it built and its losses there)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from planner.export import SEED_MAX
from planner.export.losses import LOSSES


def script_args(doc: str | None, model: str, local_rank: bool = False, report: bool = False) -> argparse.Namespace:
    """Parse a generated script's arguments (``model`` is the default ``--model``).

    ``local_rank`` also accepts the ``--local_rank`` the DeepSpeed launcher passes; ``report`` the
    torch script's ``--report DIR``, made here (with its parents) before any training, so that a run does
    not train every step and then fail to write its report; a folder that cannot be made is a usage error.
    """
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=model)
    ap.add_argument("--steps", type=_in_range(1, None), default=10)
    ap.add_argument("--loss", default="cross_entropy", choices=LOSSES)
    ap.add_argument("--seed", type=_in_range(0, SEED_MAX), default=0, help=f"0 to {SEED_MAX}")
    ap.add_argument("--lr", type=float, default=None, help="learning rate (default: the optimizer's own, "
                    "planner.export.optim.DEFAULT_LR)")
    if report:
        ap.add_argument("--report", default=None, metavar="DIR", help="each rank writes rank<R>.json there: its "
                        "mesh coordinates, layers, tensor-sharded layers, ZeRO stage, wrappers, node rank and losses")
    if local_rank:
        ap.add_argument("--local_rank", type=int, default=-1)
    args = ap.parse_args()
    if getattr(args, "report", None):
        try:
            Path(args.report).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            ap.error(f"--report {args.report}: cannot make the folder ({exc.strerror or exc}); give a folder path")
    return args


def _in_range(low: int, high: int | None) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` to ``high`` (None: no bound)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{value} is outside {low} to {'any' if high is None else high}")
        return value
    return parse

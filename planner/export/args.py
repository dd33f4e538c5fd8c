"""The command line of a generated ``train.py``: ``--model``, ``--steps``, ``--loss``, ``--seed``, ``--lr``
(and, for torch, ``--report DIR``: each rank writes what it built and its losses there)."""

from __future__ import annotations

import argparse

from planner.export.losses import LOSSES


def script_args(doc: str | None, model: str, local_rank: bool = False, report: bool = False) -> argparse.Namespace:
    """Parse a generated script's arguments (``model`` is the default ``--model``).

    ``local_rank`` also accepts the ``--local_rank`` the DeepSpeed launcher passes; ``report`` the
    torch script's ``--report DIR``.
    """
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=model)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--loss", default="cross_entropy", choices=LOSSES)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=None, help="learning rate (default: the optimizer's own, "
                    "planner.export.optim.DEFAULT_LR)")
    if report:
        ap.add_argument("--report", default=None, metavar="DIR", help="each rank writes rank<R>.json there: its "
                        "mesh coordinates, layers, tensor-sharded layers, ZeRO stage, wrappers, node rank and losses")
    if local_rank:
        ap.add_argument("--local_rank", type=int, default=-1)
    return ap.parse_args()

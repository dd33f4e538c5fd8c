"""The algorithm modules stay pure: importing them pulls in no torch, click or rich."""

from __future__ import annotations

import subprocess
import sys

PURE_MODULES = [
    "planner.errors", "planner.ir", "planner.jsonio", "planner.schedule",
    "planner.cluster", "planner.costmodel", "planner.search", "planner.search.hpp", "planner.search.sp",
    "planner.search.brute", "planner.search.baselines", "planner.simulate",
]


def test_algorithm_modules_import_no_torch_click_or_rich() -> None:
    code = (
        "import importlib, sys\n"
        f"for name in {PURE_MODULES!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ModuleNotFoundError as exc:\n"
        "        if not (exc.name or '').startswith('planner'): raise\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'click', 'rich', 'matplotlib'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"pure modules imported: {out.stdout.strip()}"

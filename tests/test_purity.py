"""The algorithm modules stay pure: importing them pulls in no torch, click, rich or matplotlib."""

from __future__ import annotations

import subprocess
import sys

PURE_MODULES = [
    "planner", "planner.errors", "planner.ir", "planner.jsonio", "planner.schedule",
    "planner.cluster", "planner.costmodel", "planner.search", "planner.search.hpp", "planner.search.sp",
    "planner.search.brute", "planner.search.baselines", "planner.search.interleave", "planner.simulate",
    "planner.compare", "planner.simulate.trace", "planner.judge", "planner.validate",
]


def test_algorithm_modules_import_no_torch_click_rich_or_matplotlib() -> None:
    code = (
        "import importlib, sys\n"
        f"for name in {PURE_MODULES!r}:\n"
        "    importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'click', 'rich', 'matplotlib'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"pure modules imported: {out.stdout.strip()}"


def test_search_command_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from planner.cli import main\n"
        "main.get_command(None, 'search'); main.get_command(None, 'simulate'); main.get_command(None, 'compare')\n"
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"search/simulate/compare commands import torch: {out.stdout.strip()[:200]}"

"""The algorithm modules stay pure: importing them pulls in no torch, click, rich or matplotlib."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MLP = ROOT / "profiles" / "mlp-b64-cpu.json"

PURE_MODULES = [
    "planner", "planner.errors", "planner.ir", "planner.jsonio", "planner.schedule",
    "planner.cluster", "planner.costmodel", "planner.search", "planner.search.hpp", "planner.search.sp",
    "planner.search.brute", "planner.search.baselines", "planner.search.interleave", "planner.simulate",
    "planner.compare", "planner.simulate.trace", "planner.judge", "planner.validate", "planner.api",
    "planner.search.bounds", "planner.search.tables", "planner.search.rerank", "planner.search.partitioners",
    "planner.search.pipedream", "planner.search.descent", "planner.costmodel.engine", "planner.runnable",
    "planner.engines", "planner.explain", "planner.gpus", "planner.grad_buffers",
    "planner.outputs", "planner.consistency", "planner.schemas",
]
PURE_PACKAGES = ("planner/search", "planner/costmodel", "planner/schedule", "planner/simulate", "planner/ir")
"""Every module of these packages is an algorithm module (one added later is held to it without being listed)."""


def pure_modules() -> list[str]:
    """:data:`PURE_MODULES` and every module of :data:`PURE_PACKAGES`."""
    found = [".".join(path.relative_to(ROOT).with_suffix("").parts)
             for package in PURE_PACKAGES for path in sorted((ROOT / package).glob("*.py")) if path.stem != "__init__"]
    return [*PURE_MODULES, *found]


def test_algorithm_modules_import_no_torch_click_rich_or_matplotlib() -> None:
    code = (
        "import importlib, sys\n"
        f"for name in {pure_modules()!r}:\n"
        "    importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'click', 'rich', 'matplotlib'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"pure modules imported: {out.stdout.strip()}"


def test_the_packages_modules_are_found() -> None:
    assert {"planner.search.megatron", "planner.search.layout", "planner.search.collect",
            "planner.simulate.engine"} <= set(pure_modules())


def test_search_command_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from planner.cli import main\n"
        "main.get_command(None, 'search'); main.get_command(None, 'simulate'); main.get_command(None, 'compare')\n"
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"search/simulate/compare commands import torch: {out.stdout.strip()[:200]}"


BLOCKER = (
    "import sys\n"
    "class Blocker:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] in ('torch', 'transformers', 'deepspeed', 'fvcore'):\n"
    "            raise ImportError(f'blocked: {name}')\n"
    "        return None\n"
    "sys.meta_path.insert(0, Blocker())\n"
)


def _light(code: str) -> str:
    """The output of ``code`` run in a fresh Python where torch, transformers, deepspeed and
    fvcore cannot be imported (it must succeed)."""
    out = subprocess.run([sys.executable, "-c", BLOCKER + code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_light_install_searches_simulates_and_compares_from_json(tmp_path: Path) -> None:
    """Without the [torch]/[engines] extras: the library steps and the three commands work."""
    code = (
        "import json, planner\n"
        "import planner.search, planner.simulate, planner.compare\n"
        "assert callable(planner.search.search) and callable(planner.simulate.simulate)\n"
        "assert callable(planner.compare.compare)\n"
        f"prof = {str(MLP)!r}\n"
        "plan = planner.search_plan(prof, 'pipepar-4x2-2080ti', microbatches=4)\n"
        "assert planner.simulate_plan(plan).iteration_s > 0 and planner.judge_plan(plan).fits\n"
        "c = planner.compare_strategies(prof, 'pipepar-4x2-2080ti', strategies=['dp', 'planner'], microbatches=4)\n"
        "assert c.get('planner').fits\n"
        "try:\n"
        "    planner.profile_model('mlp')\n"
        "except planner.PlannerError as exc:\n"
        "    assert exc.hint == \"pip install 'planner[torch]'\", exc.hint\n"
        "else:\n"
        "    raise SystemExit('profile_model ran without torch')\n"
        "from click.testing import CliRunner\n"
        "from planner.cli import main\n"
        f"out = {str(tmp_path / 'plan.json')!r}\n"
        "r = CliRunner().invoke(main, ['search', prof, '--cluster', 'pipepar-4x2-2080ti', '--microbatches', '4',\n"
        "                              '-o', out, '--json'])\n"
        "assert r.exit_code == 0, r.output\n"
        "r = CliRunner().invoke(main, ['simulate', out, '--json', '--quiet'])\n"
        "assert r.exit_code == 0 and json.loads(r.stdout)['kind'] == 'simulation', r.output\n"
        "r = CliRunner().invoke(main, ['compare', prof, '--cluster', 'pipepar-4x2-2080ti', '--strategies',\n"
        "                              'dp,planner', '--microbatches', '4', '--json'])\n"
        "assert r.exit_code == 0 and json.loads(r.stdout)['kind'] == 'comparison', r.output\n"
        "print('ok', sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'deepspeed')))\n"
    )
    assert _light(code).splitlines()[-1] == "ok []"


def test_import_planner_exports_the_steps_without_torch() -> None:
    code = (
        "import planner\n"
        "steps = ['profile_model', 'search_plan', 'judge_plan', 'simulate_plan', 'compare_strategies',\n"
        "         'export_plan', 'run_plan']\n"
        "assert all(s in planner.__all__ and callable(getattr(planner, s)) for s in steps)\n"
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'click', 'rich', 'numpy'))))\n"
    )
    assert _light(code) == ""  # import planner loads no algorithm dependency either

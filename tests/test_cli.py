"""cli: the shell around the library: help, exit codes, one-line errors."""

from __future__ import annotations

import subprocess
import sys

from click.testing import CliRunner

from planner.cli import main


def test_help_lists_every_command() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    for name in ("profile", "clusters", "search", "simulate", "compare", "export", "run", "calibrate"):
        assert name in result.output


def test_unknown_command_is_usage_error() -> None:
    result = CliRunner().invoke(main, ["frobnicate"])
    assert result.exit_code == 2


def test_python_dash_m_works() -> None:
    out = subprocess.run([sys.executable, "-m", "planner", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and "planner" in out.stdout

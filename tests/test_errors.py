"""errors: the cause/hint pair and the exit code each kind of failure maps to."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from planner import errors
from planner.cli import main


def test_exit_codes_by_kind() -> None:
    assert errors.PlannerError("x").exit_code == 1
    assert errors.UsageError("x").exit_code == 2
    assert errors.InfeasibleError("x", needed_bytes=5).exit_code == 3
    for kind in (errors.FormatError, errors.ProfileError, errors.ModelLoadError, errors.TraceError,
                 errors.ClusterError, errors.PlanError, errors.ScheduleError, errors.ExportError, errors.RunError):
        assert issubclass(kind, errors.PlannerError) and kind("x").exit_code == 1


def test_message_has_cause_and_hint() -> None:
    exc = errors.PlanError("stage 2 has 3 forms for 4 layers", "give one form per layer")
    assert str(exc) == "stage 2 has 3 forms for 4 layers (give one form per layer)"
    assert (exc.cause, exc.hint) == ("stage 2 has 3 forms for 4 layers", "give one form per layer")


@pytest.mark.parametrize(("args", "code"), [(["simulate", "/no/such/plan.json"], 1),
                                             (["search", "/no/such/profile.json", "--cluster", "x"], 1)])
def test_cli_prints_one_line_cause_and_hint_without_traceback(args: list[str], code: int) -> None:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == code
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line]
    assert lines[0].startswith("error: ") and lines[1].startswith("hint: ")

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


@pytest.mark.parametrize("value, low, high, whole", [
    (3, None, None, True), (0, 0, None, True), (0, 1, None, False), (5, 1, 5, True), (6, 1, 5, False),
    (True, None, None, False), (2.0, None, None, False), ("2", None, None, False), (None, None, None, False),
    (-(2**70), None, 0, True), (2**70, 0, 2**64, False)])
def test_is_whole_takes_ints_in_range_only(value: object, low: int | None, high: int | None, whole: bool) -> None:
    """What every count check of a library caller's or a file's value asks: bool and 2.0 are not whole numbers."""
    from planner.errors import is_whole

    assert is_whole(value, low, high) is whole


def test_device_lists_in_messages_stay_short() -> None:
    """A stage of a large cluster has hundreds of devices: a message names a few, the last and the count."""
    from planner.errors import shown_devices

    assert shown_devices(("n0.g0", "n0.g1")) == "['n0.g0', 'n0.g1']"
    many = tuple(f"s{i}.g{j}" for i in range(64) for j in range(8))
    assert shown_devices(many) == "['s0.g0', 's0.g1', .., 's63.g7'] (512 devices)"

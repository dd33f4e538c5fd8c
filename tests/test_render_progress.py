"""Progress on stderr: on a terminal unless --json, forced or silenced by flag or PLANNER_PROGRESS."""

from __future__ import annotations

import pytest

from planner.render import progress
from planner.render.progress import ENV, status, wanted


@pytest.mark.parametrize(("flag", "env", "as_json", "tty", "shown"), [
    (None, None, False, True, True),     # a terminal: yes
    (None, None, True, True, False),     # --json: quiet
    (None, None, False, False, False),   # a pipe or a log: quiet
    (True, None, True, False, True),     # --progress wins
    (False, "1", False, True, False),    # --no-progress wins over the environment
    (None, "1", True, False, True),      # PLANNER_PROGRESS=1
    (None, "0", False, True, False),     # PLANNER_PROGRESS=0
])
def test_when_progress_shows(monkeypatch: pytest.MonkeyPatch, flag: bool | None, env: str | None, as_json: bool,
                             tty: bool, shown: bool) -> None:
    if env is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, env)
    assert wanted(flag, as_json, tty) is shown


def test_off_a_terminal_when_asked_it_logs_one_line_per_news(capsys: pytest.CaptureFixture[str]) -> None:
    with status("working [on] it", True) as update:
        update("step 1/2")
        update("step 2/2")
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert lines[0] == "working [on] it ..."  # markup-like text is shown as written
    assert lines[1].endswith("s  step 1/2") and lines[2].endswith("s  step 2/2")


def test_quiet_by_default_off_a_terminal(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    with status("working") as update:
        update("news")
    assert capsys.readouterr().err == ""
    assert progress.ENV == "PLANNER_PROGRESS"

"""jsonio: kind/version checks and atomic writes that leave nothing half-written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from planner.errors import FormatError, PlannerError
from planner.jsonio import atomic_path, read_json, write_json


def test_read_json_errors(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="no such file"):
        read_json(tmp_path / "missing.json", "profile")
    bad = tmp_path / "bad.json"
    bad.write_text('{"kind": "profile", "vers')
    with pytest.raises(FormatError, match="not valid JSON"):
        read_json(bad, "profile")
    other = tmp_path / "other.json"
    write_json(other, {"kind": "plan", "version": 1})
    with pytest.raises(FormatError, match="expected 'profile'"):
        read_json(other, "profile")


def test_atomic_write_leaves_nothing_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("partial")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(PlannerError, match="does not exist"):
        write_json(tmp_path / "nope" / "out.json", {"kind": "plan", "version": 1})


def test_nan_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PlannerError, match="cannot write JSON"):
        write_json(tmp_path / "x.json", {"x": float("nan")})
    assert list(tmp_path.iterdir()) == []


def test_written_files_get_the_usual_mode(tmp_path: Path) -> None:
    target = tmp_path / "mode.json"
    write_json(target, {"kind": "plan", "version": 1})
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask

"""outputs: checked before the work, staged, committed together, rolled back, links written through."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner import outputs
from planner.errors import PlannerError, UsageError
from planner.outputs import Outputs, check_output


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_check_output_refuses_what_cannot_be_a_file(tmp_path: Path) -> None:
    assert check_output(None) is None
    with pytest.raises(UsageError, match="empty"):
        check_output("")
    with pytest.raises(PlannerError, match="it is a folder"):
        check_output(tmp_path)
    with pytest.raises(PlannerError, match="does not exist"):
        check_output(tmp_path / "no" / "x.json")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(PlannerError, match="not a regular file"):
        check_output(tmp_path / "fifo")
    os.symlink("/dev/null", tmp_path / "null")
    with pytest.raises(PlannerError, match=r"not a regular file.*a link to /dev/null"):
        check_output(tmp_path / "null")
    assert check_output(tmp_path / "new.json") == tmp_path.resolve() / "new.json"


def test_check_output_folder(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(PlannerError, match="not a folder"):
        check_output(tmp_path / "f", folder=True)
    assert check_output(tmp_path / "a" / "b", folder=True) == tmp_path.resolve() / "a" / "b"


def test_nothing_appears_before_commit_and_all_after(tmp_path: Path) -> None:
    with Outputs([tmp_path / "a.json", tmp_path / "b.png", None]) as out:
        out.write_text(tmp_path / "a.json", "A")
        out.temp(tmp_path / "b.png").write_text("B")
        assert not (tmp_path / "a.json").exists() and not (tmp_path / "b.png").exists()
        out.commit()
    assert (tmp_path / "a.json").read_text() == "A" and (tmp_path / "b.png").read_text() == "B"
    assert _names(tmp_path) == ["a.json", "b.png"]


def test_close_without_commit_leaves_nothing(tmp_path: Path) -> None:
    (tmp_path / "old").write_text("previous")
    with Outputs([tmp_path / "old", tmp_path / "new"]) as out:
        out.write_text(tmp_path / "old", "replaced")
        out.write_text(tmp_path / "new", "new")
        out.folder(tmp_path / "dir")
    assert _names(tmp_path) == ["old"] and (tmp_path / "old").read_text() == "previous"


def _fail_replacing(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Replacing a file called ``name`` into place fails as a full disk does; other renames go through."""
    real_replace = os.replace

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        if Path(dst).name == name:
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(outputs.os, "replace", replace)


def test_a_failed_commit_rolls_back_and_restores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a").write_text("old a")
    out = Outputs([tmp_path / "a", tmp_path / "b", tmp_path / "c"])
    for name in "abc":
        out.write_text(tmp_path / name, f"new {name}")
    _fail_replacing(monkeypatch, "c")
    with pytest.raises(PlannerError, match=r"cannot write .*c: No space left"):
        out.commit()
    monkeypatch.undo()
    assert _names(tmp_path) == ["a"] and (tmp_path / "a").read_text() == "old a"


def test_links_are_written_through_and_modes_kept(tmp_path: Path) -> None:
    target = tmp_path / "target.json"
    target.write_text("old")
    target.chmod(0o640)
    os.symlink("target.json", tmp_path / "link.json")
    with Outputs([tmp_path / "link.json"]) as out:
        out.write_text(tmp_path / "link.json", "new")
        out.commit()
    assert (tmp_path / "link.json").is_symlink() and target.read_text() == "new"
    assert target.stat().st_mode & 0o777 == 0o640


def test_the_same_file_twice_is_refused(tmp_path: Path) -> None:
    os.symlink("x", tmp_path / "alias")
    with pytest.raises(UsageError, match="same file"):
        Outputs([tmp_path / "x", tmp_path / "alias"])


def test_a_folder_output_new_with_parents_or_existing(tmp_path: Path) -> None:
    with Outputs(folders=[tmp_path / "a" / "b"]) as out:
        (out.folder(tmp_path / "a" / "b") / "f.txt").write_text("1")
        assert not (tmp_path / "a").exists()
        out.commit()
    assert (tmp_path / "a" / "b" / "f.txt").read_text() == "1"
    (tmp_path / "a" / "b" / "keep.txt").write_text("k")
    with Outputs(folders=[tmp_path / "a" / "b"]) as out:
        (out.folder(tmp_path / "a" / "b") / "f.txt").write_text("2")
        out.commit()
    assert _names(tmp_path / "a" / "b") == ["f.txt", "keep.txt"] and (tmp_path / "a" / "b" / "f.txt").read_text() == "2"
    assert _names(tmp_path) == ["a"] and _names(tmp_path / "a") == ["b"]


def test_a_failed_folder_commit_removes_the_folders_it_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = Outputs([tmp_path / "z"], folders=[tmp_path / "a" / "b"])
    (out.folder(tmp_path / "a" / "b") / "f.txt").write_text("1")
    out.write_text(tmp_path / "z", "z")
    monkeypatch.setattr(outputs.os, "replace", lambda src, dst: (_ for _ in ()).throw(OSError(5, "I/O error")))
    with pytest.raises(PlannerError, match="I/O error"):
        out.commit()
    assert _names(tmp_path) == []


def test_a_failure_part_way_into_an_existing_folder_restores_every_file(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    for name in "abc":
        (folder / name).write_text(f"old {name}")
    out = Outputs(folders=[folder])
    for name in "abc":
        (out.folder(folder) / name).write_text(f"new {name}")
    _fail_replacing(monkeypatch, "c")
    with pytest.raises(PlannerError, match="No space left"):
        out.commit()
    monkeypatch.undo()
    assert _names(folder) == ["a", "b", "c"]
    assert [(folder / n).read_text() for n in "abc"] == ["old a", "old b", "old c"]


def test_a_file_that_would_land_on_a_folder_is_refused_before_anything_is_placed(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    (folder / "train.py").mkdir(parents=True)
    (folder / "README.md").write_text("mine")
    out = Outputs(folders=[folder])
    for name in ("README.md", "train.py"):
        (out.folder(folder) / name).write_text("new")
    with pytest.raises(PlannerError, match=r"train.py: it is a folder"):
        out.ready()
    with pytest.raises(PlannerError, match=r"train.py: it is a folder"):
        out.commit()
    assert _names(folder) == ["README.md", "train.py"] and (folder / "README.md").read_text() == "mine"


def test_an_output_that_is_an_input_is_refused(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text("input")
    os.symlink("plan.json", tmp_path / "alias.json")
    with pytest.raises(UsageError, match="is the command's input"):
        Outputs([tmp_path / "alias.json"], inputs=[plan])
    out = Outputs(folders=[tmp_path], inputs=[plan])  # a folder that holds the input, and a file of that name
    (out.folder(tmp_path) / "plan.json").write_text("exported")
    with pytest.raises(UsageError, match=r"plan\.json is the command's input"):
        out.commit()
    assert plan.read_text() == "input"


def test_a_name_the_system_refuses_is_a_planner_error(tmp_path: Path) -> None:
    with pytest.raises(PlannerError, match="too long"):
        check_output(tmp_path / ("a" * 300 + ".json"))
    with pytest.raises(PlannerError, match="too long"):
        Outputs(folders=[tmp_path / ("b" * 300)])


def test_stdout_to_stderr_moves_python_and_fd_level_writes() -> None:
    code = ("import os, sys\nfrom planner.outputs import stdout_to_stderr\n"
            "with stdout_to_stderr():\n    print('py')\n    os.write(1, b'fd\\n')\nprint('after')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    assert done.stdout == "after\n" and done.stderr == "py\nfd\n"


def test_a_folder_that_takes_no_new_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # /proc's files exist, are regular and (as root) writable, but no file can be made beside them: ENOENT
    target = tmp_path / "out.json"
    target.write_text("{}")

    def refuse(*args: object, **kwargs: object) -> tuple[int, str]:
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(outputs.tempfile, "mkstemp", refuse)
    with Outputs(files=[target]) as out, pytest.raises(PlannerError, match=f"no file can be made in folder {tmp_path}"):
        out.write_text(target, "{}")

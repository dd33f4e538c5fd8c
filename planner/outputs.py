"""Every file a command writes: checked before the work, staged while it runs, committed together (pure).

A command declares its outputs first (:class:`Outputs`): each path must be a non-empty name
whose folder exists and is writable, and which is not a folder, a device, a pipe or another
non-regular file (:func:`check_output`). A symlink is written through to its target (the link
stays). While the command works, each output is written to a temporary file (or folder) beside
its target; :meth:`Outputs.commit` renames them all into place at the end, after the command's
printing succeeded, after checking that none lands on a folder or on one of the command's inputs
(:meth:`Outputs.ready`, which a command may call before it prints; an output that is an input is
refused when declared). If one rename fails, the ones already made are undone (a replaced file is
restored from a hard-link backup), so a command that fails leaves none of its outputs and never
a half-written file. :meth:`Outputs.close` removes whatever was staged and not committed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.errors import PlannerError, UsageError


def _refuse(path: str, why: str, hint: str = "choose another output path") -> PlannerError:
    return PlannerError(f"cannot write {path}: {why}", hint)


def target_of(path: str | os.PathLike[str]) -> Path:
    """The file a write to ``path`` lands in: the final target of a symlink, else the path itself (absolute)."""
    return Path(os.path.realpath(path))


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _check_folder_writable(shown: str, folder: Path) -> None:
    if not folder.is_dir():
        raise _refuse(shown, f"folder {folder} does not exist", "create the folder or choose another path")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise _refuse(shown, f"folder {folder} is not writable (permission denied)")


def check_output(path: str | os.PathLike[str] | None, *, folder: bool = False) -> Path | None:
    """Fail before any work unless ``path`` can be written (``folder``: as a folder of files); the real target.

    ``None`` means no output; an empty name is a usage error.
    """
    if path is None:
        return None
    shown = str(path)
    if not shown.strip():
        raise UsageError("an output path is empty", "give a file name, e.g. -o plan.json")
    try:
        return _checked(shown, folder)
    except OSError as exc:  # a name too long, a loop of links, ...
        raise _refuse(shown, exc.strerror or str(exc), "give a shorter or plainer path") from None


def _checked(shown: str, folder: bool) -> Path:
    real = target_of(shown)
    via = "" if real == Path(os.path.abspath(shown)) else f" (a link to {real})"
    if folder:
        if real.exists() and not real.is_dir():
            raise _refuse(shown, f"it is not a folder{via}", "give a new or existing folder")
        _check_folder_writable(shown, _nearest_existing(real))
        return real
    if real.is_dir():
        raise _refuse(shown, f"it is a folder{via}", "give a file name, e.g. -o plan.json")
    if real.exists() or real.is_symlink():
        mode = real.stat().st_mode if real.exists() else 0
        if not stat.S_ISREG(mode):
            raise _refuse(shown, f"it is not a regular file (a device, pipe or socket){via}",
                          "write to a file; --json prints the document on stdout")
        if not os.access(real, os.W_OK):
            raise _refuse(shown, f"the file is read-only{via}", "make it writable or choose another path")
    _check_folder_writable(shown, real.parent)
    return real


def _usual_mode(existing: Path | None, directory: bool = False) -> int:
    """A replaced file keeps its mode; a new one gets the umask's (mkstemp/mkdtemp make 0600/0700)."""
    if existing is not None and existing.exists():
        return stat.S_IMODE(existing.stat().st_mode)
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if directory else 0o666) & ~umask


@dataclass
class _Staged:
    """One output: the user's path, its real target and the temporary file or folder holding its content."""

    shown: str
    target: Path
    temp: Path
    folder: bool = False
    backups: list[Path] = field(default_factory=list)


Undo = Callable[[], None]


def _backup(target: Path) -> Path | None:
    """A hard link (or, failing that, a copy) of an existing ``target`` beside it, to restore on rollback."""
    if not target.exists():
        return None
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".bak", dir=target.parent)
    os.close(fd)
    backup = Path(name)
    backup.unlink()
    try:
        os.link(target, backup)
    except OSError:
        shutil.copy2(target, backup)
    return backup


def _place_file(temp: Path, target: Path, item: _Staged) -> Undo:
    backup = _backup(target)
    if backup is not None:
        item.backups.append(backup)  # dropped after the commit, whether this replace succeeds or not
    os.replace(temp, target)
    if backup is None:
        return lambda: target.unlink(missing_ok=True)
    return lambda: os.replace(backup, target)


def _place_folder(item: _Staged, done: list[Undo]) -> None:
    """A new folder is renamed into place whole; an existing one receives the files one by one. Each step's
    undo goes into ``done`` as soon as it is made, so a failure part way is undone whole."""
    target = item.target
    if target.is_dir():
        for f in sorted(item.temp.iterdir()):
            done.append(_place_file(f, target / f.name, item))
        return
    for parent in reversed(target.parents):
        if not parent.exists():
            parent.mkdir()
            done.append(_remover(parent))
    os.rename(item.temp, target)
    done.append(lambda: shutil.rmtree(target, ignore_errors=True))  # undone backwards


def _remover(folder: Path) -> Undo:
    return lambda: folder.rmdir()


class Outputs:
    """The outputs of one command: checked when made, staged with :meth:`temp`/:meth:`write_text`/
    :meth:`folder`, committed together by :meth:`commit`; :meth:`close` drops what was not committed."""

    def __init__(self, files: Sequence[str | os.PathLike[str] | None] = (),
                 folders: Sequence[str | os.PathLike[str] | None] = (),
                 inputs: Sequence[str | os.PathLike[str] | None] = ()) -> None:
        self._inputs = {target_of(p): str(p) for p in inputs if p is not None and str(p).strip()}
        self._targets: dict[str, tuple[Path, bool]] = {}
        for paths, is_folder in ((files, False), (folders, True)):
            for path in paths:
                real = check_output(path, folder=is_folder)
                if real is not None:
                    self._add(str(path), real, is_folder)
        self._staged: list[_Staged] = []

    def _add(self, key: str, real: Path, folder: bool) -> None:
        clash = [shown for shown, (other, _) in self._targets.items() if other == real]
        if clash:
            raise UsageError(f"{key} and {clash[0]} are the same file ({real})", "give each output its own path")
        self._refuse_input(key, real)
        self._targets[key] = (real, folder)

    def _refuse_input(self, shown: str, real: Path) -> None:
        if real in self._inputs:
            given = self._inputs[real]
            same = given == shown and Path(os.path.abspath(shown)) == real
            which = "" if same else f" {given} ({real})"
            raise UsageError(f"output {shown} is the command's input{which}: writing it would replace what the "
                             "command reads", "give the output another path")

    def ready(self) -> None:
        """Fail, before anything is placed, where a staged file would land on a folder or another non-regular
        file, or on an input, in an existing output folder (a new file or folder was checked when declared)."""
        for item in self._staged:
            if not (item.folder and item.target.is_dir()):
                continue
            for f in sorted(item.temp.iterdir()):
                dest = target_of(item.target / f.name)
                shown = str(Path(item.shown) / f.name)
                if dest.is_dir() or (dest.exists() and not dest.is_file()):
                    raise _refuse(shown, "it is a folder or another non-regular file",
                                  f"move it away or choose another folder than {item.shown}")
                self._refuse_input(shown, dest)

    def _target(self, path: str | os.PathLike[str], folder: bool) -> Path:
        key = str(path)
        if key not in self._targets:  # not declared up front: check it now
            real = check_output(path, folder=folder)
            if real is None:
                raise UsageError("an output path is missing", "give a file name")
            self._add(key, real, folder)
        return self._targets[key][0]

    def temp(self, path: str | os.PathLike[str]) -> Path:
        """A new empty temporary file beside ``path``'s target; its content becomes ``path`` at commit."""
        target = self._target(path, folder=False)
        try:
            fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        except OSError as exc:  # a folder that takes no new files (/proc: ENOENT for a file that exists)
            raise _refuse(str(path), f"no file can be made in folder {target.parent} ({exc.strerror})") from None
        os.close(fd)
        temp = Path(name)
        os.chmod(temp, _usual_mode(target))
        self._staged.append(_Staged(str(path), target, temp))
        return temp

    def folder(self, path: str | os.PathLike[str]) -> Path:
        """A new empty temporary folder; the files written into it go into folder ``path`` at commit."""
        target = self._target(path, folder=True)
        try:
            temp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=_nearest_existing(target)))
        except OSError as exc:
            raise _refuse(str(path), f"no folder can be made in folder {_nearest_existing(target)} ({exc.strerror})"
                          ) from None
        os.chmod(temp, _usual_mode(None, directory=True))
        self._staged.append(_Staged(str(path), target, temp, folder=True))
        return temp

    def write_text(self, path: str | os.PathLike[str] | None, text: str) -> None:
        """Stage ``text`` as the content of ``path`` (``None``: no output, nothing done)."""
        if path is None:
            return
        temp = self.temp(path)
        try:
            temp.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise _refuse(str(path), str(exc.strerror), "free some space or choose another path") from None

    def commit(self) -> None:
        """Move every staged output into place (after :meth:`ready`); if one fails, undo the others and raise."""
        done: list[Undo] = []
        shown = ", ".join(item.shown for item in self._staged)
        try:
            self.ready()
            for item in self._staged:
                shown = item.shown
                if item.folder:
                    _place_folder(item, done)
                else:
                    done.append(_place_file(item.temp, item.target, item))
        except OSError as exc:
            _undo(done)
            raise _refuse(shown, str(exc.strerror)) from None
        except BaseException:
            _undo(done)
            raise
        finally:
            self._drop_backups()
            self.close()

    def _drop_backups(self) -> None:
        for item in self._staged:
            for backup in item.backups:
                backup.unlink(missing_ok=True)

    def close(self) -> None:
        """Remove what is staged and not committed (after :meth:`commit`: nothing is left to remove)."""
        for item in self._staged:
            if item.folder:
                shutil.rmtree(item.temp, ignore_errors=True)
            else:
                item.temp.unlink(missing_ok=True)
        self._staged = []

    def __enter__(self) -> Outputs:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _undo(done: Sequence[Undo]) -> None:
    for undo in reversed(done):
        with contextlib.suppress(OSError):
            undo()


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send what user code prints to stdout to stderr, at the Python and the file-descriptor level,
    so that ``--json`` output stays one document."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no file descriptor 1: the Python level is all there is
        saved = -1
    try:
        if saved >= 0:
            os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        for stream in (sys.stdout, sys.__stdout__):
            if stream is not None:
                with contextlib.suppress(OSError, ValueError):
                    stream.flush()
        if saved >= 0:
            os.dup2(saved, 1)
            os.close(saved)

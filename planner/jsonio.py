"""Reading and writing planner's JSON documents: kind and version checks, atomic writes.

Every document planner writes carries ``kind`` and ``version``. Files are written to a
temporary sibling and renamed into place, so a failure never leaves a half-written file.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from planner.errors import FormatError, PlannerError

SUPPORTED_VERSION = 1
"""The version of profile, cluster and the other documents."""

READ_VERSIONS = {"plan": (1, 2)}
"""Versions read per kind where more than :data:`SUPPORTED_VERSION` (plans: 2 adds tensor x data grids)."""


def check_kind(doc: Any, kind: str, source: str, versions: tuple[int, ...] | None = None) -> dict[str, Any]:
    """Return ``doc`` if it is a mapping of this ``kind`` and one of the ``versions`` this planner reads
    (default: :data:`READ_VERSIONS` of the kind, else :data:`SUPPORTED_VERSION`)."""
    readable: tuple[int, ...] = versions if versions is not None else READ_VERSIONS.get(kind, (SUPPORTED_VERSION,))
    if not isinstance(doc, dict):
        raise FormatError(
            f"{source}: expected a JSON object of kind {kind!r}, got {type(doc).__name__}",
            f"pass a {kind} file written by planner",
        )
    got = doc.get("kind")
    if got != kind:
        raise FormatError(
            f"{source}: field 'kind' is {got!r}, expected {kind!r}",
            f"pass a {kind} file (planner {_maker(kind)} writes one)",
        )
    version = doc.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version not in readable:
        raise FormatError(
            f"{source}: {kind} 'version' is {version!r:.40} ({type(version).__name__}), this planner reads "
            f"version {' and '.join(str(v) for v in readable)} (an integer)",
            "re-create the file with this version of planner",
        )
    return doc


def _maker(kind: str) -> str:
    return {"profile": "profile", "plan": "search", "cluster": "calibrate"}.get(kind, kind)


def read_json(path: str | os.PathLike[str], kind: str) -> dict[str, Any]:
    """Load a planner JSON document of ``kind`` from ``path``, with clear errors."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FormatError(f"{p}: no such file", f"check the path of the {kind} file") from None
    except OSError as exc:
        raise FormatError(f"{p}: cannot read ({exc.strerror})", "check the file's permissions") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FormatError(
            f"{p}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})",
            f"the file may be truncated; re-create the {kind} file",
        ) from None
    return check_kind(doc, kind, str(p))


def dumps(doc: Mapping[str, Any]) -> str:
    """Serialise ``doc`` as indented JSON; NaN and infinities are refused."""
    try:
        return json.dumps(doc, indent=2, allow_nan=False) + "\n"
    except ValueError as exc:
        raise PlannerError(f"cannot write JSON: {exc}", "this is a bug in planner; please report it") from None


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it onto ``path``.

    On any exception the temporary file is removed and ``path`` is left untouched.
    """
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise PlannerError(
            f"cannot write {target}: folder {parent} does not exist", "create the folder or choose another path"
        )
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent)
    except OSError as exc:
        raise PlannerError(
            f"cannot write {target}: {exc.strerror}", "choose a writable output path"
        ) from None
    os.close(fd)
    tmp = Path(tmp_name)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the usual mode of a new file
    try:
        yield tmp
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        try:
            tmp.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise PlannerError(f"cannot write {path}: {exc.strerror}", "choose a writable output path") from None


def write_json(path: str | os.PathLike[str], doc: Mapping[str, Any]) -> None:
    """Write a JSON document to ``path`` atomically."""
    write_text_atomic(path, dumps(doc))


def is_finite_number(value: Any) -> bool:
    """True for an int or float that is neither NaN nor infinite (bools excluded)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

"""Reading and writing planner's JSON documents: hostile-input-proof reading, kind, version and schema
checks, atomic writes.

Every document planner writes carries ``kind`` and ``version``. Reading refuses what is not a
bounded, finite, UTF-8 JSON document of the kind's shipped schema (:func:`read_json`). Files are
written to a temporary sibling and renamed into place (:mod:`planner.outputs`), so a failure never
leaves a half-written file.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from planner.errors import FormatError, PlannerError, is_whole

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
    if not is_whole(version) or version not in readable:
        raise FormatError(
            f"{source}: {kind} 'version' is {version!r:.40} ({type(version).__name__}), this planner reads "
            f"version {' and '.join(str(v) for v in readable)} (an integer)",
            "re-create the file with this version of planner",
        )
    return doc


def _maker(kind: str) -> str:
    return {"profile": "profile", "plan": "search", "cluster": "calibrate"}.get(kind, kind)


MAX_FILE_BYTES = 64 * 2**20
"""The largest JSON file read (a plan of a 100,000-layer model is about 40 MB)."""

MAX_DEPTH = 64
"""The deepest nesting of arrays and objects read (planner's own files nest 6 deep)."""

MAX_INT_DIGITS = 30
"""The longest integer literal read (every bound in planner/schemas is below 1e22)."""

_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def read_json(path: str | os.PathLike[str], kind: str) -> dict[str, Any]:
    """Load a planner JSON document of ``kind`` from ``path``, with clear errors.

    Checked in order: a regular file of at most :data:`MAX_FILE_BYTES`, UTF-8, nesting of at
    most :data:`MAX_DEPTH` (before parsing, so no recursion error), valid JSON without NaN,
    Infinity, overflowing numbers, over-long integers or duplicate keys, its ``kind`` and
    ``version``, then the shipped JSON Schema of the kind (``planner/schemas``).
    """
    p = Path(path)
    text = _decode(_read_bytes(p, kind), p)
    _check_depth(text, p)
    doc = check_kind(_parse(text, p, kind), kind, str(p))
    from planner import schemas

    schemas.validate(doc, kind, doc["version"], str(p))
    return doc


def _read_bytes(p: Path, kind: str) -> bytes:
    try:
        mode = p.stat().st_mode
        if not stat.S_ISREG(mode):  # before opening: a pipe would block, a device never end
            raise FormatError(f"{p}: {'is a folder' if stat.S_ISDIR(mode) else 'not a regular file'}",
                              f"pass a {kind} file")
        with p.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise FormatError(f"{p}: no such file", f"check the path of the {kind} file") from None
    except OSError as exc:
        raise FormatError(f"{p}: cannot read ({exc.strerror})", "check the file's permissions") from None
    if len(data) > MAX_FILE_BYTES:
        raise FormatError(f"{p}: larger than {MAX_FILE_BYTES // 2**20} MiB", f"pass a {kind} file written by planner")
    return data


def _decode(data: bytes, p: Path) -> str:
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise FormatError(f"{p}: not UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})",
                          "save the file as UTF-8") from None


def _check_depth(text: str, p: Path) -> None:
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return
    depth = 0
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise FormatError(f"{p}: nested deeper than {MAX_DEPTH} levels (at character {match.start()})",
                                  "planner's files nest a few levels; this is not one of them")
        elif token in "]}":
            depth -= 1


class _Refused(ValueError):
    """A JSON value that parses but is refused (long integer, duplicate key), with the hint that fits it."""

    def __init__(self, cause: str, hint: str) -> None:
        super().__init__(cause)
        self.hint = hint


def _constant(name: str) -> float:
    return float(name)  # NaN, Infinity: refused by _check_finite, which names the field


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _Refused(f"integer {text[:20]}... has {len(text.lstrip('-'))} digits (at most {MAX_INT_DIGITS})",
                       "write numbers within planner's bounds")
    return int(text)


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Refused(f"duplicate key {key[:60]!r}", "keep one value per key (the file was edited or merged)")
        out[key] = value
    return out


def _parse(text: str, p: Path, kind: str) -> Any:
    try:
        doc = json.loads(text, parse_constant=_constant, parse_int=_int, object_pairs_hook=_pairs)
    except json.JSONDecodeError as exc:
        raise FormatError(
            f"{p}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})",
            f"the file may be truncated; re-create the {kind} file",
        ) from None
    except _Refused as exc:
        raise FormatError(f"{p}: {exc}", f"{exc.hint}, or re-create the {kind} file") from None
    _check_finite(doc, (), p)
    return doc


def _check_finite(value: Any, path: tuple[str | int, ...], p: Path) -> None:
    """Refuse NaN, Infinity and numbers beyond a float (1e400 parses as infinity), naming the field."""
    if isinstance(value, float) and not math.isfinite(value):
        from planner.schemas import field_path

        raise FormatError(f"{p}: {field_path(path) or 'the document'} is {value!r}: not a finite number (NaN, "
                          "Infinity or beyond 1.8e308)", "write a finite number within planner's bounds")
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        _check_finite(item, (*path, key), p)


def check_finite(doc: Any, source: str) -> None:
    """Refuse NaN, Infinity and numbers beyond a float anywhere in ``doc`` (FormatError naming the field), as
    :func:`read_json` does for a file (``source`` names where the document came from)."""
    _check_finite(doc, (), Path(source))


def check_loadable(doc: Mapping[str, Any], schema: bool = True, where: str | None = None) -> None:
    """Refuse to write a document planner would refuse to read: a number that is not finite, or (``schema``, for a
    kind with a shipped schema) a field beyond its bounds. Both come from inputs far from real hardware (a link of
    1e-300 bytes/s makes an iteration of 1e300 s)."""
    kind = doc.get("kind", "document")
    where = where or f"the {kind} this command made"
    try:
        _check_finite(doc, (), Path(where))
        from planner import schemas

        if schema and isinstance(doc.get("version"), int):
            schemas.validate(doc, str(kind), doc["version"], where)
    except FormatError as exc:
        raise PlannerError(exc.cause, "it would not load again: check the inputs' figures (a link's bandwidth and "
                           "latency, a device's flops and memory, the profile's times); one is far from any real "
                           "machine") from None


def dumps(doc: Mapping[str, Any]) -> str:
    """Serialise ``doc`` as indented JSON, refusing numbers that are not finite (:func:`check_loadable`)."""
    check_loadable(doc, schema=False)
    try:
        return json.dumps(doc, indent=2, allow_nan=False) + "\n"
    except ValueError as exc:
        raise PlannerError(f"cannot write JSON: {exc}", "this is a bug in planner; please report it") from None


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``'s target; on success rename it onto the target.

    The checks and the staging are :class:`planner.outputs.Outputs`' (a symlink is written through, a
    device or folder refused). On any exception the temporary file is removed and ``path`` is left untouched.
    """
    from planner.outputs import Outputs

    with Outputs([path]) as out:
        yield out.temp(path)
        out.commit()


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

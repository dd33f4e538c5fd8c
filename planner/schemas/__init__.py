"""The shipped JSON Schemas of planner's files and the validator that applies them (pure).

One schema per file kind and version (``profile.v1``, ``cluster.v1``, ``plan.v1``, ``plan.v2``),
shipped as standard JSON Schema (draft 2020-12) files beside this module so that other tools can
validate plans too; :mod:`planner.schemas.build` makes them. :func:`validate` applies one with a
small validator of the subset they use (``type``, ``const``, ``enum``, ``minimum``, ``maximum``,
``exclusiveMinimum``, ``minLength``, ``maxLength``, ``minItems``, ``maxItems``, ``required``,
``properties``, ``additionalProperties``, ``items``, local ``$ref``), so the light install needs no
JSON Schema library. Errors name the field path and the value. The semantic checks (one form per
layer, ties within the model, ...) stay in ``planner.ir``'s ``from_dict``.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from planner.errors import FormatError

FOLDER = Path(__file__).resolve().parent
KINDS = {"profile": (1,), "cluster": (1,), "plan": (1, 2)}
"""The file kinds and versions with a shipped schema."""


def schema_file(kind: str, version: int) -> Path:
    return FOLDER / f"{kind}.v{version}.schema.json"


@functools.cache
def load(kind: str, version: int) -> Mapping[str, Any]:
    """The shipped schema of ``kind`` at ``version``."""
    doc: Mapping[str, Any] = json.loads(schema_file(kind, version).read_text(encoding="utf-8"))
    return doc


def validate(doc: Any, kind: str, version: int, source: str) -> None:
    """Raise :class:`FormatError` naming the first field of ``doc`` the schema refuses, and its value."""
    if kind not in KINDS or version not in KINDS[kind]:
        return
    schema = load(kind, version)
    _walk(doc, schema, schema, (), _Where(source, schema_file(kind, version).name))


class _Where:
    """Where an error is reported: the file and the schema file its hint names."""

    def __init__(self, source: str, schema_name: str) -> None:
        self.source, self.schema_name = source, schema_name

    def error(self, path: tuple[str | int, ...], message: str) -> FormatError:
        field = field_path(path) or "the document"
        return FormatError(f"{self.source}: {message}",
                           f"fix '{field}' (the fields and bounds: planner/schemas/{self.schema_name})")

    def fail(self, path: tuple[str | int, ...], problem: str) -> FormatError:
        return self.error(path, f"{field_path(path) or 'the document'} {problem}")


def field_path(path: tuple[str | int, ...]) -> str:
    """``("layers", 3, "name")`` -> ``layers[3].name``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def show(value: Any) -> str:
    """A short, escaped rendering of a value for a message."""
    if isinstance(value, dict):
        return f"an object of {len(value)} keys"
    if isinstance(value, list):
        return f"a list of {len(value)} items"
    text = json.dumps(value) if value is None or isinstance(value, bool) else repr(value)  # true, null; escaped
    return text if len(text) <= 60 else text[:57] + "..."


def _resolve(schema: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    while "$ref" in schema:
        ref = str(schema["$ref"])
        node: Any = root
        for part in ref.removeprefix("#/").split("/"):
            node = node[part]
        schema = node
    return schema


def _walk(value: Any, schema: Mapping[str, Any], root: Mapping[str, Any], path: tuple[str | int, ...],
          where: _Where) -> None:
    schema = _resolve(schema, root)
    if "enum" in schema and not any(_same(value, e) for e in schema["enum"]):
        raise where.error(path, f"unknown {field_path(path)} {show(value)}, expected one of "
                                f"{', '.join(map(json.dumps, schema['enum']))}")
    problem = _problem(value, schema)
    if problem:
        raise where.fail(path, problem)
    if isinstance(value, dict):
        _walk_object(value, schema, root, path, where)
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            _walk(item, schema["items"], root, (*path, i), where)


def _walk_object(value: dict[str, Any], schema: Mapping[str, Any], root: Mapping[str, Any],
                 path: tuple[str | int, ...], where: _Where) -> None:
    for key in schema.get("required", ()):
        if key not in value:
            raise where.error(path, f"{field_path(path) + ': ' if path else ''}missing field '{key}'")
    props = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        if key in props:
            _walk(item, props[key], root, (*path, key), where)
        elif extra is False:
            raise where.fail((*path, key), f"is not a known field (known: {', '.join(props)})")
        elif isinstance(extra, Mapping):
            _walk(item, extra, root, (*path, key), where)


_TYPES = {"object": "an object", "array": "a list", "string": "a string", "boolean": "true or false",
          "null": "null", "integer": "an integer", "number": "a number"}


def _is(value: Any, kind: str) -> bool:
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer())
    if kind == "number":
        whole = isinstance(value, int) and not isinstance(value, bool)  # any size: compared exactly, never as float
        return whole or (isinstance(value, float) and math.isfinite(value))
    python = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}[kind]
    return isinstance(value, python)


def _same(a: Any, b: Any) -> bool:
    """JSON equality: true is not 1."""
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def _problem(value: Any, schema: Mapping[str, Any]) -> str | None:
    """What ``value`` breaks of ``schema``'s own keywords (not its children), or None."""
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if not any(_is(value, k) for k in kinds):
            return f"is {show(value)}, expected {' or '.join(_TYPES[k] for k in kinds)}"
    if "const" in schema and not _same(value, schema["const"]):
        return f"is {show(value)}, expected {schema['const']!r}"
    return _bound_problem(value, schema)


def _bound_problem(value: Any, schema: Mapping[str, Any]) -> str | None:
    unit = f" ({schema['description']})" if "description" in schema else ""
    if _is(value, "number"):
        if "minimum" in schema and value < schema["minimum"]:
            return f"is {show(value)}, below the minimum {schema['minimum']:g}{unit}"
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            return f"is {show(value)}, must be above {schema['exclusiveMinimum']:g}{unit}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"is {show(value)}, above the maximum {schema['maximum']:g}{unit}"
    if isinstance(value, (str, list)):
        what = "characters" if isinstance(value, str) else "items"
        if len(value) < schema.get("minLength", schema.get("minItems", 0)):
            return f"is {show(value)}, too short (at least {schema.get('minLength', schema.get('minItems'))} {what})"
        most = schema.get("maxLength", schema.get("maxItems"))
        if most is not None and len(value) > most:
            return f"has {len(value)} {what}, more than the limit {most}"
    return None

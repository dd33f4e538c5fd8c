"""Field readers shared by the ``from_dict`` of every IR value: each names the field and value it rejects."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from planner.errors import FormatError, is_whole
from planner.jsonio import is_finite_number


def _object(d: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(d, Mapping):
        raise FormatError(f"{where}: expected an object, got {type(d).__name__}", "check the JSON structure")
    return d


def _get(d: Mapping[str, Any], key: str, where: str, default: Any = None) -> Any:
    """An optional field's value (``default`` when absent); a FormatError when ``d`` is no object."""
    return _object(d, where).get(key, default)


def _need(d: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in _object(d, where):
        raise FormatError(f"{where}: missing field '{key}'", f"add '{key}' (see DESIGN.md section 4)")
    return d[key]


def _str(d: Mapping[str, Any], key: str, where: str) -> str:
    value = _need(d, key, where)
    if not isinstance(value, str) or not value:
        raise FormatError(f"{where}.{key} must be a non-empty string, got {value!r}", f"fix '{key}'")
    return value


def _num(d: Mapping[str, Any], key: str, where: str, *, positive: bool = False) -> float:
    value = _need(d, key, where)
    if not is_finite_number(value) or value < 0 or (positive and value == 0):
        want = "a positive" if positive else "a non-negative"
        raise FormatError(f"{where}.{key} must be {want} finite number, got {value!r}", f"fix '{key}'")
    return float(value)


def _int(d: Mapping[str, Any], key: str, where: str, *, positive: bool = False) -> int:
    value = _need(d, key, where)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not is_whole(value, 1 if positive else 0):
        want = "a positive" if positive else "a non-negative"
        raise FormatError(f"{where}.{key} must be {want} integer, got {value!r}", f"fix '{key}'")
    return value


def _opt_int(d: Mapping[str, Any], key: str, where: str) -> int | None:
    return None if _get(d, key, where) is None else _int(d, key, where, positive=True)


def _opt_num(d: Mapping[str, Any], key: str, where: str, *, positive: bool = False) -> float | None:
    return None if _get(d, key, where) is None else _num(d, key, where, positive=positive)


def _bool(d: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    """An optional true/false field; anything else (a string "false", a number) is a FormatError."""
    value = _get(d, key, where, default)
    if not isinstance(value, bool):
        raise FormatError(f"{where}.{key} must be true or false, got {value!r:.40}", f"fix '{key}'")
    return value


def _opt_str(d: Mapping[str, Any], key: str, where: str, default: str) -> str:
    """An optional text field (``default`` when absent)."""
    value = _get(d, key, where, default)
    if not isinstance(value, str):
        raise FormatError(f"{where}.{key} must be a string, got {value!r:.40}", f"fix '{key}'")
    return value


def _list(d: Mapping[str, Any], key: str, where: str, *, nonempty: bool = True) -> list[Any]:
    value = _need(d, key, where)
    if not isinstance(value, list) or (nonempty and not value):
        want = "a non-empty list" if nonempty else "a list"
        raise FormatError(f"{where}.{key} must be {want}, got {value!r:.60}", f"fix '{key}'")
    return value


def _opt_list(d: Mapping[str, Any], key: str, where: str) -> list[Any]:
    """An optional list field ([] when absent or null)."""
    return [] if _get(d, key, where) is None else _list(d, key, where, nonempty=False)


def _wholes(value: Any) -> Any:
    """A list with its whole floats as ints (``[0.0, 4]`` reads ``[0, 4]``, as :func:`_int` reads ``4.0``); else
    ``value``."""
    if not isinstance(value, list):
        return value
    return [int(v) if isinstance(v, float) and v.is_integer() else v for v in value]


def _shape(value: Any, where: str) -> tuple[int, ...]:
    value = _wholes(value)
    ok = isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    if not ok:
        raise FormatError(f"{where} must be a list of positive integers, got {value!r}", "fix the shape")
    return tuple(value)


def _optional(obj: Any, keys: Sequence[str]) -> dict[str, Any]:
    """The optional fields of ``obj`` among ``keys`` that are set (None fields are left out)."""
    return {key: getattr(obj, key) for key in keys if getattr(obj, key) is not None}


def _check_part(where: str, part_key: str, part: float | None, whole_key: str, whole: float) -> None:
    """A time that is a part of another (fixed part, weight-gradient part) lies in [0, whole]."""
    if part is not None and not 0 <= part <= whole:
        raise FormatError(f"{where}.{part_key} ({part}) must lie in [0, {whole_key}={whole}]",
                          f"{part_key} is a part of {whole_key}")

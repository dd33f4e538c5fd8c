"""Plan-derived text in generated files: prose in docstrings and comments, TOML strings (pure: no torch).

A plan file is user input: its model, server and device names reach ``train.py``, the launch
scripts, DeepSpeed's hostfile, torchtitan's TOML and the READMEs. Where such a string is code it is
quoted for its language (``repr()`` in Python, ``shlex.quote`` in shell, :func:`toml_string` in
TOML); where it is prose (a docstring, a ``#`` comment, a heading) it goes through :func:`one_line`,
and inside a generated docstring through :func:`docstring_text`. Host names are checked, not quoted
(:func:`planner.export.nodes.check_host_names`). Ordinary names come out unchanged.
"""

from __future__ import annotations

_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def one_line(text: str) -> str:
    """``text`` for a comment or a heading: as it is when printable, else its ``repr()`` (one printable line)."""
    return text if text.isprintable() else repr(text)


def docstring_text(text: str) -> str:
    """``text`` inside a generated ``\"\"\"`` docstring: one line whose quotes and backslashes are escaped,
    so that it can neither end nor escape the docstring (the script's ``__doc__`` reads ``one_line(text)``)."""
    return one_line(text).replace("\\", "\\\\").replace('"', '\\"')


def docstring_fields(**fields: object) -> dict[str, object]:
    """``fields`` for a docstring template: strings through :func:`docstring_text`, numbers as they are."""
    return {k: docstring_text(v) if isinstance(v, str) else v for k, v in fields.items()}


def _toml_char(c: str) -> str:
    if c in _TOML_ESCAPES:
        return _TOML_ESCAPES[c]
    if c < " " or c == "\x7f":
        return f"\\u{ord(c):04X}"
    if "\ud800" <= c <= "\udfff":  # a lone surrogate (JSON allows one) has no TOML or UTF-8 form
        return "\\uFFFD"
    return c


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string: quotes, backslashes and control characters escaped."""
    return '"' + "".join(_toml_char(c) for c in text) + '"'

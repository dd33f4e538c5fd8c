"""export.quoting: plan-derived names in docstrings, comments and TOML strings cannot break out.

:data:`HOSTILE` and :func:`check_script` serve the engines' tests too (tests/test_export_torch.py,
tests/test_export_deepspeed.py): a ``train.py`` made for a hostile model name must compile and be the
same program as for an ordinary name, only its docstring's text and default ``--model`` differing.
"""

from __future__ import annotations

import ast

import pytest

from planner.export.quoting import docstring_fields, docstring_text, one_line, toml_string

HOSTILE = ['mlp"""; import os; os.system("id") #\\', 'x\n"""\nraise SystemExit(42)\n"""', "a'''b", "a\\", 'a\\"""',
           "it's \"quoted\"", "tab\there\r\n", "\x1b]0;pwned\x07", "a\\N{x}", "\u2028line\x85sep", "\ud800lone",
           "{model!r} {}"]
"""Model names that broke (or could break) a generated file: quotes, triple quotes, backslashes, newlines,
terminal codes, Unicode line separators, a lone surrogate (JSON allows one) and format fields."""


def _normalised(text: str) -> str:
    """The script's syntax tree with its docstring and ``script_args``' default model blanked."""
    tree = ast.parse(text)
    doc = tree.body[0]
    assert isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)
    doc.value.value = ""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "script_args":
            assert isinstance(node.args[1], ast.Constant)
            node.args[1].value = ""
    return ast.dump(tree)


def default_model(text: str) -> object:
    """The default ``--model`` a generated script passes to ``script_args``."""
    calls = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Call) and getattr(n.func, "id", "") ==
             "script_args"]
    assert len(calls) == 1
    return ast.literal_eval(calls[0].args[1])


def check_script(text: str, ordinary: str, model: str) -> None:
    """``text`` (made for ``model``) compiles, is ``ordinary``'s program, and keeps the name faithfully."""
    compile(text, "train.py", "exec")
    text.encode("utf-8")  # writable: no lone surrogate left
    assert _normalised(text) == _normalised(ordinary)
    assert default_model(text) == model
    doc = ast.get_docstring(ast.parse(text), clean=False) or ""
    assert doc.count("\n") == (ast.get_docstring(ast.parse(ordinary), clean=False) or "").count("\n")
    assert one_line(model) in doc


def test_printable_text_is_unchanged() -> None:
    for name in ("vgg16", "tests.test_runner:tiny_mlp", "llama3-8b", "Модель 8B", "it's"):
        assert one_line(name) == name


@pytest.mark.parametrize("name", HOSTILE)
def test_one_line_is_one_printable_line(name: str) -> None:
    line = one_line(name)
    assert line.isprintable() and len(line.splitlines()) == 1
    if not name.isprintable():
        assert ast.literal_eval(line) == name  # the repr: nothing lost


@pytest.mark.parametrize("name", HOSTILE)
def test_docstring_text_cannot_end_or_escape_a_docstring(name: str) -> None:
    source = f'"""Plan: {docstring_text(name)}, default {docstring_text(repr(name))}"""\nX = 1\n'
    tree = ast.parse(source)
    assert len(tree.body) == 2
    assert ast.literal_eval(tree.body[0].value) == f"Plan: {one_line(name)}, default {name!r}"  # type: ignore[attr-defined]


def test_docstring_fields_escape_strings_only() -> None:
    assert docstring_fields(model='a"', stages=3) == {"model": 'a\\"', "stages": 3}
    assert docstring_fields(model="vgg16", config="2-2") == {"model": "vgg16", "config": "2-2"}


@pytest.mark.parametrize("name", [*HOSTILE, "", "plain", "ä\t\x00\x7f\x1f"])
def test_toml_strings_round_trip(name: str) -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    value = tomllib.loads(f"s = {toml_string(name)}\n")["s"]
    assert value == name.replace("\ud800", "\ufffd")  # a lone surrogate has no TOML form

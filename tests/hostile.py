"""A generator of hostile inputs for every command, and the judge of what the CLI did with each.

Cases are made, not listed: every numeric field of a valid profile, cluster and plan is set to
each of :data:`BAD_NUMBERS`; names to markup and terminal codes; files to broken bytes, depth and
encodings; output paths to devices, links, folders and missing folders; plans to hand edits; model
factories to ones that exit, print or interrupt. :func:`run_case` runs one through click's
CliRunner in a folder of its own and :func:`judge` classifies the outcome (clean error, crash,
accepted-bad, rejected-good, files left, misleading). tests/test_hostile.py asserts every case is
clean; scripts/bench_reliability.py prints the counts.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import stat
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from planner.cli import main
from tests.conftest import make_cluster_dict, make_profile_dict

RAW = "__raw__:"
"""A string value written into the file as raw JSON text (e.g. ``1e400``)."""

BAD_NUMBERS: list[tuple[str, Any]] = [
    ("nan", float("nan")), ("inf", float("inf")), ("-inf", float("-inf")), ("1e400", RAW + "1e400"),
    ("negative", -1), ("1e308", 1e308), ("400-digits", 10**400), ("string", "12"), ("bool", True),
    ("null", None), ("list", [1]), ("object", {"x": 1}),
]
NAMES = ["[/]", "[/bold]", "\x1b]0;pwned\x07", "a\x1b[31mred", "$\\frac{", "[link=file:///etc]x[/link]"]


@dataclass(frozen=True)
class Case:
    """One hostile run: files to make, the command line (``{tmp}`` is the case's folder), what must happen.

    ``expect``: ``error`` (exit 1 or 2, one ``error:`` line, or click's ``Error:`` of a usage error), ``ok``
    (exit 0) or ``warn`` (exit 0 with a ``warning:`` line). ``message``: a fragment the error or warning must
    contain (``a|b``: either). ``outputs``: files
    in the folder a failed run must leave as they were (absent, or unchanged).
    """

    args: tuple[str, ...]
    files: tuple[tuple[str, bytes], ...] = ()
    expect: str = "error"
    message: str = ""
    outputs: tuple[str, ...] = ()
    setup: Callable[[Path], None] | None = field(default=None, compare=False)
    id: str = ""


def encode(doc: Any) -> bytes:
    text = json.dumps(doc)
    while f'"{RAW}' in text:
        start = text.index(f'"{RAW}')
        end = text.index('"', start + 1)
        text = text[:start] + text[start + 1 + len(RAW):end] + text[end + 1:]
    return text.encode()


def mutate(doc: dict[str, Any], path: tuple[str | int, ...], value: Any, delete: bool = False) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    node: Any = out
    for key in path[:-1]:
        node = node[key]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return out


@cache
def base_docs() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """A valid profile, cluster and a runnable two-stage plan of them (prediction = simulation)."""
    from planner import ir
    from planner.search import search

    profile, cluster = make_profile_dict(4, batch_size=16), make_cluster_dict(2, 2)
    plan = search(ir.ModelProfile.from_dict(profile), ir.Cluster.from_dict(cluster), config=(2, 2), microbatches=4)
    return profile, cluster, plan.to_dict()


def _search(profile: bytes, cluster: bytes, *extra: str, **kw: Any) -> Case:
    return Case(args=("search", "{tmp}/p.json", "--cluster", "{tmp}/c.json", "-o", "{tmp}/out.json", "--json",
                      "--rerank", "0", *extra), files=(("p.json", profile), ("c.json", cluster)),
                outputs=("out.json",), **kw)


def _simulate(plan: bytes, plot: bool = False, **kw: Any) -> Case:
    picture = ("--plot", "{tmp}/g.png") if plot else ()  # matplotlib takes a second or two: a few cases draw
    return Case(args=("simulate", "{tmp}/plan.json", "--json", "--trace", "{tmp}/t.json", *picture),
                files=(("plan.json", plan),), outputs=("t.json", "g.png"), **kw)


PROFILE_NUMBERS = [("batch_size",), ("device_flops",), ("layers", 0, "forward_s"), ("layers", 1, "param_bytes"),
                   ("layers", 2, "forward_flops"), ("layers", 3, "saved_bytes")]
CLUSTER_NUMBERS = [("nodes", 0, "gpus", 0, "flops"), ("nodes", 1, "gpus", 1, "memory_bytes"),
                   ("links", "inter_node", "bandwidth_Bps"), ("links", "intra_node", "latency_s"),
                   ("nodes", 0, "threads")]
PLAN_NUMBERS = [("microbatches",), ("predicted", "iteration_s"), ("stages", 0, "memory_bytes"),
                ("profile", "layers", 0, "backward_s"), ("cluster", "nodes", 0, "gpus", 0, "flops")]


def number_cases() -> Iterator[Case]:
    profile, cluster, plan = base_docs()
    for name, value in BAD_NUMBERS:
        for path in PROFILE_NUMBERS:
            yield _search(encode(mutate(profile, path, value)), encode(cluster), id=f"profile.{path[-1]}={name}",
                          message=str(path[-1]) if name != "400-digits" else "digits")
        for path in CLUSTER_NUMBERS:
            yield _search(encode(profile), encode(mutate(cluster, path, value)), id=f"cluster.{path[-1]}={name}",
                          message=str(path[-1]) if name != "400-digits" else "digits")
        for path in PLAN_NUMBERS:
            yield _simulate(encode(mutate(plan, path, value)), id=f"plan.{'.'.join(map(str, path))}={name}",
                            message=str(path[-1]) if name != "400-digits" else "digits")


def structure_cases() -> Iterator[Case]:
    profile, cluster, plan = base_docs()
    for key in ("model", "batch_size", "layers", "device_flops"):
        yield _search(encode(mutate(profile, (key,), None, delete=True)), encode(cluster),
                      id=f"profile-missing-{key}", message=key)
    for key in ("nodes", "links", "name"):
        yield _search(encode(profile), encode(mutate(cluster, (key,), None, delete=True)),
                      id=f"cluster-missing-{key}", message=key)
    for key in ("stages", "profile", "cluster", "predicted", "schedule"):
        yield _simulate(encode(mutate(plan, (key,), None, delete=True)), id=f"plan-missing-{key}", message=key)
    for doc, label, kind in ((profile, "profile", "search"), (plan, "plan", "simulate")):
        for value, message in (("1", "'version' is '1'"), (7, "'version' is 7"), (True, "'version' is True")):
            bad = encode(mutate(doc, ("version",), value))
            yield (_search(bad, encode(cluster), id=f"{label}-version-{value!r}", message=message) if kind == "search"
                   else _simulate(bad, id=f"{label}-version-{value!r}", message=message))
    yield _search(encode(plan), encode(cluster), id="plan-as-profile", message="expected 'profile'")
    yield _search(encode(mutate(profile, ("layers",), [])), encode(cluster), id="no-layers", message="layers")
    yield _search(encode(profile), encode(mutate(cluster, ("nodes", 0, "gpus", 0, "peak_flops"), {"fp8": 1e15})),
                  id="peak-fp8", message="fp8")
    yield _search(encode(profile), encode(mutate(cluster, ("nodes", 1, "gpus", 0, "name"), "n0.g0")),
                  id="duplicate-gpu", message="unique")


def name_cases() -> Iterator[Case]:
    """Markup and terminal codes in names are shown escaped; empty and endless names are refused."""
    profile, cluster, plan = base_docs()
    for i, name in enumerate(NAMES):
        yield _search(encode(mutate(profile, ("layers", 1, "name"), name)),
                      encode(mutate(cluster, ("nodes", 0, "gpus", 1, "name"), name)), id=f"name-{i}", expect="ok")
        yield _search(encode(mutate(profile, ("model",), name)), encode(mutate(cluster, ("name",), name)),
                      id=f"model-name-{i}", expect="ok")
        rescaled = mutate(mutate(profile, ("device",), name), ("device_flops",), 5e11)  # search's note names both
        yield _search(encode(rescaled), encode(mutate(cluster, ("name",), name)), id=f"device-name-{i}", expect="ok")
        renamed = mutate(mutate(plan, ("model",), name), ("profile", "model"), name)
        yield _simulate(encode(mutate(renamed, ("cluster", "name"), name)), plot=i in (0, 4), id=f"plan-name-{i}",
                        expect="ok")
    yield _search(encode(mutate(profile, ("model",), "")), encode(cluster), id="empty-name", message="model")
    yield _search(encode(mutate(profile, ("model",), "m" * 5000)), encode(cluster), id="long-name", message="model")


def raw_text_cases() -> Iterator[Case]:
    profile, cluster, _ = base_docs()
    text = encode(profile)
    raws: list[tuple[str, bytes, str]] = [
        ("empty", b"", "not valid JSON"), ("deep", b"[" * 200_000, "nested deeper"),
        ("deep-object", b'{"a":' * 100_000, "nested deeper"),
        ("latin1", text.replace(b'"toy"', b'"caf\xe9"'), "not UTF-8"), ("binary", b"\x89PNG\r\n\x1a\n\0\0", "UTF-8"),
        ("null", b"null", "expected a JSON object"), ("list", b"[]", "expected a JSON object"),
        ("number", b"42", "expected a JSON object"), ("truncated", text[: len(text) // 2], "not valid JSON"),
        ("duplicate", text.replace(b'"batch_size": 16', b'"batch_size": 16, "batch_size": 64'), "duplicate key"),
        ("nan-literal", text.replace(b'"forward_s": 0.01', b'"forward_s": NaN', 1), "forward_s"),
        ("long-int", text.replace(b'"batch_size": 16', b'"batch_size": ' + b"9" * 5000), "digits"),
        ("utf16", json.dumps(profile).encode("utf-16"), "UTF-8"),
    ]
    for name, raw, message in raws:
        yield _search(raw, encode(cluster), id=f"raw-{name}", message=message)
    yield _search(b"\xef\xbb\xbf" + text, encode(cluster), id="raw-bom", expect="ok")
    yield _search(text.replace(b'"batch_size": 16', b'"batch_size": 16.0'), encode(cluster), id="int-as-float",
                  expect="ok")
    yield Case(("search", "{tmp}", "--cluster", "{tmp}/c.json"), (("c.json", encode(cluster)),), id="input-is-folder",
               message="folder|directory")
    yield Case(("search", "{tmp}/zero", "--cluster", "{tmp}/c.json"), (("c.json", encode(cluster)),),
               id="input-is-device", message="not a regular file", setup=device("zero", 5))
    yield Case(("search", "{tmp}/fifo", "--cluster", "{tmp}/c.json"), (("c.json", encode(cluster)),),
               id="input-is-fifo", message="not a regular file", setup=lambda tmp: os.mkfifo(tmp / "fifo"))
    yield Case(("simulate", "{tmp}/none.json"), id="input-missing", message="no such file")


def _scaled_times(plan: dict[str, Any], factor: float) -> dict[str, Any]:
    out = copy.deepcopy(plan)
    for layer in out["profile"]["layers"]:
        for key in ("forward_s", "backward_s"):
            layer[key] *= factor
    return out


def _plan_edits(plan: dict[str, Any]) -> list[tuple[str, dict[str, Any], str, str]]:
    """(name, edited plan, expected outcome, message fragment) of every hand edit."""
    return [
        ("batch-size", mutate(plan, ("batch_size",), 32), "error", "batch_size"),
        ("model", mutate(plan, ("model",), "other"), "error", "model"),
        ("engine", mutate(plan, ("engine",), "tensorflow"), "error", "engine"),
        ("solver", mutate(plan, ("solver",), "magic"), "error", "solver"),
        ("schedule", mutate(plan, ("schedule",), "zigzag"), "error", "schedule"),
        ("config", mutate(plan, ("config",), "3-1"), "error", "config"),
        ("dp", mutate(plan, ("stages", 0, "dp"), 1), "error", "dp"),
        ("micro-batch", mutate(plan, ("stages", 1, "micro_batch_size"), 3), "error", "micro_batch_size"),
        ("device", mutate(plan, ("stages", 1, "devices"), ["n9.g9", "n1.g1"]), "error", "n9.g9"),
        ("device-twice", mutate(plan, ("stages", 1, "devices"), ["n1.g0", "n1.g0"]), "error", "twice"),
        ("layers-gap", mutate(mutate(plan, ("stages", 1, "layers"), [3, 4]), ("stages", 1, "forms"), ["dp"]), "error",
         "no stage"),
        ("forms", mutate(plan, ("stages", 0, "forms"), ["dp"]), "error", "forms"),
        ("form-name", mutate(plan, ("stages", 0, "forms"), ["dp", "diagonal"]), "error", "diagonal"),
        ("tp", mutate(plan, ("stages", 0, "tp"), 3), "error", "tp"),
        ("zero", mutate(plan, ("stages", 0, "zero"), 5), "error", "zero"),
        ("recompute", mutate(plan, ("stages", 0, "recompute"), "always"), "error", "recompute"),
        ("recompute-bool-v2", mutate(plan, ("stages", 0, "recompute"), True), "error", "recompute"),
        ("virtual", mutate(plan, ("virtual_stages",), 2), "error", "virtual"),
        ("precision", mutate(plan, ("precision",), "fp8"), "error", "precision"),
        ("microbatches", mutate(plan, ("microbatches",), 3), "error", "micro"),
        ("bubble", mutate(plan, ("predicted", "bubble_fraction"), 1.5), "error", "bubble_fraction"),
        ("times-x1000", _scaled_times(plan, 1000), "warn", "simulates to"),
        ("prediction-x2", mutate(plan, ("predicted", "iteration_s"), plan["predicted"]["iteration_s"] * 2), "warn",
         "simulates to"),
        ("fractional-micro-batch", mutate(mutate(plan, ("microbatches",), 16), ("stages", 0, "micro_batch_size"), 0.5),
         "error", "micro_batch_size"),
        ("version-1", {**mutate(plan, ("version",), 1), "stages": [
            {k: v for k, v in s.items() if k not in ("tp", "dp", "zero", "sequence_parallel", "micro_batch_size")}
            | {"recompute": False} for s in plan["stages"]]}, "ok", ""),
        ("valid", plan, "ok", ""),
    ]


def plan_edit_cases() -> Iterator[Case]:
    """Hand edits: fields that disagree with the plan's own profile, stages or cluster."""
    _, _, plan = base_docs()
    edits = _plan_edits(plan)
    for name, doc, expect, message in edits:
        yield _simulate(encode(doc), plot=expect == "error" and name in ("engine", "device"), id=f"plan-edit-{name}",
                        expect=expect, message=message)
    for name in ("batch-size", "engine", "device"):
        doc = next(d for n, d, _, _ in edits if n == name)
        yield Case(("export", "{tmp}/plan.json", "--to", "torch", "-o", "{tmp}/ex"), (("plan.json", encode(doc)),),
                   id=f"export-plan-edit-{name}", outputs=("ex",))
        yield Case(("run", "{tmp}/plan.json", "--model", "mlp"), (("plan.json", encode(doc)),),
                   id=f"run-plan-edit-{name}")


def device(name: str, minor: int) -> Callable[[Path], None]:
    """A character device of the case's own (minor 7: like /dev/full, 5: /dev/zero, 3: /dev/null), never the
    system's: a writer that regressed would replace only this one. Without the right to make one: a pipe."""
    def setup(tmp: Path) -> None:
        try:
            os.mknod(tmp / name, stat.S_IFCHR | 0o666, os.makedev(1, minor))
        except PermissionError:
            os.mkfifo(tmp / name)
    return setup


def _link(name: str, target: str) -> Callable[[Path], None]:
    return lambda tmp: os.symlink(target if target.startswith("/") else tmp / target, tmp / name)


def _make(name: str, kind: str) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        if kind == "dir":
            (tmp / name).mkdir()
        elif kind == "fifo":
            os.mkfifo(tmp / name)
        else:
            (tmp / name).write_text("previous")
    return setup


def path_cases() -> Iterator[Case]:
    """Odd output paths for every command that writes."""
    profile, cluster, plan = base_docs()
    inputs = (("p.json", encode(profile)), ("c.json", encode(cluster)))
    odd: list[tuple[str, str, str, Callable[[Path], None] | None, str]] = [
        ("empty", "", "error", None, "empty"), ("folder", "{tmp}/d", "error", _make("d", "dir"), "folder|directory"),
        ("missing-folder", "{tmp}/missing/dir/x", "error", None, "does not exist"),
        ("dev-full", "{tmp}/full", "error", device("full", 7), "not a regular file"),
        ("link-to-device", "{tmp}/ln", "error", lambda t: (device("full", 7)(t), _link("ln", "full")(t)),
         "not a regular file"),
        ("fifo", "{tmp}/ff", "error", _make("ff", "fifo"), "not a regular file"),
        ("link-to-folder", "{tmp}/ld", "error", lambda t: (_make("d", "dir")(t), _link("ld", "d")(t)),
         "folder|directory"),
        ("link-to-file", "{tmp}/lf", "ok", lambda t: (_make("real", "file")(t), _link("lf", "real")(t)), ""),
        ("dangling-link", "{tmp}/dl", "ok", _link("dl", "new-target"), ""),
        ("existing-file", "{tmp}/old", "ok", _make("old", "file"), ""),
        ("markup-name", "{tmp}/[/]x.json", "ok", _make("[", "dir"), ""),  # prints as .../[/]x.json
    ]
    for name, path, expect, setup, message in odd:
        out = path.removeprefix("{tmp}/") if path.startswith("{tmp}/") else ""
        keep = (out,) if out and expect == "error" else ()
        yield Case(("search", "{tmp}/p.json", "--cluster", "{tmp}/c.json", "--rerank", "0", "-o", path), inputs,
                   expect, message, keep, setup, id=f"search-o-{name}")
        yield Case(("simulate", "{tmp}/plan.json", "--trace", path), (("plan.json", encode(plan)),), expect,
                   message, keep, setup, id=f"simulate-trace-{name}")
        if expect == "error":
            yield Case(("calibrate", "-o", path), (), expect, message, keep, setup, id=f"calibrate-o-{name}")
            yield Case(("profile", "mlp", "--mode", "analytic", "-o", path), (), expect, message, keep, setup,
                       id=f"profile-o-{name}")
            yield Case(("compare", "{tmp}/p.json", "--cluster", "{tmp}/c.json", "--strategies", "dp", "--plot",
                        path), inputs, expect, message, keep, setup, id=f"compare-plot-{name}")
    for name, setup, message in (("file", _make("ex", "file"), "not a folder|is a file"), ("empty", None, "empty")):
        yield Case(("export", "{tmp}/plan.json", "--to", "torch", "-o", "{tmp}/ex" if name == "file" else ""),
                   (("plan.json", encode(plan)),), "error", message, ("ex",), setup, id=f"export-o-{name}")


def multi_output_cases() -> Iterator[Case]:
    """A command with several outputs leaves none when one of them fails."""
    profile, cluster, plan = base_docs()
    files = (("plan.json", encode(plan)),)
    yield Case(("simulate", "{tmp}/plan.json", "--plot", "{tmp}/ok.png", "--trace", "{tmp}/missing/t.json"), files,
               message="does not exist", outputs=("ok.png",), id="plot-ok-trace-missing")
    yield Case(("simulate", "{tmp}/plan.json", "--trace", "{tmp}/t.json", "--plot", "{tmp}/d"), files,
               message="folder|directory", outputs=("t.json",), setup=_make("d", "dir"), id="trace-ok-plot-folder")
    yield Case(("simulate", "{tmp}/plan.json", "--trace", "{tmp}/same", "--plot", "{tmp}/same"), files,
               message="same file", outputs=("same",), id="same-output-twice")
    yield Case(("simulate", "{tmp}/plan.json", "--trace", "{tmp}/t.json", "--plot", "{tmp}/g.png"), files,
               expect="ok", id="trace-and-plot")
    inputs = (("p.json", encode(profile)), ("c.json", encode(cluster)))
    yield Case(("compare", "{tmp}/p.json", "--cluster", "{tmp}/c.json", "--strategies", ""), inputs,
               message="no strategy", id="compare-no-strategies")
    yield Case(("compare", "{tmp}/p.json", "--cluster", "{tmp}/c.json", "--strategies", " , "), inputs,
               message="no strategy", id="compare-blank-strategies")
    yield Case(("compare", "{tmp}/p.json", "--cluster", "{tmp}/c.json", "--strategies", "dp,magic"), inputs,
               message="magic", id="compare-unknown-strategy")
    yield Case(("calibrate", "-o", "{tmp}/x.json", "--match-profile", "{tmp}/p.json"),
               (("p.json", b"[" * 100_000),), message="nested", outputs=("x.json",), id="calibrate-bad-profile")


FACTORIES = {
    "exit0": ("import sys\ndef build():\n    sys.exit(0)\n", "exit(0)"),
    "exit-text": ("import sys\ndef build():\n    sys.exit('bye')\n", "exit('bye')"),
    "interrupt": ("def build():\n    raise KeyboardInterrupt\n", "KeyboardInterrupt"),
    "import-exit": ("import sys\nsys.exit(3)\ndef build():\n    pass\n", "exit(3)"),
    "raises": ("def build():\n    raise ValueError('[/] no')\n", "ValueError"),
    "junk": ("def build():\n    return 42\n", "int"),
}


def factory_cases() -> Iterator[Case]:
    """Model factories that exit, interrupt, raise or return junk; one that prints keeps --json clean."""
    for name, (code, message) in FACTORIES.items():
        module = f"hostile_factory_{name.replace('-', '_')}"
        yield Case(("profile", f"{module}:build", "--mode", "analytic", "--input-shape", "8", "-o", "{tmp}/p.json",
                    "--json"), ((f"{module}.py", code.encode()),), message=message, outputs=("p.json",),
                   id=f"factory-{name}")
    printing = ("import sys\nfrom torch import nn\nprint('hello from import')\ndef build():\n"
                "    print('hello from factory')\n"
                "    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))\n")
    yield Case(("profile", "hostile_factory_print:build", "--mode", "analytic", "--input-shape", "8", "--json"),
               (("hostile_factory_print.py", printing.encode()),), expect="ok", id="factory-prints")


def option_cases() -> Iterator[Case]:
    """Option values torch or the timing loops would take as they are: a million threads crashed profile and run
    (torch started them: a segmentation fault, exit 139), 10**23 repeats profiled until killed."""
    for option, value in (("--threads", "1000000"), ("--repeats", str(10**23)), ("--warmup", str(10**23))):
        yield Case(("profile", "mlp", "-b", "2", option, value, "-o", "{tmp}/p.json"), message=option,
                   outputs=("p.json",), id=f"profile{option}-huge")
    _, _, plan = base_docs()
    yield Case(("run", "{tmp}/plan.json", "--model", "mlp", "--threads", "1000000"), (("plan.json", encode(plan)),),
               message="--threads", id="run--threads-huge")


def all_cases() -> list[Case]:
    groups = (number_cases, structure_cases, name_cases, raw_text_cases, plan_edit_cases, path_cases,
              multi_output_cases, factory_cases, option_cases)
    return [case for group in groups for case in group()]


@dataclass(frozen=True)
class Outcome:
    """What a case did: its exit code, output and the verdict of :func:`judge`."""

    case: Case
    exit_code: int
    stdout: str
    stderr: str
    verdict: str
    why: str = ""


def _snapshot(tmp: Path) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    for p in tmp.rglob("*"):
        if p.is_file() and not p.is_symlink():
            out[str(p.relative_to(tmp))] = p.read_bytes()
        else:
            out[str(p.relative_to(tmp))] = None
    return out


CASE_TIMEOUT_S = 60


def _timed_out(signum: int, frame: Any) -> None:
    raise TimeoutError(f"the case ran past {CASE_TIMEOUT_S} s")


def run_case(case: Case, tmp: Path) -> Outcome:
    """Run ``case`` in the empty folder ``tmp`` (made current, so factories import from it) and judge it."""
    for name, data in case.files:
        (tmp / name).write_bytes(data)
    if case.setup is not None:
        case.setup(tmp)
    before = _snapshot(tmp)
    args = [a.replace("{tmp}", str(tmp)) for a in case.args]
    cwd = os.getcwd()
    os.chdir(tmp)
    previous = signal.signal(signal.SIGALRM, _timed_out)
    signal.alarm(CASE_TIMEOUT_S)  # a reader blocked on a pipe or reading a device forever is a crash, not a hang
    try:
        result = CliRunner().invoke(main, args)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        os.chdir(cwd)
        for name in [m for m in sys.modules if m.startswith("hostile_factory_")]:
            del sys.modules[name]
    crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
    stderr = result.stderr + (f"\nTraceback: {result.exception!r}" if crashed else "")
    verdict, why = judge(case, result.exit_code, result.stdout, stderr, before, _snapshot(tmp))
    return Outcome(case, result.exit_code, result.stdout, stderr, verdict, why)


VERDICTS = ("clean", "crash", "accepted-bad", "rejected-good", "files-left", "misleading")


def judge(case: Case, code: int, stdout: str, stderr: str, before: dict[str, bytes | None],
          after: dict[str, bytes | None]) -> tuple[str, str]:
    """One of :data:`VERDICTS` and why."""
    errors = [line for line in stderr.splitlines() if line.startswith(("error: ", "Error: "))]  # ours, click's
    if "Traceback" in stderr or "internal error" in stderr:
        return "crash", (errors or stderr.splitlines() or [""])[-1]
    temps = [name for name in after if Path(name).name.startswith(".") and name not in before]
    if temps:
        return "files-left", f"temporary files {temps}"
    if case.expect == "error":
        if code == 0:
            return "accepted-bad", "exit 0"
        changed = [o for o in case.outputs if after.get(o, "absent") != before.get(o, "absent")]
        if changed:
            return "files-left", f"outputs {changed} changed by a failed run"
        if code not in (1, 2) or len(errors) != 1 or stdout:
            return "misleading", f"exit {code}, {len(errors)} error lines, stdout {stdout[:40]!r}"
        if not any(part in errors[0] for part in case.message.split("|")):
            return "misleading", f"{case.message!r} not in {errors[0]!r}"
        return "clean", ""
    if code != 0:
        return "rejected-good", (errors or [f"exit {code}"])[0]
    if "\x1b" in stderr or "\x07" in stderr:
        return "misleading", "a terminal control code reached stderr"
    if "--json" in case.args:
        try:
            json.loads(stdout)
        except ValueError:
            return "misleading", f"stdout is not one JSON document: {stdout[:60]!r}"
    if case.expect == "warn" and not any(case.message in line for line in stderr.splitlines()
                                         if line.startswith("warning: ")):
        return "misleading", f"no warning with {case.message!r}"
    return "clean", ""

"""The README and examples/ stand alone: every command block runs as written, the library snippet
runs, and no document points outside the repository.

The README's ```bash blocks run in order, each as one bash script with ``set -e``, in one fresh
folder that holds links to ``examples/`` and ``profiles/`` (as the clone's root does), with the
test's Python environment's ``bin`` first on PATH (``planner``, ``torchrun``) and this checkout
on PYTHONPATH. A block preceded by ``<!-- docs-test: skip (why) -->`` is not run; the README
says why beside it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SKIP = "<!-- docs-test: skip"
BLOCK = re.compile(r"(?P<before>[^\n]*)\n```(?P<lang>\w*)\n(?P<body>.*?)\n```", re.S)


def blocks(text: str, lang: str) -> list[tuple[str, bool]]:
    """The ``lang`` code blocks of a Markdown text: (body, marked to skip)."""
    return [(m["body"], m["before"].startswith(SKIP)) for m in BLOCK.finditer(text) if m["lang"] == lang]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(ROOT)
    env.pop("PLANNER_PROGRESS", None)
    return env


def _bash(script: str, cwd: Path, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", "set -euo pipefail\n" + script], cwd=cwd, env=_env(), text=True,
                          capture_output=True, timeout=timeout_s)


def test_blocks_are_found_and_skips_are_explained() -> None:
    text = README.read_text()
    bash = blocks(text, "bash")
    assert len(bash) >= 3 and any("planner search" in b for b, _ in bash)
    skipped = [b for b, skip in bash if skip]
    assert all("scripts/" in b for b in skipped), "only the setup scripts may be left out"
    assert re.findall(r"<!-- docs-test: skip \(.+?\) -->", text), "a skip says why"


def _runnable() -> list[str]:
    """The README's bash blocks the test runs (not the skipped ones, not the venv activation, which the
    test does itself by putting the venv's bin first on PATH)."""
    return [b for b, skip in blocks(README.read_text(), "bash") if not skip and not b.startswith("source .venv")]


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(_runnable())))
def test_readme_commands_run_as_written(index: int, tmp_path: Path) -> None:
    """Each block in a fresh folder, as in a fresh clone's root; every ``-o`` output must then exist."""
    body = _runnable()[index]
    for name in ("examples", "profiles"):
        (tmp_path / name).symlink_to(ROOT / name)
    done = _bash(body, tmp_path)
    assert done.returncode == 0, f"{body}\n--- stderr:\n{done.stderr[-3000:]}"
    outputs = re.findall(r"-o (\S+)", body) + re.findall(r"--(?:plot|trace) (\S+)", body)
    assert outputs
    for name in outputs:
        assert (tmp_path / name).exists(), name


def test_readme_sample_explanation_is_what_search_prints() -> None:
    """The 'why this plan' sample in the README is the output for the shipped VGG16 profile, line by line."""
    text = README.read_text()
    sample = next(b for b in re.findall(r"```text\n(.*?)\n```", text, re.S) if "why this plan" in b)
    done = _bash("planner search profiles/vgg16-b64-2080ti.json --cluster pipepar-4x2-2080ti", ROOT, 120)
    assert done.returncode == 0, done.stderr[-2000:]
    for line in sample.splitlines():
        assert line.strip() in done.stderr, line


@pytest.mark.slow
def test_readme_llama_figures_are_what_search_prints(tmp_path: Path) -> None:
    """The Llama case's quoted iterations (plain data parallel, and the 8 x 8 grid without --micro-batch-size 1)
    are what search predicts now: they stayed at 996 and 1422 ms after the H100's sustained share changed."""
    text = README.read_text()
    dp_ms = re.search(r"\(`1 x 64`, (\d+) ms\)", text)
    grid_ms = re.search(r"samples, (\d+) ms, which beats", text)
    assert dp_ms and grid_ms, "the README's Llama paragraph quotes both iterations"
    search = "planner search llama3-8b.json --cluster h100-8x8-nvlink-ib --optimizer adam --json"
    done = _bash("planner profile llama3-8b --mode analytic --device-flops h100 --dtype bfloat16 --batch-size 64 "
                 f"-o llama3-8b.json\n{search} > dp.json\n{search} --tp 8 --zero 1 --recompute full > grid.json",
                 tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    for name, quoted, grid in (("dp.json", dp_ms, (1, 64)), ("grid.json", grid_ms, (8, 8))):
        plan = json.loads((tmp_path / name).read_text())
        assert [(s["tp"], s["dp"]) for s in plan["stages"]] == [grid], name
        assert round(plan["predicted"]["iteration_s"] * 1e3) == int(quoted[1]), name
    assert json.loads((tmp_path / "dp.json").read_text())["stages"][0]["zero"] == 3  # "with ZeRO-3"


def test_readme_library_snippet_runs() -> None:
    (snippet,) = [b for b, _ in blocks(README.read_text(), "python")]
    done = subprocess.run([sys.executable, "-c", snippet], cwd=ROOT, env=_env(), text=True, capture_output=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    config, iteration_s, bubble = done.stdout.split()
    assert re.fullmatch(r"\d+(-\d+)*", config) and float(iteration_s) > 0 and 0 <= float(bubble) < 1


def test_own_model_example_profiles_into_several_layers(tmp_path: Path) -> None:
    out = tmp_path / "mine.json"
    done = _bash(f"planner profile examples.own_model:build --input-shape 3,32,32 --batch-size 8 "
                 f"--mode analytic -o {out}", ROOT, timeout_s=120)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["kind"] == "profile" and len(doc["layers"]) >= 4  # three conv blocks, then the head


def test_example_cluster_loads_and_has_every_field_explained() -> None:
    from planner.cluster import load_cluster

    cluster = load_cluster(str(ROOT / "examples" / "cluster.json"))
    assert len(cluster.gpus) == 8 and len(cluster.nodes) == 2
    readme = (ROOT / "examples" / "README.md").read_text()
    doc = json.loads((ROOT / "examples" / "cluster.json").read_text())
    fields = {*doc, *doc["nodes"][0]["gpus"][0], "intra_node", "inter_node"}
    for field in fields:
        assert f"`{field}`" in readme or f".{field}`" in readme, field


@pytest.mark.parametrize("doc", ["README.md", "docs/contracts.md", "docs/reproduction.md", "examples/README.md",
                                 "profiles/README.md"])
def test_documents_do_not_point_outside_the_repository(doc: str) -> None:
    text = (ROOT / doc).read_text()
    assert "../shared" not in text and "/work/" not in text
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        if not target.startswith(("http://", "https://")):
            assert ((ROOT / doc).parent / target).exists(), f"{doc} links to missing {target}"


def _contract_rows() -> dict[str, str]:
    """docs/contracts.md's commands table: command name -> the row's text."""
    text = (ROOT / "docs" / "contracts.md").read_text()
    return {m[1]: m[0] for m in re.finditer(r"^\| `planner (\w+)[^|]*\|.*$", text, re.M)}


def test_contract_options_are_the_commands_options() -> None:
    """Every option a command takes is named in its docs/contracts.md row, and every option a row
    names is one the command takes (a user who copies it gets no 'No such option')."""
    import click

    from planner.cli import main

    rows = _contract_rows()
    assert set(rows) == set(main.list_commands(click.Context(main)))
    for name, row in rows.items():
        command = main.get_command(click.Context(main), name)
        assert command is not None
        taken = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts) if opt.startswith("--")}
        taken -= {"--help", "--no-progress"}
        named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", row)) | ({"--output"} if " -o " in row else set())
        assert taken - named == set(), f"planner {name}: not in docs/contracts.md"
        assert named - taken == set(), f"planner {name}: docs/contracts.md names options it lacks"


@pytest.mark.parametrize("doc", ["README.md", "docs/contracts.md", "docs/reproduction.md", "docs/architecture.md"])
def test_documented_module_paths_exist(doc: str) -> None:
    """A `planner/...` path a document names is a file or folder of this checkout."""
    for path in re.findall(r"`(planner/[\w/]+(?:\.py)?)`", (ROOT / doc).read_text()):
        assert (ROOT / path).exists(), f"{doc} names missing {path}"


def _layout_block() -> str:
    """The README's layout block (its code block under 'Layout and development'), the planner/ part."""
    text = README.read_text()
    block = text[text.index("## Layout and development"):].split("```")[1]
    return block[:block.index("\nprofiles/")]


def _modules(folder: Path) -> set[str]:
    return {p.stem for p in folder.glob("*.py") if not p.stem.startswith("_")}


def test_readme_layout_lists_every_module() -> None:
    """The README's layout names every package of planner/ with exactly its modules, and every top-level module
    (it had missed 30 modules, and named a render/ of 'rich, matplotlib', which are libraries)."""
    block = _layout_block()
    groups = {m[1]: set(re.findall(r"\w+", m[2])) for m in re.finditer(r"(\w+)/ \(([^)]*)\)", block)}
    packages = {p.name for p in (ROOT / "planner").iterdir() if (p / "__init__.py").exists()}
    assert set(groups) == packages, "the layout names each package of planner/ with its modules in ( )"
    for name, listed in groups.items():
        assert listed == _modules(ROOT / "planner" / name), f"planner/{name}/"
    top = {p.stem for p in (ROOT / "planner").glob("*.py") if p.stem != "__init__"}
    assert set(re.findall(r"([\w]+)\.py", block)) == top


def _architecture_row(module: str) -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and f"`{module}`" in line.split(" | ")[0]]
    assert rows, f"docs/architecture.md's module map has no row for {module}"
    return rows[0]


@pytest.mark.parametrize("package", ["costmodel", "schedule", "simulate", "search"])
def test_architecture_names_each_algorithm_module(package: str) -> None:
    """docs/architecture.md's row of each algorithm package says what each of its modules owns (it had left out
    schedule/generators, where every schedule's order lives, and costmodel/whole_tensors)."""
    row = _architecture_row(f"planner/{package}/")
    for module in _modules(ROOT / "planner" / package):
        assert f"`{module}`" in row, f"planner/{package}/{module}.py"


def test_architecture_names_each_top_level_module_and_package() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    for path in (ROOT / "planner").iterdir():
        if path.suffix == ".py" and path.stem not in ("__init__", "__main__"):
            assert f"`planner/{path.name}`" in text, path.name
        elif (path / "__init__.py").exists():
            assert f"`planner/{path.name}/`" in text, path.name


def _pipepar_rows() -> list[list[str]]:
    """docs/pipepar/speedups.md (written by scripts/reproduce_pipepar.py): header, then one row per model."""
    lines = (ROOT / "docs" / "pipepar" / "speedups.md").read_text().splitlines()
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith("| ")
            and not line.startswith("|---")]


def test_reproduction_table_and_ranges_are_the_generated_ones() -> None:
    """docs/reproduction.md's speedup table is docs/pipepar/speedups.md's (less its two DeepSpeed method columns),
    and the ranges it quotes are that table's (they had stayed at 2.14x over AccPar after the ResNets' rose)."""
    header, *rows = _pipepar_rows()
    text = (ROOT / "docs" / "reproduction.md").read_text()
    keep = [i for i, name in enumerate(header) if name not in ("deepspeed-parameters", "deepspeed-uniform")]
    quoted = [line for line in text.splitlines() if re.match(r"\| (vgg|resnet)\d+ \|", line)]
    assert quoted == ["| " + " | ".join(row[i] for i in keep) + " |" for row in rows]
    col = {name: i for i, name in enumerate(header)}

    def span(family: str, name: str) -> tuple[float, float]:
        values = [float(r[col[name]]) for r in rows if r[0].startswith(family)]
        return min(values), max(values)

    for family, label in (("vgg", "VGG"), ("resnet", "ResNet")):
        low, high = span(family, "planner vs accpar")
        assert f"{label} {low:.2f}-{high:.2f}x" in text
        low, high = span(family, "planner")
        half_up = 1e-9  # the table's two decimals rounded to one as the text does (12.35 -> 12.4)
        assert f"up to **{high:.2f}x**" in text and f"{low + half_up:.1f}-{high + half_up:.1f}x |" in text


@pytest.mark.slow
def test_pipepar_row_is_what_compare_gives_now() -> None:
    """One row of docs/pipepar/ (vgg16 at batch 64) is what the code computes now: the generated files are not
    left behind by a change to the cost model or the search (scripts/reproduce_pipepar.py writes them all)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import reproduce_pipepar as rp

    from planner.cluster import load_cluster

    c = rp.compare(rp.load_profile(ROOT / "profiles", "vgg16", 64), load_cluster(rp.CLUSTER), schedule="1f1b",
                   optimizer="momentum")
    md, _ = rp.speedup_table([c])
    rows = _pipepar_rows()[1:]
    now = [[cell.strip() for cell in line.strip("|").split("|")] for line in md.splitlines()
           if line.startswith("| vgg16 ")]
    assert now == [r for r in rows if r[:2] == ["vgg16", "64"]]

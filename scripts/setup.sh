#!/usr/bin/env bash
# Set up planner in ./.venv: the CPU build of torch 2.13.0 first (never CUDA wheels),
# then the package with its dev extras. Safe to run again: it only installs what is missing.
# Says what it does, one line per step, on stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
say() { echo "setup: $*" >&2; }
if [ -x .venv/bin/python ]; then
  say "using ./.venv"
else
  say "creating ./.venv with $("$PY" --version 2>&1)"
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
if "$VPY" -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "2.13.0")' 2>/dev/null; then
  say "torch 2.13.0 already installed"
else
  say "installing torch==2.13.0 (CPU build unless a CUDA torch is there; about 200 MB, a minute or more)"
  "$VPY" -m pip install -q torch==2.13.0
fi
if "$VPY" -c 'import planner, deepspeed, pytest, hypothesis' 2>/dev/null; then
  say "planner and its dev extras already installed"
else
  say "installing planner (editable) with its dev extras: DeepSpeed, pytest, Hypothesis, mypy, ruff (a minute or more)"
  "$VPY" -m pip install -q -e '.[dev]'
fi
say "ready ($("$VPY" -c 'import torch; print("torch", torch.__version__)')); activate with: source .venv/bin/activate"

#!/usr/bin/env bash
# Set up planner in ./.venv: the CPU build of torch 2.13.0 first (never CUDA wheels),
# then the package with its dev extras. Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY=.venv/bin/python
if ! "$VPY" -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "2.13.0")' 2>/dev/null; then
  "$VPY" -m pip install -q torch==2.13.0
fi
if ! "$VPY" -c 'import planner, deepspeed, pytest, hypothesis' 2>/dev/null; then
  "$VPY" -m pip install -q -e '.[dev]'
fi
echo "setup: ready ($("$VPY" -c 'import torch; print("torch", torch.__version__)'))" >&2

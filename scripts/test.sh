#!/usr/bin/env bash
# Set up, then lint (ruff), type-check (mypy) and run the whole test suite (pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/.cache/torch_extensions}
.venv/bin/ruff check planner tests scripts
.venv/bin/mypy
.venv/bin/python -m pytest -q -n 2 "$@"  # two workers: the 2-core machine CI runs on

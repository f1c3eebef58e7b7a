#!/usr/bin/env bash
# Create .venv and install margrpo with its dev extras (pytest); safe to run again.
#
#   bash scripts/setup.sh
#
# torch is pinned to the CPU wheel (pyproject.toml). Outside this machine pip needs the
# PyTorch CPU index for it, e.g.
#   PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/setup.sh
# Override the interpreter with PYTHON=python3.11 (3.10-3.12 are supported).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
VENV="$ROOT/.venv"

if [[ ! -x "$VENV/bin/python" ]]; then
  "$PYTHON" -m venv "$VENV"
fi
# Reinstall only when pyproject.toml changed since the last successful install: a second
# run is a no-op that takes a second, not a resolver pass over ~200 packages.
STAMP="$VENV/.margrpo-installed"
if [[ ! -f "$STAMP" || "$ROOT/pyproject.toml" -nt "$STAMP" ]] || ! "$VENV/bin/python" -c "import margrpo" 2>/dev/null; then
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet -e "$ROOT[dev]"
  touch "$STAMP"
fi
# The pipeline's DVC stages run `python -m pipeline.<stage>`: the venv's python must be the
# one on PATH when dvc runs (activate the venv, or call .venv/bin/dvc after activating).
"$VENV/bin/python" -c "import margrpo, dvc, prefect, mlflow; print('margrpo environment ready:', '$VENV')"

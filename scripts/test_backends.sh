#!/usr/bin/env bash
# Runs every reward-backend / protocol test in the environment it needs:
#   core venv (+ the transformers extra): PickScore, CLIPScore, aesthetic, protocol drivers
#       and adapters, the loopback scorer, and the cross-env server tests below;
#   .venvs/openclip: HPSv2 in process;  .venvs/legacy: ImageReward, VQAScore in process.
# Builds the extra venvs first (scripts/setup_backend_env.sh; ~5.6 GB each, minutes).
# SKIP_SETUP=1 reuses existing venvs. Real-weight tests run only with MARGRPO_WEIGHTS set.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CORE_PY="${CORE_PY:-$ROOT/.venv/bin/python}"
if [[ "${SKIP_SETUP:-0}" != 1 ]]; then
  "$CORE_PY" -m pip install -q -e ".[transformers,dev]"
  scripts/setup_backend_env.sh all
fi
echo "== core env: $("$CORE_PY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"
"$CORE_PY" -m pytest tests/backends -p no:cacheprovider -rs
echo "== .venvs/openclip (HPSv2 in process)"
.venvs/openclip/bin/python -m pytest tests/backends/test_hps.py -p no:cacheprovider -rs
echo "== .venvs/legacy (ImageReward, VQAScore in process)"
.venvs/legacy/bin/python -m pytest tests/backends/test_imagereward.py tests/backends/test_vqascore.py -p no:cacheprovider -rs

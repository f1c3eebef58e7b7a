#!/usr/bin/env bash
# Build the separate virtual environment a reward / benchmark backend needs.
#
#   scripts/setup_backend_env.sh openclip   # HPSv2/v2.1 and aesthetic-by-open_clip, in process
#                                           # of that env or served from it (.venvs/openclip)
#   scripts/setup_backend_env.sh legacy     # ImageReward + VQAScore (t2v-metrics 1.2) server
#                                           # env (.venvs/legacy)
#   scripts/setup_backend_env.sh all
#
# Why separate envs: open_clip / image-reward / t2v-metrics need torchvision, which does not
# import next to the core's torch 2.13.0 CPU wheel, and image-reward / t2v-metrics pin
# transformers 4.x and diffusers <= 0.39, which conflict with the core's diffusers 0.42.
# The transformers-only backends (PickScore, CLIPScore, aesthetic, BLIP-VQA, OWL-ViT) need
# no extra env: `pip install -e .[transformers]` into the core venv.
#
# Each env gets margrpo itself with --no-deps (only its light modules are imported there),
# so `python -m margrpo.rewards.server` runs inside it. Override the interpreter with
# PYTHON=python3.11. Outside this machine add the PyTorch CPU index for a CPU-only torch:
#   PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
TORCH_PINS=("torch==2.14.1" "torchvision==0.29.1")
COMMON=("numpy<3" "pillow>=10" "pyyaml>=6" "safetensors>=0.4")

make_env() {
  local name="$1"; shift
  local venv="$ROOT/.venvs/$name"
  if [[ ! -x "$venv/bin/python" ]]; then
    "$PYTHON" -m venv "$venv"
  fi
  "$venv/bin/pip" install -q "$@"
  "$venv/bin/pip" install -q --no-deps -e "$ROOT"
  echo "built $venv"
}

build_openclip() {
  make_env openclip "${TORCH_PINS[@]}" "${COMMON[@]}" "open_clip_torch>=2.24,<4" ftfy regex \
    "pytest>=8" "pytest-timeout>=2.3"
}

build_legacy() {
  # image-reward 1.5 imports only with clip-anytorch, setuptools<81 and transformers<4.56;
  # t2v-metrics 1.2 pins transformers==4.36.1 and works with diffusers 0.31. Its hpsv2
  # dependency pins pytest 7.2, hence no pytest>=8 here.
  make_env legacy "${TORCH_PINS[@]}" "${COMMON[@]}" "setuptools<81" \
    "image-reward==1.5" "t2v-metrics==1.2" clip-anytorch "transformers==4.36.1" \
    "diffusers==0.31.0" ftfy regex
}

case "${1:-all}" in
  openclip) build_openclip ;;
  legacy) build_legacy ;;
  all) build_openclip; build_legacy ;;
  *) echo "usage: $0 {openclip|legacy|all}" >&2; exit 2 ;;
esac

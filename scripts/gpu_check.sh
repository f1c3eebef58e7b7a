#!/usr/bin/env bash
# The GPU check: one command on a machine with one CUDA GPU where PyTorch is installed, about
# 8 minutes on one H100 (each step has its own time limit; the limits add up to 480 s):
#   0. install the project's requirements (pyproject.toml's pins, less torch and the study's
#      orchestration packages) WITH their dependencies from a folder of wheels, into the
#      environment of $PYTHON: pip install --no-index --find-links DIR, nothing is downloaded
#      (build the folder where pip can download: scripts/build_wheels.py); then merge
#      params_gpu.yaml over params.yaml into OUT (pipeline/profile.py --out, no DVC);
#   1. the CUDA tests (pytest -m cuda): noise bits, placement, a trainer step, NOVA and Harmon
#      steps on the device, one torchrun rank on NCCL (tests/test_device_paths.py);
#   2. rollout of 512 images (16 AR steps, 20 head steps, CFG) in float32 and in bfloat16;
#   3. training steps of 512 images (the GPU profile: 32 prompts x 16 images) of grpo_frozen and
#      mar_grpo in float32 and in bfloat16, with peak GPU memory;
#   4. 50 steps of mar_grpo on the GPU profile with held-out evaluation at steps 0, 25 and 50
#      (probes/rl_probe.py; a probe stopped at its limit keeps its evaluations so far).
#
#   bash scripts/gpu_check.sh [--wheels DIR] [--out DIR] [--dry] [--cpu-smoke]
#
#   --wheels DIR  install from DIR (scripts/build_wheels.py writes it, with DIR/requirements.txt);
#   --dry         print the plan (of the GPU run, or of --cpu-smoke) and exit;
#   --cpu-smoke   every step on the CPU at tiny sizes, with a tiny random base model
#                 (scripts/gpu_check_smoke.sh runs it in a venv holding torch alone: the
#                 bare-machine path without a GPU);
#   --out DIR     logs and the merged params (default outputs/gpu_check).
# A failing step is reported and the next one runs (after install or merge the check stops);
# exit status 0 when every step passed.
# PYTHON picks the interpreter (default python3); GPU_CHECK_LIMIT_SCALE multiplies the time
# limits (default 1 on the GPU, 4 for --cpu-smoke on a small shared CPU).
set -u -o pipefail
PY=${PYTHON:-python3}
WHEELS="" OUT="outputs/gpu_check" MODE=gpu DRY=0
absolute() { case "$1" in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }  # before the cd below
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) WHEELS=$(absolute "${2:?--wheels needs a folder}"); shift 2 ;;
    --out) OUT=$(absolute "${2:?--out needs a folder}"); shift 2 ;;
    --dry) DRY=1; shift ;;
    --cpu-smoke) MODE=cpu; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."

# import names of what the steps import besides torch (checked after the install)
NEEDED="diffusers transformers tokenizers peft accelerate safetensors huggingface_hub pydantic yaml numpy scipy PIL tqdm pytest"
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

GPU_PARAMS=$OUT/params_gpu_merged.yaml
if [ "$MODE" = cpu ]; then
  DEV=cpu IMAGES=8 REPEATS=1 STEPS=1 PROBE_STEPS=2 EVAL_EVERY=1 EVAL_IMAGES=1 SCALE=${GPU_CHECK_LIMIT_SCALE:-4}
  # a tiny random TinyMAR (made by the step 'tiny base model') at 4 AR steps x 4 head steps,
  # 2 prompts x 2 images per step: the same commands as on the GPU, in seconds each
  TINY_BASE=$OUT/tiny_base
  ARCH="-S model.width=32 -S model.depth=1 -S model.heads=2 -S model.cond_dim=32 -S model.head_width=32 -S model.head_depth=1"
  TINY="$ARCH -S model.checkpoint=$TINY_BASE -S sampling.num_ar_steps=4 -S sampling.head_steps=4 -S train.loss_head_steps=2"
  TINY="$TINY -S train.loss_head_window=0 -S train.prompts_per_step=2 -S train.group_size=2 -S train.grad_probe_every=0 -S runtime.device=cpu"
  SAMPLING="--ar-steps 4 --head-steps 4 --checkpoint $TINY_BASE"
  export MARGRPO_CHECK_DEVICE=cpu  # tests/test_device_paths.py runs on the CPU instead of skipping
else
  DEV=cuda IMAGES=512 REPEATS=5 STEPS=3 PROBE_STEPS=50 EVAL_EVERY=25 EVAL_IMAGES=27 SCALE=${GPU_CHECK_LIMIT_SCALE:-1}
  TINY="" SAMPLING="--ar-steps 16 --head-steps 20"
fi
CUDA_TESTS="tests/test_noise.py tests/test_device.py tests/test_trainer.py tests/test_adapters.py tests/test_device_paths.py"
# step name | time limit (s) | command
PLAN=(
  "install|45|install_wheels"
  "merge params_gpu.yaml|15|$PY -m pipeline.profile params_gpu.yaml --params params.yaml --out $GPU_PARAMS"
)
[ "$MODE" = cpu ] && PLAN+=("tiny base model|15|make_tiny_base")
PLAN+=(
  "cuda tests|70|$PY -m pytest -m cuda -q -p no:cacheprovider $CUDA_TESTS"
  "rollout float32|30|$PY benchmarks/sampling.py --device $DEV --dtype float32 --images $IMAGES --repeats $REPEATS $SAMPLING --cfg 3.0"
  "rollout bfloat16|30|$PY benchmarks/sampling.py --device $DEV --dtype bfloat16 --images $IMAGES --repeats $REPEATS $SAMPLING --cfg 3.0"
  "training step float32|65|$PY benchmarks/step_time.py --device $DEV --dtype float32 --params $GPU_PARAMS --steps $STEPS --methods grpo_frozen,mar_grpo $TINY"
  "training step bfloat16|65|$PY benchmarks/step_time.py --device $DEV --dtype bfloat16 --params $GPU_PARAMS --steps $STEPS --methods grpo_frozen,mar_grpo $TINY"
  "probe mar_grpo|160|$PY probes/rl_probe.py --method mar_grpo --params $GPU_PARAMS --steps $PROBE_STEPS --eval-every $EVAL_EVERY --images $EVAL_IMAGES --name gpu_check_mar_grpo $TINY"
)

if [ "$DRY" = 1 ]; then
  echo "mode $MODE; python: $PY; needs torch and (import names) $NEEDED"
  for step in "${PLAN[@]}"; do
    IFS='|' read -r name limit cmd <<<"$step"
    [ "$cmd" = install_wheels ] && cmd="$PY -m pip install --no-index --find-links ${WHEELS:-DIR} -r ${WHEELS:-DIR}/requirements.txt"
    echo "[$name, <= $((limit * SCALE)) s] $cmd"
  done
  exit 0
fi

install_wheels() {  # $1: time limit (s)
  if [ -z "$WHEELS" ]; then echo "no --wheels folder: using the packages installed"; return 0; fi
  [ -f "$WHEELS/requirements.txt" ] || { echo "$WHEELS/requirements.txt missing: build the folder with scripts/build_wheels.py" >&2; return 2; }
  echo "installing $(grep -c . "$WHEELS/requirements.txt") requirements with their dependencies from $WHEELS ($(ls "$WHEELS" | grep -c '\.whl$') wheels)"
  # PIP_CONFIG_FILE=/dev/null and --isolated: no pip configuration (no index, find-links or
  # constraints from this machine's files or variables); only the folder is read. Without
  # PYTHONPATH, pip does not take src/margrpo.egg-info for an installed margrpo.
  local piplog=$OUT/pip_install.log
  if timeout "$1" env -u PYTHONPATH PIP_CONFIG_FILE=/dev/null $PY -m pip --isolated install --no-index --find-links "$WHEELS" \
      --no-compile --disable-pip-version-check --progress-bar off -r "$WHEELS/requirements.txt" >"$piplog" 2>&1; then
    grep '^Successfully installed' "$piplog" || echo "every requirement was already installed"
    return 0
  fi
  tail -n 25 "$piplog"
  echo "pip could not install from $WHEELS (its whole output: $piplog). 'No matching distribution': the folder" >&2
  echo "was built for another Python or glibc, or --omit left out a package this machine lacks; rebuild it with" >&2
  echo "  scripts/build_wheels.py --python-version $($PY -c 'import sys; print("%d.%d" % sys.version_info[:2])')" >&2
  echo "'externally-managed-environment': make a venv that sees the system torch and use it:" >&2
  echo "  $PY -m venv --system-site-packages v && PYTHON=v/bin/python bash $0 --wheels $WHEELS" >&2
  return 2
}

make_tiny_base() {  # $1: time limit (s); --cpu-smoke only
  # shellcheck disable=SC2086  # $ARCH is a word list by design
  timeout "$1" $PY - "$GPU_PARAMS" "$TINY_BASE" $ARCH <<'EOF'
import sys

import torch

from margrpo.config import load_params, parse_overrides
from margrpo.models.loading import new_model
from margrpo.world.grammar import VOCAB

params = load_params(sys.argv[1], parse_overrides(a for a in sys.argv[3:] if a != "-S"))
model = new_model(params, VOCAB)
g = torch.Generator().manual_seed(0)
with torch.no_grad():  # the head starts at zero (AdaLN-zero); random weights give the steps signal
    for p in model.head.parameters():
        p.copy_(torch.randn(p.shape, generator=g) * 0.05)
model.save_pretrained(sys.argv[2])
print(f"tiny random base model, {sum(p.numel() for p in model.parameters())} parameters: {sys.argv[2]}")
EOF
}

missing_packages() {
  local m=""
  for mod in torch $NEEDED; do $PY -c "import $mod" 2>/dev/null || m="$m $mod"; done
  echo "$m"
}

preflight() {
  local missing
  missing=$(missing_packages)
  if [ -n "$missing" ]; then
    local pyver pins
    pyver=$($PY -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    pins=$($PY scripts/build_wheels.py --print-requirements 2>/dev/null | while read -r r; do printf " '%s'" "$r"; done)
    echo "missing Python packages (import names):$missing" >&2
    case " $missing " in *" torch "*) echo "install PyTorch (a CUDA build, pytorch.org) first: the wheel folder leaves torch out" >&2 ;; esac
    echo "build a wheel folder where pip can download (the project's .venv), for this Python $pyver:" >&2
    echo "  .venv/bin/python scripts/build_wheels.py --python-version $pyver --dest outputs/wheels" >&2
    echo "copy it here, then: bash $0 --wheels outputs/wheels" >&2
    [ -n "$pins" ] && echo "or, where this machine can download: $PY -m pip install$pins" >&2
    return 2
  fi
  $PY - "$MODE" <<'EOF' || return 2
import sys, torch
if sys.argv[1] == "gpu" and not torch.cuda.is_available():
    sys.exit("PyTorch sees no CUDA device; on a machine without one use --cpu-smoke")
name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, {name}")
EOF
  for f in prompts/world_train.jsonl prompts/world_heldout.jsonl models/base/config.json; do
    [ -f "$f" ] || { echo "$f missing: copy the whole working tree (prompts/ and models/base are committed)" >&2; return 2; }
  done
}

mkdir -p "$OUT"
failed=0
start=$(date +%s)
for step in "${PLAN[@]}"; do
  IFS='|' read -r name limit cmd <<<"$step"
  limit=$((limit * SCALE))
  log="$OUT/$(echo "$name" | tr ' .' '__').log"
  echo "=== $name (limit ${limit} s): $cmd"
  t0=$(date +%s)
  if [ "$cmd" = install_wheels ]; then
    install_wheels "$limit" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] && { preflight 2>&1 | tee -a "$log"; rc=${PIPESTATUS[0]}; }
  elif [ "$cmd" = make_tiny_base ]; then
    make_tiny_base "$limit" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
  else
    # shellcheck disable=SC2086  # $cmd is a word list by design
    timeout "$limit" $cmd 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
  fi
  echo "=== $name: exit $rc after $(( $(date +%s) - t0 )) s (log $log)"
  if [ "$rc" -ne 0 ]; then
    failed=$((failed + 1))
    case "$name" in install|merge*) echo "=== gpu_check ($MODE): stopped: the steps after '$name' need it" >&2; exit 2 ;; esac
  fi
done
echo "=== gpu_check ($MODE): $failed step(s) failed, $(( $(date +%s) - start )) s in all"
[ "$failed" -eq 0 ]

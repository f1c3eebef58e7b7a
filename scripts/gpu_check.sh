#!/usr/bin/env bash
# One prepared check on a machine with one CUDA GPU, within 8 minutes:
#   1. the CUDA tests (pytest -m cuda: CPU == CUDA noise bits, rollout / pretraining / evaluation
#      sampling on the GPU, bfloat16 forward passes);
#   2. the throughput benchmark at the target sizes: rollout of 512 images (16 AR steps, 20 head
#      steps, CFG), then full training steps of 512 images (the GPU profile) for grpo_frozen and
#      mar_grpo, with peak GPU memory;
#   3. a short GPU-profile training of grpo_frozen and mar_grpo with held-out evaluation
#      (scripts/rl_probe.py): the training reward and the held-out overall per evaluation.
#
#   bash scripts/gpu_check.sh [--wheels DIR] [--out DIR] [--dry | --cpu-smoke]
#
# The machine needs PyTorch with CUDA and the packages in NEEDED below; DVC, MLflow and Prefect
# are not used. Missing packages are installed from a folder of wheels (--wheels DIR; pip
# --no-index --no-deps --target, nothing is downloaded). prompts/ is committed (a DVC output
# kept in git), so a copy of the working tree has it.
#   --dry        print the plan and exit;
#   --cpu-smoke  run every step on the CPU at tiny sizes (checks that the script works);
#   --out DIR    logs and results (default outputs/gpu_check).
# Each step has its own time limit; a failing step is reported and the next one runs. Exit
# status: 0 when every step passed. Sizes can be changed with PROBE_STEPS, PROBE_EVAL_EVERY.
set -u -o pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
WHEELS="" OUT="outputs/gpu_check" MODE=gpu
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) WHEELS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --dry) MODE=dry; shift ;;
    --cpu-smoke) MODE=cpu; shift ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

# import name:pip name of everything the steps import besides torch
NEEDED="diffusers:diffusers safetensors:safetensors huggingface_hub:huggingface-hub
importlib_metadata:importlib-metadata pydantic:pydantic pydantic_core:pydantic-core
annotated_types:annotated-types typing_inspection:typing-inspection yaml:pyyaml numpy:numpy
scipy:scipy PIL:pillow tqdm:tqdm regex:regex requests:requests filelock:filelock pytest:pytest"

SITE=$ROOT/outputs/gpu_check_site  # git-ignored
export PYTHONPATH="$SITE:$ROOT/src:$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

if [ "$MODE" = cpu ]; then
  DEV=cpu IMAGES=8 REPEATS=1 STEPS=1 PROBE_STEPS=${PROBE_STEPS:-2} PROBE_EVAL_EVERY=${PROBE_EVAL_EVERY:-1} EVAL_IMAGES=1
  # the base model at 4 AR steps x 4 head steps, 2 prompts x 2 images per step
  TINY="-S sampling.num_ar_steps=4 -S sampling.head_steps=4 -S train.loss_head_steps=2 -S train.loss_head_window=0"
  TINY="$TINY -S train.prompts_per_step=2 -S train.group_size=2 -S train.grad_probe_every=0 -S runtime.device=cpu"
  SAMPLING_SIZES="--ar-steps 4 --head-steps 4"
else
  DEV=cuda IMAGES=512 REPEATS=5 STEPS=5 PROBE_STEPS=${PROBE_STEPS:-40} PROBE_EVAL_EVERY=${PROBE_EVAL_EVERY:-20} EVAL_IMAGES=27
  TINY="" SAMPLING_SIZES="--ar-steps 16 --head-steps 20"
fi
GPU_PARAMS=$OUT/params_gpu_merged.yaml
# step name | time limit (s) | command; the limits add up to 460 s (a killed probe keeps its
# evaluations so far in outputs/probes/<name>/)
PLAN=(
  "cuda tests|60|$PY -m pytest -m cuda -q -p no:cacheprovider tests/test_noise.py tests/test_device.py"
  "rollout benchmark|60|$PY scripts/bench_sampling.py --device $DEV --images $IMAGES --repeats $REPEATS $SAMPLING_SIZES --cfg 3.0"
  "training step benchmark|100|$PY scripts/bench_step_time.py --device $DEV --params $GPU_PARAMS --steps $STEPS --methods grpo_frozen,mar_grpo $TINY"
  "probe grpo_frozen|120|$PY scripts/rl_probe.py --method grpo_frozen --params $GPU_PARAMS --steps $PROBE_STEPS --eval-every $PROBE_EVAL_EVERY --images $EVAL_IMAGES --name gpu_check_grpo_frozen $TINY"
  "probe mar_grpo|120|$PY scripts/rl_probe.py --method mar_grpo --params $GPU_PARAMS --steps $PROBE_STEPS --eval-every $PROBE_EVAL_EVERY --images $EVAL_IMAGES --name gpu_check_mar_grpo $TINY"
)

if [ "$MODE" = dry ]; then
  echo "needs (import:pip): torch $NEEDED" | tr '\n' ' '; echo
  echo "setup: merge params_gpu.yaml into $GPU_PARAMS (python -m pipeline.profile ... --apply)"
  for step in "${PLAN[@]}"; do IFS='|' read -r name limit cmd <<<"$step"; echo "[$name, <= ${limit} s] $cmd"; done
  exit 0
fi

mkdir -p "$OUT"
if [ -n "$WHEELS" ]; then
  ls "$WHEELS"/*.whl >/dev/null 2>&1 || { echo "no .whl files in $WHEELS" >&2; exit 2; }
  echo "installing $(ls "$WHEELS"/*.whl | wc -l) wheels from $WHEELS into $SITE"
  $PY -m pip install -q --no-index --no-deps --no-compile --target "$SITE" --upgrade "$WHEELS"/*.whl || exit 2
fi
missing=""
for pair in $NEEDED; do
  $PY -c "import ${pair%%:*}" 2>/dev/null || missing="$missing ${pair#*:}"
done
if [ -n "$missing" ]; then
  echo "missing Python packages:$missing" >&2
  echo "where pip can download, for this machine's Python:" >&2
  echo "  pip download --no-deps --only-binary=:all: -d wheels$missing   # then: bash $0 --wheels wheels" >&2
  exit 2
fi
$PY - "$MODE" <<'EOF' || exit 2
import sys, torch
if sys.argv[1] == "gpu" and not torch.cuda.is_available():
    sys.exit("PyTorch sees no CUDA device; on a CPU-only machine use --cpu-smoke")
name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
print(f"torch {torch.__version__}, {name}")
EOF
for f in prompts/world_train.jsonl prompts/world_heldout.jsonl; do
  [ -f "$f" ] || { echo "$f missing: run 'dvc repro prepare_prompts' and copy prompts/ here" >&2; exit 2; }
done
cp params.yaml "$GPU_PARAMS"
$PY -m pipeline.profile params_gpu.yaml --params "$GPU_PARAMS" --apply || exit 2

failed=0
start=$(date +%s)
for step in "${PLAN[@]}"; do
  IFS='|' read -r name limit cmd <<<"$step"
  log="$OUT/$(echo "$name" | tr ' ' '_').log"
  echo "=== $name (limit ${limit} s): $cmd"
  t0=$(date +%s)
  # shellcheck disable=SC2086  # $cmd is a word list by design
  timeout "$limit" $cmd 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  echo "=== $name: exit $rc after $(( $(date +%s) - t0 )) s (log $log)"
  [ "$rc" -eq 0 ] || failed=$((failed + 1))
done
echo "=== gpu_check ($MODE): $failed step(s) failed, $(( $(date +%s) - start )) s in all"
[ "$failed" -eq 0 ]

#!/usr/bin/env bash
# The GPU check's bare-machine path on the CPU: a fresh venv that holds torch alone (the CPU
# wheel pyproject pins, with what torch needs), the wheel folder, and in it
#   bash scripts/gpu_check.sh --wheels DIR --cpu-smoke
# which installs the requirements with their dependencies from DIR and runs every step at tiny
# sizes. Where `unshare -rn` works the check runs without any network (a namespace with
# loopback only); pip is told --no-index either way.
#
#   bash scripts/gpu_check_smoke.sh [--wheels DIR]
#
# DIR defaults to outputs/wheels, built first (scripts/build_wheels.py, for this Python) when
# it has no MANIFEST.txt. The venv is outputs/gpu_check_smoke/venv (made anew each run), logs
# go to outputs/gpu_check_smoke/. About 4-5 minutes on 2 busy cores, most of it the venv's
# torch (~35 s) and the check's Python start-ups; it runs at nice 10.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=outputs/wheels
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) WHEELS=${2:?--wheels needs a folder}; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
PROJECT_PY=.venv/bin/python
OUT=outputs/gpu_check_smoke
VENV=$OUT/venv
start=$(date +%s)
unset PYTHONPATH

if [ ! -f "$WHEELS/MANIFEST.txt" ]; then
  echo "--- building $WHEELS"
  nice -n 10 "$PROJECT_PY" scripts/build_wheels.py --dest "$WHEELS"
fi
TORCH=$("$PROJECT_PY" -c 'import runpy; print(runpy.run_path("scripts/build_wheels.py")["torch_pin"]())')
echo "--- a venv with $TORCH alone: $VENV"
rm -rf "$VENV"
mkdir -p "$OUT"
# the venv's Python is the one that runs the project's .venv (the folder's wheels are for it)
BASE_PY=$("$PROJECT_PY" -c 'import sys; print(sys._base_executable)')
"$BASE_PY" -m venv "$VENV"
nice -n 10 "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$TORCH"
echo "venv packages before the check: $("$VENV/bin/python" -m pip list --format freeze 2>/dev/null | tr '\n' ' ')"

CHECK=(env PYTHON="$VENV/bin/python" nice -n 10 bash scripts/gpu_check.sh --wheels "$WHEELS" --cpu-smoke --out "$OUT")
if unshare -rn true 2>/dev/null && command -v ip >/dev/null; then
  echo "--- gpu_check.sh --cpu-smoke without network (unshare -rn, loopback only)"
  set +e
  unshare -rn bash -c 'ip link set lo up && exec "$@"' bash "${CHECK[@]}"
  rc=$?
else
  echo "--- gpu_check.sh --cpu-smoke (unshare -rn unavailable here: pip's --no-index is what keeps it offline)"
  set +e
  "${CHECK[@]}"
  rc=$?
fi
set -e
echo "venv packages after: $("$VENV/bin/python" -m pip list --format freeze 2>/dev/null | wc -l) installed"
echo "=== gpu_check_smoke: exit $rc, $(( $(date +%s) - start )) s in all"
exit "$rc"

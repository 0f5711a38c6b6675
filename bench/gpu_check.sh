#!/usr/bin/env bash
# Everything in ckptlab that needs an NVIDIA GPU, in one call, within 8 minutes:
#   1. pytest -m gpu                              the gpu-marked tests, on the CUDA target
#   2. python -m ckptlab --device cuda tour       the main job at GPU sizes (CUDA-event times)
#   3. python -m ckptlab --device cuda fig2       the FlashAttention Fig. 2 table at full size
#      bench crossing --measure                   stored vs flash measured over d, beside the model
#   4. bench attention --ncu                      measured DRAM bytes (only if ncu is on the PATH)
# Every log, CSV and PNG goes under one folder: $1, else ./gpu-results. When $OUT is set (the
# workplace's device tool, which brings back at most 8 files), that folder is also packed into
# $OUT/gpu-results.tar.gz, next to copies of summary.txt and environment.txt.
#
# Nothing is downloaded or installed: it needs a Python with numpy, a CUDA build of CuPy (any
# cupy-cuda1Xx), matplotlib, tqdm and pytest, and imports ckptlab from this checkout through
# PYTHONPATH. Each step runs under `timeout`, so one slow step cannot eat the others' time; a
# failed step is reported and the next one still runs. Exit status: 0 if every step passed.
#
#   bench/gpu_check.sh [OUT_DIR]        PYTHON=/path/to/python to choose the interpreter
set -uo pipefail

cd "$(dirname "$0")/.."
REPO=$(pwd)
OUT_DIR=${1:-./gpu-results}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
PY=${PYTHON:-python3}
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export MPLBACKEND=Agg            # figures are drawn without a display
export PYTHONUNBUFFERED=1        # logs stay in order if a step is killed
SUMMARY="$OUT_DIR/summary.txt"
: > "$SUMMARY"
failed=0
T0=$(date +%s)

note() { echo "$*" | tee -a "$SUMMARY"; }

# finish STATUS: pack the results for the device tool when $OUT is set, then exit.
finish() {
  if [ -n "${OUT:-}" ] && [ -d "$OUT" ] && [ "$(cd "$OUT" && pwd)" != "$OUT_DIR" ]; then
    tar -czf "$OUT/gpu-results.tar.gz" -C "$(dirname "$OUT_DIR")" "$(basename "$OUT_DIR")"
    cp "$SUMMARY" "$OUT_DIR/environment.txt" "$OUT/"
  fi
  exit "$1"
}

# step NAME SECONDS CMD...: run CMD under a time limit, log to $OUT_DIR/NAME.log, show its tail.
step() {
  local name=$1 limit=$2; shift 2
  local log="$OUT_DIR/$name.log" start rc
  note "== $name (limit ${limit} s): $*"
  start=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" > "$log" 2>&1
  rc=$?
  tail -n 60 "$log"
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    note "   $name: TIMED OUT after $(( $(date +%s) - start )) s (limit ${limit} s); log: $log"
  else
    note "   $name: exit $rc in $(( $(date +%s) - start )) s; log: $log"
  fi
  [ "$rc" -eq 0 ] || failed=1
}

# 0. what this machine is; stop early, clearly, if CuPy cannot see a GPU.
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || true
  "$PY" -c "import sys, numpy, cupy; print('python', sys.version.split()[0], '| numpy',
numpy.__version__, '| cupy', cupy.__version__, '| cuda available:', cupy.cuda.is_available())"
} > "$OUT_DIR/environment.txt" 2>&1
cat "$OUT_DIR/environment.txt"
if ! "$PY" -c "import cupy, sys; sys.exit(0 if cupy.cuda.is_available() else 1)" 2>/dev/null; then
  note "gpu_check: CuPy is missing or sees no GPU with $PY (see $OUT_DIR/environment.txt)"
  finish 2
fi

step pytest_gpu 110 "$PY" -m pytest -m gpu -q -rs -p no:cacheprovider \
  --junitxml="$OUT_DIR/pytest_gpu.xml"
step tour 110 "$PY" -m ckptlab --device cuda tour --out "$OUT_DIR/tour"
step fig2 130 "$PY" -m ckptlab --device cuda fig2 --out "$OUT_DIR/fig2"
step crossing 60 "$PY" -m ckptlab --device cuda bench crossing --measure --d 16,32,64,128 \
  --n 2048 --gpus h200 --csv "$OUT_DIR/crossing.csv"
if command -v ncu > /dev/null; then
  step ncu_bytes 70 "$PY" -m ckptlab --device cuda bench attention --n 256,1024 \
    --batch 2 --heads 16 --repeats 5 --ncu --csv "$OUT_DIR/ncu_bytes.csv" \
    --png "$OUT_DIR/ncu_bytes_vs_n.png"
else
  note "== ncu_bytes: skipped, ncu (Nsight Compute) is not on the PATH"
fi

note "gpu_check: $( [ $failed -eq 0 ] && echo 'all steps passed' || echo 'SOME STEPS FAILED' ) in" \
  "$(( $(date +%s) - T0 )) s; results in $OUT_DIR"
finish $failed

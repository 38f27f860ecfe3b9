#!/usr/bin/env bash
# The GPU validation run: lightbox's figures on an NVIDIA machine, in about 5 minutes on one H200,
# with nothing downloaded.
#
#   bash bench/gpu/suite.sh FOLDER [OUT]          (from a lightbox checkout)
#
# FOLDER (made by `python3 bench/gpu/suite.py pack FOLDER` on a machine that reaches PyPI):
#   model/u2netp.batched.onnx  the model (and model/gate/*.png, the FP16 gate's images)
#   wheels/*.whl               lightbox's Python dependencies the machine lacks, installed here
#                              with `pip install --no-index` into OUT (or site/: the same, installed)
# The machine brings Python 3.11+, the NVIDIA driver (580+, CUDA 13), CuPy, and either DALI or
# torchvision (the GPU JPEG decoder) and either onnxruntime-gpu or torch with CUDA (the model):
# a stock PyTorch GPU image with OpenCV and ONNX Runtime has all of it.
#
# Output, in OUT (default out/gpu_suite): gpu_suite.json (every figure, with the machine and the
# time of each step), gpu_suite.png (the figures drawn) and gpu_suite.tar.gz (both, the rows as
# they landed and every step's log). Rows land in OUT/gpu_suite.rows.jsonl as each is measured,
# so a step cut off by its time limit keeps what it finished.
#
# Steps, most important first (limit in seconds):
#   preflight  15  imports, model file, device, driver, a CuPy kernel compile, decoder, runtime
#   e2e        90  `lightbox process` end to end: img/s, p50/p99 at batches 64/32/8, 3 presets
#   model      60  u2netp by batch 1-64: fp32/fp16 x plain/CUDA graphs (ONNX Runtime), else
#                  fp16/bf16/fp32 x eager/graphs (torch); the FP16 gate
#   decode     30  DALI decode by batch and hardware-decoder share; nvJPEG encode sizes
#   retouch    20  retouch kernels against a device copy's bandwidth
#   parity     60  GPU-vs-CPU parity tests (pytest -m gpu), when pytest is in the folder
#   report     10  gpu_suite.json, gpu_suite.png, gpu_suite.tar.gz
# Without a CUDA device every step still runs, in its CPU mode (small dry runs; the GPU-only
# parts say they were skipped); the preflight line says which mode ran.
set -uo pipefail
cd "$(dirname "$0")/../.."
FOLDER=${1:?usage: bash bench/gpu/suite.sh FOLDER [OUT]  (FOLDER: bench/gpu/suite.py pack makes it)}
OUT=${2:-${OUT:-out/gpu_suite}}
PY=${PYTHON:-python3}
FOLDER=$(cd "$FOLDER" && pwd) || { echo "gpu_suite: no folder $1"; exit 2; }
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
WORK="$OUT/work"
rm -rf "$WORK" "$OUT/gpu_suite.rows.jsonl"; mkdir -p "$WORK"
export GPU_SUITE_ROWS="$OUT/gpu_suite.rows.jsonl" GPU_SUITE_MODE_FILE="$WORK/mode"
export LIGHTBOX_MODEL_DIR="$WORK/models" LIGHTBOX_DATA_DIR="$WORK/data" OPENBLAS_NUM_THREADS=1
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 LIGHTBOX_OFFLINE=1
MODEL="$FOLDER/model/u2netp.batched.onnx"
mkdir -p "$LIGHTBOX_MODEL_DIR/u2netp"  # the model cache the parity tests read: the folder's copy
cp "$FOLDER"/model/*.onnx "$FOLDER"/model/*.json "$LIGHTBOX_MODEL_DIR/u2netp/" 2>/dev/null
GATE=(); [[ -d "$FOLDER/model/gate" ]] && GATE=(--gate-images "$FOLDER/model/gate")
: > "$WORK/steps.jsonl"

finish() {  # the report runs however the run ends
  trap - EXIT INT TERM
  echo "== report"
  timeout 10 $PY bench/gpu/suite.py report "$WORK" "$OUT" 2>&1 | tail -n 12
  rm -rf "$WORK"
}
trap finish EXIT INT TERM

if ! $PY -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "preflight: $PY is not Python 3.11 or newer (set PYTHON=...)"; exit 1
fi
SITE="$FOLDER/site"
if [[ ! -d "$SITE" ]] && compgen -G "$FOLDER/wheels/*.whl" >/dev/null; then
  SITE="$WORK/site"
  echo "== install: $(ls "$FOLDER"/wheels/*.whl | wc -l) wheels from $FOLDER/wheels (offline)"
  if ! $PY -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$FOLDER"/wheels/*.whl \
      > "$WORK/install.log" 2>&1; then
    echo "preflight: the wheels in $FOLDER/wheels do not install here: $(tail -n 1 "$WORK/install.log")"; exit 1
  fi
fi
export PYTHONPATH="$PWD${SITE:+:$SITE}${PYTHONPATH:+:$PYTHONPATH}"

step() {  # step NAME LIMIT_S COMMAND...: one line per step, the log in the archive
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  GPU_SUITE_STEP=$name timeout --kill-after=3 "$limit" "$@" > "$WORK/$name.log" 2>&1
  local rc=$?
  local state=ok; [[ $rc -ne 0 ]] && state="exit $rc"; [[ $rc -eq 124 || $rc -eq 137 ]] && state="cut at ${limit}s"
  printf '== %-9s %4ss  %s | %s\n' "$name" $((SECONDS - t0)) "$state" "$(tail -n 1 "$WORK/$name.log" | cut -c1-150)"
  echo "{\"step\": \"$name\", \"rc\": $rc, \"seconds\": $((SECONDS - t0)), \"limit_s\": $limit}" >> "$WORK/steps.jsonl"
  return $rc
}
skip() {  # skip NAME WHY
  echo "== $1 skipped: $2"
  echo "{\"step\": \"$1\", \"rc\": -1, \"seconds\": 0, \"skipped\": \"$2\"}" >> "$WORK/steps.jsonl"
}

if ! step preflight 15 $PY bench/gpu/suite.py preflight --model "$MODEL"; then
  exit 1  # its one line is printed above; nothing else can run
fi
MODE=$(cat "$WORK/mode")
DRY=(); [[ "$MODE" == cpu ]] && DRY=(--dry-run-cpu)
step e2e 90 $PY bench/gpu/checks.py e2e --model "$MODEL" --n "${E2E_N:-512}" --batches "${E2E_BATCHES:-64,32,8}" \
  --out "$WORK/e2e.json"
CUDA_EP=$($PY -c "import onnxruntime as o; print(int('CUDAExecutionProvider' in o.get_available_providers()))" 2>/dev/null)
if [[ "$MODE" == gpu && "$CUDA_EP" != 1 ]]; then  # the torch runtime is the model's GPU path here
  step model 60 $PY bench/gpu/checks.py model "$MODEL" --torch --deadline 45 --budget 0.25 "${GATE[@]}" \
    --out "$WORK/model.json"
else
  step model 60 $PY bench/gpu/checks.py model "$MODEL" --budget 0.3 "${GATE[@]}" "${DRY[@]}" --out "$WORK/model.json"
fi
if [[ "$MODE" == gpu ]] && $PY -c "import nvidia.dali" 2>/dev/null; then
  step decode 30 $PY bench/gpu/checks.py codec --min-seconds 0.25 --out "$WORK/codec.json"
elif [[ "$MODE" == gpu ]]; then
  skip decode "DALI is not installed: the DALI decode grid needs it (the e2e step decoded with torchvision)"
elif $PY -c "import nvidia.dali" 2>/dev/null; then
  step decode 30 $PY bench/gpu/checks.py codec --dry-run-cpu --out "$WORK/codec.json"
else
  skip decode "no GPU and no DALI: nothing to measure"
fi
step retouch 20 env OUT="$WORK" $PY bench/gpu/checks.py retouch --repeat 3
if $PY -c "import pytest" 2>/dev/null; then
  step parity 60 $PY -m pytest -q -p no:cacheprovider -m gpu -rs tests/gpu_kernels/test_codec_gpu.py \
    tests/gpu_kernels/test_pipeline_gpu.py tests/gpu_kernels/test_retouch_gpu.py tests/gpu_kernels/test_segment_gpu.py \
    tests/gpu_kernels/test_segment_runtime_gpu.py tests/gpu_kernels/test_shadow_gpu.py \
    tests/gpu_kernels/test_segment_torch_gpu.py
else
  skip parity "pytest is not installed (bench/gpu/suite.py pack puts it in the folder)"
fi
echo "gpu_suite: $MODE run done in ${SECONDS}s: $OUT/gpu_suite.json, $OUT/gpu_suite.png, $OUT/gpu_suite.tar.gz"

#!/usr/bin/env bash
# One GPU validation run, within 8 minutes on one H200; writes $OUT/gpu_suite.json + .png.
#
#   OUT=out/gpu_suite bash bench/gpu_suite.sh [MODEL.onnx]
#
# Steps (each under its own time limit; the sum is 545 s):
#   parity   75 s  GPU-vs-CPU parity tests: pytest -m gpu tests/*_gpu.py
#   torch    90 s  u2netp on PyTorch (needs only torch's CUDA build + CuPy, no extra wheels):
#                  fp16/bf16/fp32 x CUDA graphs off/on, fp16 compiled, by batch 1-64; the
#                  torch-fp16 gate vs ONNX Runtime fp32 masks (bench/gpu_model_grid.py --torch)
#   decode   75 s  DALI decode grid, nvJPEG encode sizes       (bench/gpu_check_codec.py)
#   retouch  60 s  retouch kernels: bandwidth vs a device copy (bench/gpu_check_retouch.py)
#   model   100 s  u2netp on ONNX Runtime GPU (when its wheels installed) by batch 1-64:
#                  fp32/fp16 x CUDA graphs off/on (+TensorRT), FP16 gate (bench/gpu_model_grid.py)
#   e2e     130 s  lightbox process engine: img/s, p50/p99 at 3 presets, batch 1-64
#                                                             (bench/gpu_e2e_grid.py)
#   report   15 s  merge into gpu_suite.json, draw gpu_suite.png (bench/gpu_suite_report.py)
#
# Without a GPU every step still runs: the GPU tests skip, the GPU checks write "skipped", the
# model and e2e grids run small CPU dry runs. The output says which parts were skipped.
# MODEL: the batched u2netp (default: .gpumodel/u2netp.batched.onnx, else the cached one).
# Gate images for the FP16 gate: .gpumodel/gate (written here by
#   python bench/gpu_model_grid.py --export-gate-images .gpumodel/gate).
# How to bring the wheels and the model to the GPU machine: README.md, "GPU validation run".
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu_suite}
PY=${PYTHON:-python3}
PARTS="$OUT/parts"
mkdir -p "$PARTS"
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
export OPENBLAS_NUM_THREADS=1

MODEL=${1:-}
if [[ -z "$MODEL" && -f .gpumodel/u2netp.batched.onnx ]]; then MODEL=.gpumodel/u2netp.batched.onnx; fi
if [[ -z "$MODEL" ]]; then MODEL=$($PY -m gpu_kernels.segment.fetch_model 2>/dev/null | sed -n 2p); fi
GATE_ARGS=()
if [[ -d .gpumodel/gate ]]; then GATE_ARGS=(--gate-images .gpumodel/gate); fi

GPUS=$($PY -c "import cupy; print(cupy.cuda.runtime.getDeviceCount())" 2>/dev/null || echo 0)
if [[ "$GPUS" -gt 0 ]]; then
  echo "gpu_suite: $GPUS CUDA device(s); model ${MODEL:-none}"
  DRY=()
else
  echo "gpu_suite: NO GPU on this machine: GPU tests skip, GPU checks write 'skipped', model and e2e grids run CPU dry runs"
  DRY=(--dry-run-cpu)
fi
: > "$PARTS/steps.jsonl"

step() {  # step NAME LIMIT_S COMMAND...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "== $name (limit ${limit}s): $*"
  timeout --kill-after=5 "$limit" "$@" > "$PARTS/$name.log" 2>&1
  local rc=$?
  tail -n 4 "$PARTS/$name.log" | sed "s/^/   $name | /"
  echo "{\"step\": \"$name\", \"rc\": $rc, \"seconds\": $((SECONDS - t0)), \"limit_s\": $limit}" >> "$PARTS/steps.jsonl"
}

if $PY -c "import pytest" 2>/dev/null; then
  step parity 75 $PY -m pytest -q -p no:cacheprovider -m gpu -rs tests/gpu_kernels/test_codec_gpu.py tests/gpu_kernels/test_pipeline_gpu.py \
    tests/gpu_kernels/test_retouch_gpu.py tests/gpu_kernels/test_segment_gpu.py tests/gpu_kernels/test_segment_runtime_gpu.py tests/gpu_kernels/test_shadow_gpu.py \
    tests/gpu_kernels/test_segment_torch_gpu.py
else
  echo "== parity skipped: pytest is not installed here"
  echo '{"step": "parity", "rc": -1, "seconds": 0, "skipped": "pytest not installed"}' >> "$PARTS/steps.jsonl"
fi
TORCH=$($PY -c "import importlib.util as u; print(int(u.find_spec('torch') is not None))" 2>/dev/null || echo 0)
if [[ "$TORCH" == 1 && -n "$MODEL" ]]; then  # first: the model path that needs no extra wheels on the GPU machine
  step torch 90 $PY bench/gpu_model_grid.py "$MODEL" --torch --deadline 70 "${GATE_ARGS[@]}" "${DRY[@]}" \
    --out "$PARTS/torch.json" --budget 0.3
else
  echo "== torch skipped: torch is not installed here (or no model file)"
  echo '{"step": "torch", "rc": -1, "seconds": 0, "skipped": "torch not installed"}' >> "$PARTS/steps.jsonl"
fi
step decode 75 $PY bench/gpu_check_codec.py --out "$PARTS/codec.json" --min-seconds 0.5
step retouch 60 env OUT="$PARTS" $PY bench/gpu_check_retouch.py --repeat 3
CUDA_EP=$($PY -c "import onnxruntime as o; print(int('CUDAExecutionProvider' in o.get_available_providers()))" \
  2>/dev/null || echo 0)
if [[ "$GPUS" -gt 0 && "$CUDA_EP" != 1 ]]; then
  echo "== model skipped: ONNX Runtime has no CUDA provider here (bring onnxruntime-gpu)"
  echo '{"step": "model", "rc": -1, "seconds": 0, "skipped": "no CUDA provider in onnxruntime"}' >> "$PARTS/steps.jsonl"
elif [[ -n "$MODEL" ]]; then
  step model 100 $PY bench/gpu_model_grid.py "$MODEL" "${GATE_ARGS[@]}" "${DRY[@]}" --out "$PARTS/model.json" --budget 0.4
else
  echo '{"step": "model", "rc": -1, "seconds": 0, "skipped": "no model file"}' >> "$PARTS/steps.jsonl"
fi
step e2e 130 $PY bench/gpu_e2e_grid.py --n ${E2E_N:-256} --batches ${E2E_BATCHES:-1,8,32,64} --out "$PARTS/e2e.json"
step report 15 $PY bench/gpu_suite_report.py "$PARTS" "$OUT/gpu_suite.json" "$OUT/gpu_suite.png"
cat "$PARTS/report.log"
echo "gpu_suite: done in ${SECONDS}s; $OUT/gpu_suite.json, $OUT/gpu_suite.png"

#!/usr/bin/env bash
# Issue 36's measurements on the GPU machine in one call (kit from bench/gpu_pipeline_kit.sh, carried with the
# device tool's carry=[KIT]):
#   1. bench/gpu_pipeline.py: the stages, the kernel times and each target's ratio (parts 1 and 2), on edgedeploy's
#      CUDA backend; then its frame graphs' A/B alone on the apache-tvm wheel's backend (--graphs-only);
#   2. bench/multi_source.py: one agent with 1, 4 and 16 video sources against as many one-source agents, on the
#      kit's MobileNetV1-0.25 INT8 bundles (part 3): aggregate fps and p99 frame latency per source.
#   bash KIT/src/bench/gpu_pipeline.sh KIT OUT        (OUT outside the source tree: bench/results_dir.py)
# Each part has its own time limit (PIPELINE_S, MULTI_S seconds), so that one that hangs leaves the other's output.
set -euo pipefail
kit=$(realpath -m "$1"); out=$(python3 "$(dirname "$0")/results_dir.py" "$2") || exit 2
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$kit"/wheels/*.whl
export PYTHONPATH=/tmp/site:$kit/src/agent PYTHONUNBUFFERED=1
mkdir -p /tmp/kit && cp "$kit"/lib/* /tmp/kit/ # libcudart.so.13 beside the CUDA backend: RUNPATH $ORIGIN
export TVM_RUNTIME_LIB=/tmp/kit/libtvm_runtime.so
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
rc=0
timeout "${PIPELINE_S:-240}" python3 "$kit/src/bench/gpu_pipeline.py" "$kit" --json "$out/gpu_pipeline.json" 2>&1 |
  tee "$out/gpu_pipeline.txt" || rc=$?
echo "gpu_pipeline.py: ${SECONDS} s since the start" | tee -a "$out/gpu.txt"
# the frame graphs with the apache-tvm wheel's CUDA backend (the run above: edgedeploy's, beside it in the kit)
CUDA_BACKEND=tvm timeout "${WHEEL_S:-120}" python3 "$kit/src/bench/gpu_pipeline.py" "$kit" --graphs-only 2>&1 |
  tee "$out/graphs_wheel_backend.txt" || rc=$?
echo "--graphs-only: ${SECONDS} s since the start" | tee -a "$out/gpu.txt"
timeout "${MULTI_S:-300}" python3 "$kit/src/bench/multi_source.py" --profile h200 --bundles "$kit/multi" \
  --video "$kit/video/bikes.mp4" --sources "${SOURCES:-1,4,16}" --frames 250 --max-batch 16 --wait-ms 10 \
  --repeat "${REPEAT:-3}" --work /tmp/multi --json "$out/multi_source.json" 2>&1 | tee "$out/multi_source.txt" ||
  rc=$?
echo "multi_source.py: ${SECONDS} s since the start" | tee -a "$out/gpu.txt"
exit $rc

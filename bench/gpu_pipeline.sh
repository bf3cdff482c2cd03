#!/usr/bin/env bash
# Issue 36's table on the GPU machine in one call (kit from bench/gpu_pipeline_kit.sh, carried with the device
# tool's carry=[KIT]); prints the stages, the kernel times and each target's ratio:
#   bash KIT/src/bench/gpu_pipeline.sh KIT OUT        (OUT outside the source tree: bench/results_dir.py)
set -euo pipefail
kit=$(realpath -m "$1"); out=$(python3 "$(dirname "$0")/results_dir.py" "$2") || exit 2
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$kit"/wheels/*.whl
export PYTHONPATH=/tmp/site:$kit/src/agent PYTHONUNBUFFERED=1
mkdir -p /tmp/kit && cp "$kit"/lib/* /tmp/kit/ # libcudart.so.13 beside the CUDA backend: RUNPATH $ORIGIN
export TVM_RUNTIME_LIB=/tmp/kit/libtvm_runtime.so
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
python3 "$kit/src/bench/gpu_pipeline.py" "$kit" --json "$out/gpu_pipeline.json" 2>&1 | tee "$out/gpu_pipeline.txt"

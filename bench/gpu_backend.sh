#!/usr/bin/env bash
# Issue 39 on the GPU machine in one call: every bundle of the kit through the TVM wheel's CUDA backend and
# edgedeploy's (bit-identical outputs, speed ratio), then the t4/xavier twins through edgedeploy's against
# their references (bench/gpu_backend.py says how each is judged). From the repo root:
#
#   bash bench/gpu_backend.sh KIT OUT
#
# KIT comes from bench/gpu_kit.sh (wheels/, lib/ with libedgedeploy_cuda.so beside the wheel's libraries,
# bundles/<model>/*.edb for the h200 profile) and bench/twin_kit.sh (twins/*.edb, backend_reference.npz).
# Carry, under 64 MiB: [".gpu/wheels", ".gpu/lib", ".gpu/bundles", ".gpu/twins", ".gpu/backend_reference.npz"].
# Writes OUT/gpu.txt, OUT/compare.txt, OUT/twins.txt.
set -euo pipefail
kit=$(realpath "$1")
out=$(python3 bench/results_dir.py "$2") || exit 2 # made; refused inside the source tree
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$kit"/wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD/agent:$PWD/bench PYTHONUNBUFFERED=1
# two runtime folders, one CUDA backend beside libtvm_runtime.so in each (the agent's layout)
mkdir -p /tmp/rt-tvm /tmp/rt-edgedeploy
cp "$kit"/lib/libtvm_runtime.so "$kit"/lib/libtvm_runtime_cuda.so "$kit"/lib/libcudart.so.13 /tmp/rt-tvm/
cp "$kit"/lib/libtvm_runtime.so "$kit"/lib/libedgedeploy_cuda.so /tmp/rt-edgedeploy/
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv | tee "$out/gpu.txt"
status=0
python3 bench/gpu_backend.py compare --tvm /tmp/rt-tvm --edgedeploy /tmp/rt-edgedeploy "$kit"/bundles/*/*.edb \
  2>&1 | tee "$out/compare.txt" || status=1
if [ -d "$kit/twins" ]; then
  # no JIT cache: every twin's PTX is compiled by this driver in this run
  CUDA_CACHE_DISABLE=1 python3 bench/gpu_backend.py twins --runtime /tmp/rt-edgedeploy "$kit/backend_reference.npz" \
    "$kit"/twins/*.edb "$kit"/bundles/*/*.edb 2>&1 | tee "$out/twins.txt" || status=1
fi
exit $status

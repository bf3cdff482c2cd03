#!/usr/bin/env bash
# The agent end to end on the GPU machine (H200, CUDA 13 driver, Python 3.12), from the repo root:
#   bash bench/gpu_e2e.sh KIT OUT
# KIT (prepared on the build host by bench/gpu_kit.sh, with at least mobilenet_v1_0.25_224.fp32.bs1):
# wheels/, lib/, bundles/, images/video.mp4. Writes gpu.txt, deploy.json, reports.json to OUT.
# The speed comparison with PyTorch is bench/gpu_bench.sh.
set -euo pipefail
kit=$(realpath "$1"); out=$(python3 bench/results_dir.py "$2") || exit 2
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$kit"/wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD/agent:$PWD/bench
mkdir -p /tmp/kit && cp "$kit"/lib/* /tmp/kit/        # libcudart.so.13 beside the CUDA backend: RUNPATH $ORIGIN
export TVM_RUNTIME_LIB=/tmp/kit/libtvm_runtime.so
nvidia-smi --query-gpu=name,driver_version,power.draw --format=csv | tee "$out/gpu.txt"

echo "== 1. the agent on a video (process mode, runtime-only TVM, CUDA)"
root=/tmp/agent-root
agent() { python3 -m edgedeploy_agent --root "$root" --json "$@"; }
agent init --service process --tvm-runtime-lib "$TVM_RUNTIME_LIB" --source "file:$kit/images/video.mp4" --report-interval 60 >/dev/null
cp "$kit/bundles/mobilenet_v1_0.25_224/mobilenet_v1_0.25_224.fp32.bs1.edb" "$root/incoming/b.edb"
agent deploy "$root/incoming/b.edb" --timeout 300 | tee "$out/deploy.json"
for _ in $(seq 1 300); do
  state=$(python3 -c "import json; print(json.load(open('$root/run/health.json'))['state'])")
  [ "$state" = finished ] || [ "$state" = failed ] && break
  sleep 1
done
echo "agent state: $state"
agent reports > "$out/reports.json"
tail -n 5 "$root/logs/agent.log" || true


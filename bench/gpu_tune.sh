#!/usr/bin/env bash
# Tunes on the GPU machine (H200, Python 3.12, CUDA 13) what bench/gpu_tune_kit.sh exported:
#   bash bench/gpu_tune.sh KIT OUT TRIALS [TASKS]
# Each module is tuned by edgedeploy.compile.tune_offline (cost model "random": no xgboost there), TASKS > 0
# limiting it to the heaviest kernels; the run ends on its own (a stopped run loses its last round).
# Then bench/gpu_tuned_vs_default.py times the module with default schedules and with the database.
# OUT gets tuned.tar.xz (one folder per module: tuning.json + database) and the logs. Then, here:
#   tar -C DIR -xJf tuned.tar.xz; edgedeploy tune --import DIR/<module> [--database profiles/tuning/...]
set -uo pipefail
kit=$(realpath "$1"); out=$(realpath "$2"); trials=${3:?trials}; tasks=${4:-0}
site=/tmp/tvm-site; work=/tmp/tune
mkdir -p "$site" "$work"
tar -C "$site" -xJf "$kit/tvm-py.tar.xz"
tar -C "$site" -xJf "$kit/tvm-ffi-cp312.tar.xz"
xz -dc "$kit/libtvm_compiler.so.xz" > "$site/tvm/lib/libtvm_compiler.so"
tar -C "$work" -xJf "$kit/tasks.tar.xz"
export PYTHONPATH=$site:$PWD/host PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for d in "$work"/*/; do
  name=$(basename "$d")
  echo "== $name: $trials trials over ${tasks/#0/all} kernels"
  python3 -m edgedeploy.compile.tune_offline "$d" --trials "$trials" --tasks "$tasks" --cost-model random \
    > "$out/$name.log" 2>&1
  grep -E 'tasks,|tuned in|Total trials|Total latency' "$out/$name.log" | tail -n 3
  grep -h 'Error in' "$d"/logs/*.log 2>/dev/null | sed 's/.*Error in/Error in/' | sort | uniq -c
  python3 -m edgedeploy.compile.tune_offline "$d" --trials 0   # repairs a torn last line, counts records
  python3 bench/gpu_tuned_vs_default.py "$d" 2>&1 | grep -v '^\['
done
rm -rf "$work"/*/logs "$work"/*/tuning-module.json
tar -C "$work" -cJf "$out/tuned.tar.xz" .

#!/usr/bin/env bash
# Tunes on the GPU machine (H200, Python 3.12, CUDA 13) what bench/gpu_tune_kit.sh exported:
#   bash bench/gpu_tune.sh KIT OUT TRIALS [TASKS] [GEMM_MINUTES [GEMM_TRIALS]]
# GEMM_MINUTES > 0: first the tensor-core GEMM search (compile/tuning/gemm.py) for that long per module,
# at most GEMM_TRIALS candidates (0: all); it writes gemm_configs.json, which survives a stopped run.
# TRIALS > 0: then MetaSchedule on each module (cost model "random": no xgboost there), TASKS > 0
# limiting it to the heaviest kernels; the run ends on its own (a stopped run loses its last round),
# and bench/gpu_tuned_vs_default.py times the module with default schedules and with the database.
# The compiler travels in two parts (bench/gpu_tune_kit.sh): a first call carries KIT/compiler.xz.part00 and
# runs `cp KIT/compiler.xz.part00 /tmp/`; the next, within the machine's 30 s idle release, carries
# KIT/compiler.xz.part01, tvm-py.tar.xz, tvm-ffi-cp312.tar.xz and tasks.tar.xz and runs this script.
# OUT gets tuned.tar.xz (one folder per module: tuning.json + database) and the logs. Then, here:
#   tar -C DIR -xJf tuned.tar.xz; edgedeploy tune --import DIR/<module> [--database profiles/tuning/...]
set -uo pipefail
kit=$(realpath "$1"); out=$(python3 bench/results_dir.py "$2") || exit 2; trials=${3:?trials}; tasks=${4:-0}; gemm=${5:-0}; gemm_trials=${6:-0}
site=/tmp/tvm-site; work=/tmp/tune
mkdir -p "$site" "$work"
tar -C "$site" -xJf "$kit/tvm-py.tar.xz"
tar -C "$site" -xJf "$kit/tvm-ffi-cp312.tar.xz"
# (a later call on the same warm machine may name the library an earlier one unpacked, as TVM_COMPILER_SO)
if [ -n "${TVM_COMPILER_SO:-}" ]; then cp "$TVM_COMPILER_SO" "$site/tvm/lib/libtvm_compiler.so"
else
  [ -f /tmp/compiler.xz.part00 ] || { echo "no /tmp/compiler.xz.part00: run the first call (above)" >&2; exit 2; }
  cat /tmp/compiler.xz.part00 "$kit/compiler.xz.part01" | xz -dc > "$site/tvm/lib/libtvm_compiler.so"
  cp "$site/tvm/lib/libtvm_compiler.so" /tmp/libtvm_compiler.so # for TVM_COMPILER_SO in a later call
fi
tar -C "$work" -xJf "$kit/tasks.tar.xz"
export PYTHONPATH=$site:$PWD/host:$PWD/agent PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for d in "$work"/*/; do
  name=$(basename "$d")
  if [ "$gemm" != 0 ]; then
    echo "== $name: tensor-core GEMM search, $gemm min"
    python3 -m edgedeploy.compile.tune_offline "$d" --trials 0 --gemm-minutes "$gemm" --gemm-trials "$gemm_trials" \
      2>&1 | tee "$out/$name.gemm.log" | grep -E '^gemm|Error' || true
    cp "$d/gemm_configs.json" "$out/$name.gemm_configs.json" 2>/dev/null || true
  fi
  [ "$trials" = 0 ] && continue
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

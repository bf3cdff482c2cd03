#!/usr/bin/env bash
# Nsight Compute counters for the kernels of bundles, on the GPU machine (H200, python3 3.12), from the repo
# root, carrying KIT/wheels, KIT/lib and the bundles:
#
#   bash bench/gpu_ncu.sh KIT OUT BUNDLE...      # KERNELS=regex (default: conv) COUNT=N (default 40) SKIP=N
#
# Each bundle runs twice (bench/gpu_memcheck.py); ncu profiles the first COUNT launches whose kernel name
# matches KERNELS, after skipping SKIP of them (each replayed alone, caches flushed, clocks locked):
# speed of light, occupancy, launch, warp stall and memory tables. Writes OUT/ncu.<bundle>.txt and a line
# per kernel (bench/ncu_summary.py) to OUT/ncu_summary.<bundle>.txt. Use it to
# see what bounds a kernel (shared-memory bank conflicts, issue stalls, occupancy) before changing a schedule.
set -euo pipefail
kit=$(realpath "$1")
out=$(python3 bench/results_dir.py "$2") || exit 2 # made; refused inside the source tree
shift 2
# shellcheck source=bench/gpu_kit_env.sh
source bench/gpu_kit_env.sh
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1 || true)
if [ -z "$ncu" ]; then
  echo "gpu_ncu: no ncu on this machine" >&2
  exit 2
fi
"$ncu" --version | tail -n 1
for bundle in "$@"; do
  name=$(basename "$bundle" .edb)
  timeout 300 "$ncu" --kernel-name "regex:${KERNELS:-conv}" --launch-skip "${SKIP:-0}" --launch-count "${COUNT:-40}" \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis_Tables --section ComputeWorkloadAnalysis \
    python3 bench/gpu_memcheck.py "$bundle" >"$out/ncu.$name.txt" 2>&1 || echo "ncu: exit $?" >>"$out/ncu.$name.txt"
  python3 bench/ncu_summary.py "$out/ncu.$name.txt" | tee "$out/ncu_summary.$name.txt"
done

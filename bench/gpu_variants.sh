#!/usr/bin/env bash
# Build variants of the same bundles, compared on the GPU machine (H200, python3 3.12 with torch), from the
# repo root, carrying KIT/wheels, KIT/lib and KIT/var (bundles named <model>.<prec>.bs<N>.<variant>.edb)
# and, optionally, KIT/int8_reference.npz (bench/int8_gpu_reference.py make):
#
#   bash bench/gpu_variants.sh KIT OUT BEFORE,AFTER [AFTER,NEXT ...]
#
# For each pair: bench/tc_compare.py (median ms, speed-up, INT8 outputs bit-identical?, per-kernel profile;
# no torch peer: bench/gpu_bench.sh is the peer benchmark);
# then the INT8 bundles against the exact INT8 reference, and every bundle under compute-sanitizer memcheck
# (MEMCHECK=0 skips it: ~4 min; TOP=N lists N kernels per bundle in the profile, default 12).
# Writes OUT/gpu.txt, OUT/<before>_<after>.{txt,json}, OUT/reference.txt, OUT/memcheck.txt.
set -euo pipefail
kit=$(realpath "$1")
out=$(python3 bench/results_dir.py "$2") || exit 2 # made; refused inside the source tree
shift 2
# shellcheck source=bench/gpu_kit_env.sh
source bench/gpu_kit_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$out/gpu.txt"
for pair in "$@"; do
  tag=${pair/,/_}
  python3 bench/tc_compare.py --bundles "$kit/var" --variants "$pair" --no-peer --profile --top "${TOP:-12}" --json "$out/$tag.json" |
    tee "$out/$tag.txt"
done
if [ -f "$kit/int8_reference.npz" ]; then
  python3 bench/int8_gpu_reference.py check "$kit/int8_reference.npz" "$kit"/var/*.int8.*.edb | tee "$out/reference.txt" || true
fi
if [ "${MEMCHECK:-1}" != 0 ] && command -v compute-sanitizer >/dev/null; then
  timeout 240 compute-sanitizer --tool memcheck --print-limit 20 python3 bench/gpu_memcheck.py "$kit"/var/*.edb \
    >"$out/memcheck.txt" 2>&1 || echo "memcheck: exit $?" | tee -a "$out/memcheck.txt"
  tail -n 5 "$out/memcheck.txt"
fi

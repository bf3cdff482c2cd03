#!/usr/bin/env bash
# run23 call 1: ResNet-18 stem space-to-depth a/b (INT8 bs1/bs64, FP16 bs64), MobileNet window_epilogue b/c,
# the FP16 MobileNet fault under memcheck beside the INT8 bundle.
set -u
export kit=.gpu; source bench/gpu_kit_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
mkdir -p $OUT/s2d $OUT/window
t() { echo "== $*"; "$@"; }
t python3 bench/tc_compare.py --bundles .gpu/s2d --variants a,b --no-peer --profile --top 40 --json $OUT/s2d/ab.json > $OUT/s2d/ab.txt 2>&1
t python3 bench/tc_compare.py --bundles .gpu/s2d --variants b,a --no-peer --json $OUT/s2d/ba.json > $OUT/s2d/ba.txt 2>&1
t python3 bench/int8_gpu_reference.py check .gpu/s2d_reference.npz .gpu/s2d/resnet18.int8.bs*.edb > $OUT/s2d/ref.txt 2>&1
t python3 bench/tc_compare.py --bundles .gpu/mbvar --variants b,c --no-peer --profile --top 30 --json $OUT/window/bc.json > $OUT/window/bc.txt 2>&1
t python3 bench/int8_gpu_reference.py check .gpu/mb_reference.npz .gpu/mbvar/mobilenet.int8.bs64.c.edb .gpu/mbvar/mobilenet.int8.bs1.c.edb > $OUT/window/ref.txt 2>&1
t timeout 150 compute-sanitizer --tool memcheck --print-limit 20 python3 bench/gpu_memcheck.py .gpu/mbvar/mobilenet.int8.bs64.b.edb .gpu/mbvar/mobilenet.fp16.bs64.b.edb > $OUT/window/memcheck-pair.txt 2>&1
for f in $OUT/s2d/*.txt $OUT/window/*.txt; do echo "#### $f"; grep -v "^\s*$" $f | tail -60; done

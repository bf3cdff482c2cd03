#!/usr/bin/env bash
# run24 call 2: b = fp32_rounding (call 1's b); c = b + unroll_epilogue=1 (ResNet-18 INT8 batch 1/64, MobileNet
# INT8 batch 64); d = b + injective_ilp=4 (MobileNet INT8 batch 64: its input quantize + pad); c and d against
# the exact INT8 reference.
# carry [".gpu/wheels", ".gpu/lib", ".gpu/rq2", ".gpu/int8_reference.npz", ".gpu/mb_kit_reference.npz"]
set -u
export kit=.gpu; source bench/gpu_kit_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
mkdir -p $OUT/unroll $OUT/ilp
t() { echo "== $*"; "$@"; }
t python3 bench/tc_compare.py --bundles .gpu/rq2 --variants b,c --no-peer --profile --top 40 --json $OUT/unroll/bc.json > $OUT/unroll/bc.txt 2>&1
t python3 bench/tc_compare.py --bundles .gpu/rq2 --variants c,b --no-peer --json $OUT/unroll/cb.json > $OUT/unroll/cb.txt 2>&1
t python3 bench/tc_compare.py --bundles .gpu/rq2 --variants b,d --no-peer --profile --top 12 --json $OUT/ilp/bd.json > $OUT/ilp/bd.txt 2>&1
t python3 bench/int8_gpu_reference.py check .gpu/int8_reference.npz .gpu/rq2/resnet18.int8.bs*.c.edb > $OUT/unroll/ref.txt 2>&1
t python3 bench/int8_gpu_reference.py check .gpu/mb_kit_reference.npz .gpu/rq2/mobilenet_v1_0.25_224.int8.bs64.[cd].edb >> $OUT/unroll/ref.txt 2>&1
for f in $OUT/unroll/*.txt $OUT/ilp/*.txt; do echo "#### $f"; grep -v "^\s*$" $f | grep -v "UserWarning\|_warn_once" | grep -v "bs1\.[bc]\.edb  " | head -70; done

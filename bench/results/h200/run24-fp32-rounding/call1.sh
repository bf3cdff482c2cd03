#!/usr/bin/env bash
# run24 call 1: INT8 rounding on the FP32 pipe (Knobs.fp32_rounding), a = main's bundles (fp32_rounding did not
# exist: nearbyintf + float->int), b = this change; ResNet-18 and MobileNetV1-0.25 INT8 at batch 1 and 64, one
# process per model order, then the b bundles against the exact INT8 reference.
# carry [".gpu/wheels", ".gpu/lib", ".gpu/rq", ".gpu/int8_reference.npz", ".gpu/mb_kit_reference.npz"]
set -u
export kit=.gpu; source bench/gpu_kit_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
mkdir -p $OUT/rq
t() { echo "== $*"; "$@"; }
t python3 bench/tc_compare.py --bundles .gpu/rq --variants a,b --no-peer --profile --top 40 --json $OUT/rq/ab.json > $OUT/rq/ab.txt 2>&1
t python3 bench/tc_compare.py --bundles .gpu/rq --variants b,a --no-peer --json $OUT/rq/ba.json > $OUT/rq/ba.txt 2>&1
t python3 bench/int8_gpu_reference.py check .gpu/int8_reference.npz .gpu/rq/resnet18.int8.bs*.b.edb > $OUT/rq/ref.txt 2>&1
t python3 bench/int8_gpu_reference.py check .gpu/mb_kit_reference.npz .gpu/rq/mobilenet_v1_0.25_224.int8.bs*.b.edb >> $OUT/rq/ref.txt 2>&1
for f in $OUT/rq/*.txt; do echo "#### $f"; grep -v "^\s*$" $f | grep -v "UserWarning\|_warn_once" | head -80; done

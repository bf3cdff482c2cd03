#!/usr/bin/env bash
# run25 call 3: a = INT8 ResNet-18 built with EDGEDEPLOY_CUDA_KNOBS=int8_boundaries=0 (the dequantizes where FuseOps
# put them: float32 between kernels), b = the same with int8_boundaries on (this run), both with this run's GEMM
# database (tuning/); one process, both orders; then b against the exact INT8 reference, and the final FP16 beside
# INT8 at batch 64 (CUPTI per-kernel profile).
# carry [".gpu/wheels", ".gpu/lib", ".ab", ".gpu/int8_reference.npz"]
set -u
export kit=.gpu; source bench/gpu_kit_env.sh
python3 bench/tc_compare.py --bundles .ab --variants a,b --no-peer --profile --top 40 --json $OUT/ab.json > $OUT/ab.txt 2>&1
python3 bench/tc_compare.py --bundles .ab --variants b,a --no-peer > $OUT/ba.txt 2>&1
python3 bench/int8_gpu_reference.py check .gpu/int8_reference.npz .ab/resnet18.bs64.b.edb .ab/resnet18.bs1.b.edb \
  .ab/resnet18.bs64.a.edb > $OUT/reference.txt 2>&1
mkdir -p /tmp/fin && cp .ab/resnet18.bs64.b.edb /tmp/fin/resnet18.bs64.int8.edb && cp .ab/resnet18.bs64.fp16.edb /tmp/fin/resnet18.bs64.fp16.edb
python3 bench/tc_compare.py --bundles /tmp/fin --variants fp16,int8 --no-peer --profile --top 40 --json $OUT/final.json > $OUT/final.txt 2>&1
for f in ab ba final; do grep -v "UserWarning\|_warn_once\|^\s*$" $OUT/$f.txt | grep -v "^  .*bs1" | head -12; done
cat $OUT/reference.txt | tail -8

#!/usr/bin/env bash
# run26 call 3: the bundles rebuilt with this run's GEMM databases (new) against the ones before (old), one
# process each pair (CUPTI per-kernel profile); the new INT8 ones against the exact INT8 reference; the final
# FP16 beside INT8 at batch 64; then the benchmark beside the peer; then bench/resnet18_onnx.py's file as this
# host's torch writes it (its graph digest is checked on the build host).
# carry [".gpu/wheels", ".gpu/lib", ".gpu/models", ".gpu/images", ".gpu/KIT.json", ".gpu/bundles/resnet18",
#        ".gpu/int8_reference.npz", ".r26/ab"]
set -u
export kit=.gpu; source bench/gpu_kit_env.sh
d=.r26/ab
mkdir -p /tmp/i8 /tmp/f16 /tmp/fin
for b in bs64 bs1; do for v in old new; do cp $d/resnet18.int8.$b.$v.edb /tmp/i8/resnet18.$b.$v.edb; done; done
for v in old new; do cp $d/resnet18.fp16.bs64.$v.edb /tmp/f16/resnet18.bs64.$v.edb; done
cp $d/resnet18.int8.bs64.new.edb /tmp/fin/resnet18.bs64.int8.edb; cp $d/resnet18.fp16.bs64.new.edb /tmp/fin/resnet18.bs64.fp16.edb
python3 bench/tc_compare.py --bundles /tmp/i8 --variants old,new --no-peer --profile --top 40 --json $OUT/int8.json > $OUT/int8.txt 2>&1
python3 bench/tc_compare.py --bundles /tmp/f16 --variants old,new --no-peer --profile --top 40 --json $OUT/fp16.json > $OUT/fp16.txt 2>&1
python3 bench/tc_compare.py --bundles /tmp/fin --variants fp16,int8 --no-peer --profile --top 40 --json $OUT/final.json > $OUT/final.txt 2>&1
python3 bench/int8_gpu_reference.py check .gpu/int8_reference.npz $d/resnet18.int8.bs64.new.edb $d/resnet18.int8.bs1.new.edb > $OUT/reference.txt 2>&1
for f in int8 fp16 final; do grep -v "UserWarning\|_warn_once\|^\s*$" $OUT/$f.txt | head -8; done
tail -6 $OUT/reference.txt
mkdir -p $OUT/bench
timeout 420 bash bench/gpu_bench.sh .gpu $OUT/bench resnet18 1,64 --modes reduce-overhead --deadline-s 330 > $OUT/bench/log.txt 2>&1
grep -E "ratio|INT8|int8|x the|met|PEER|MISMATCH" $OUT/bench/log.txt | tail -30
PYTHONPATH=$PYTHONPATH:$PWD/host timeout 60 python3 bench/resnet18_onnx.py /tmp/r_dev.onnx --weights tiled --seed 0 > $OUT/onnx.txt 2>&1 && gzip -c /tmp/r_dev.onnx > $OUT/r_dev.onnx.gz
sha256sum /tmp/r_dev.onnx; tail -3 $OUT/onnx.txt

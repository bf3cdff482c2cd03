#!/usr/bin/env bash
# run27 call 3, after calls 1-2 (the GEMM search with 128-deep INT8 mma stages, bench/gpu_tune.sh, INT8 batch 64):
# the rebuilt INT8 batch-64 bundle (new) against the one before (old), the final FP16 beside INT8 in both
# orders (CUPTI per kernel), the exact INT8 reference, and the benchmark beside the peer at batch 1 and 64.
# carry [".gpu/wheels", ".gpu/lib", ".gpu/models", ".gpu/images", ".gpu/KIT.json", ".gpu/bundles/resnet18",
#        ".gpu/int8_reference.npz", ".r27/ab"]
set -u
o=/tmp/run27; mkdir -p $o/bench /tmp/i8 /tmp/fin
export kit=.gpu; source bench/gpu_kit_env.sh
d=.r27/ab; g=.gpu/bundles/resnet18
cp $d/resnet18.int8.bs64.old.edb /tmp/i8/resnet18.bs64.old.edb; cp $g/resnet18.int8.bs64.edb /tmp/i8/resnet18.bs64.new.edb
cp $g/resnet18.int8.bs64.edb /tmp/fin/resnet18.bs64.int8.edb; cp $g/resnet18.fp16.bs64.edb /tmp/fin/resnet18.bs64.fp16.edb
python3 bench/tc_compare.py --bundles /tmp/i8 --variants old,new --no-peer --profile --top 40 --json $o/int8.json > $o/int8.txt 2>&1
python3 bench/tc_compare.py --bundles /tmp/fin --variants fp16,int8 --no-peer --profile --top 40 --json $o/final.json > $o/final.txt 2>&1
python3 bench/tc_compare.py --bundles /tmp/fin --variants int8,fp16 --no-peer > $o/final_reversed.txt 2>&1
python3 bench/int8_gpu_reference.py check .gpu/int8_reference.npz $g/resnet18.int8.bs64.edb $g/resnet18.int8.bs1.edb > $o/reference.txt 2>&1
for f in int8 final final_reversed; do grep -E "ms .*img/s|x old|x fp16|x int8" $o/$f.txt; done
tail -3 $o/reference.txt
timeout 420 bash bench/gpu_bench.sh .gpu $o/bench resnet18 1,64 --modes reduce-overhead --deadline-s 380 > $o/bench/log.txt 2>&1
grep -v "UserWarning\|_warn_once\|^\s*$\|^\[" $o/bench/log.txt | tail -24
tar -C $o -czf $OUT/run27-call3.tar.gz .

#!/usr/bin/env bash
# run26 call 9, after calls 7-8 (the search again with the deeper cp.async pipelines, bench/gpu_tune.sh as calls
# 1-2, INT8 and FP16 batch 64): the rebuilt bundles (new) against call 3's (old), the final FP16 beside INT8
# (CUPTI per kernel), the exact INT8 reference, and the benchmark beside the peer at batch 64.
# carry [".gpu/wheels", ".gpu/lib", ".gpu/models", ".gpu/images", ".gpu/KIT.json", ".gpu/bundles/resnet18",
#        ".gpu/int8_reference.npz", ".r26/ab"]
set -u
o=/tmp/run26b; mkdir -p $o/bench /tmp/i8 /tmp/f16 /tmp/fin
export kit=.gpu; source bench/gpu_kit_env.sh
d=.r26/ab; g=.gpu/bundles/resnet18
cp $d/resnet18.int8.bs64.new.edb /tmp/i8/resnet18.bs64.old.edb; cp $g/resnet18.int8.bs64.edb /tmp/i8/resnet18.bs64.new.edb
cp $d/resnet18.fp16.bs64.new.edb /tmp/f16/resnet18.bs64.old.edb; cp $g/resnet18.fp16.bs64.edb /tmp/f16/resnet18.bs64.new.edb
cp $g/resnet18.int8.bs64.edb /tmp/fin/resnet18.bs64.int8.edb; cp $g/resnet18.fp16.bs64.edb /tmp/fin/resnet18.bs64.fp16.edb
python3 bench/tc_compare.py --bundles /tmp/i8 --variants old,new --no-peer --profile --top 40 --json $o/int8.json > $o/int8.txt 2>&1
python3 bench/tc_compare.py --bundles /tmp/f16 --variants old,new --no-peer --profile --top 40 --json $o/fp16.json > $o/fp16.txt 2>&1
python3 bench/tc_compare.py --bundles /tmp/fin --variants fp16,int8 --no-peer --profile --top 40 --json $o/final.json > $o/final.txt 2>&1
python3 bench/tc_compare.py --bundles /tmp/fin --variants int8,fp16 --no-peer > $o/final_reversed.txt 2>&1
python3 bench/int8_gpu_reference.py check .gpu/int8_reference.npz $g/resnet18.int8.bs64.edb > $o/reference.txt 2>&1
for f in int8 fp16 final final_reversed; do grep -E "ms .*img/s|x old|x fp16|x int8" $o/$f.txt; done
tail -2 $o/reference.txt
timeout 300 bash bench/gpu_bench.sh .gpu $o/bench resnet18 64 --modes reduce-overhead --deadline-s 240 > $o/bench/log.txt 2>&1
grep -v "UserWarning\|_warn_once\|^\s*$\|^\[" $o/bench/log.txt | tail -16
tar -C $o -czf $OUT/run26-call9.tar.gz .

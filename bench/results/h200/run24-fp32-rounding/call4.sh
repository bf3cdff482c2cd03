#!/usr/bin/env bash
# run24 call 4: the per-kernel profile (CUPTI) of this run's final ResNet-18 batch-64 bundles, FP16 beside INT8
# (stem "resnet18.bs64"), and of main's before this run (stem "resnet18main.bs64"), one process.
# carry [".gpu/wheels", ".gpu/lib", ".gpu/fin"]
set -u
export kit=.gpu; source bench/gpu_kit_env.sh
python3 bench/tc_compare.py --bundles .gpu/fin --variants fp16,int8 --no-peer --profile --top 40 --json $OUT/final.json > $OUT/final.txt 2>&1
grep -v "UserWarning\|_warn_once" $OUT/final.txt | head -12

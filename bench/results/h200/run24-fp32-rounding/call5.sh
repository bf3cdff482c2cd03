#!/usr/bin/env bash
# run24 call 5: e = this run's final INT8 ResNet-18 bundles, t = the same built after a 2.5-minute GEMM search that
# re-timed every configuration with this run's epilogue (tuning/), one process, both orders.
# carry [".gpu/wheels", ".gpu/lib", ".gpu/tq"]
set -u
export kit=.gpu; source bench/gpu_kit_env.sh
python3 bench/tc_compare.py --bundles .gpu/tq --variants e,t --no-peer --profile --top 40 --json $OUT/et.json > $OUT/et.txt 2>&1
python3 bench/tc_compare.py --bundles .gpu/tq --variants t,e --no-peer > $OUT/te.txt 2>&1
grep -v "UserWarning\|_warn_once" $OUT/et.txt | grep -v "^  .*bs1" | head -60; grep -v "^\s*$" $OUT/te.txt | grep -v "UserWarning\|_warn_once"

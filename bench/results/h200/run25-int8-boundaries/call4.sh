#!/usr/bin/env bash
# run25 call 4: MobileNetV1-0.25 INT8 a/b as call 3 (a: int8_boundaries=0, b: on), both orders, b against the exact
# INT8 reference; then the final ResNet-18 kit beside the peer (bench/gpu_bench.sh, as run24).
# carry [".gpu/wheels", ".gpu/lib", ".gpu/models", ".gpu/images", ".gpu/KIT.json", ".gpu/bundles/resnet18", ".mb"]
set -u
export kit=.gpu; source bench/gpu_kit_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
mkdir -p $OUT/mb $OUT/bench
python3 bench/tc_compare.py --bundles .mb --variants a,b --no-peer --profile --top 40 --json $OUT/mb/ab.json > $OUT/mb/ab.txt 2>&1
python3 bench/tc_compare.py --bundles .mb --variants b,a --no-peer > $OUT/mb/ba.txt 2>&1
python3 bench/int8_gpu_reference.py check .mb/mb_reference.npz .mb/mobilenet.bs64.b.edb .mb/mobilenet.bs1.b.edb > $OUT/mb/reference.txt 2>&1
for f in ab ba reference; do grep -v "UserWarning\|_warn_once\|^\s*$" $OUT/mb/$f.txt | grep -v "^  .*\.edb  " | head -12; done
bash bench/gpu_bench.sh .gpu $OUT/bench resnet18 1,64 --deadline-s 250 > $OUT/bench/log.txt 2>&1
tail -45 $OUT/bench/gpu_vs_torch.*.txt

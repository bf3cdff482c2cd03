#!/usr/bin/env bash
# run24 call 3: c = call 2's c (fp32_rounding + unroll_epilogue; FP16: main's bundle) against e = this run's final defaults (also
# byte_simd and injective_ilp=4), ResNet-18 INT8 and FP16 and MobileNet INT8 batch 64; the final bundles against the exact
# INT8 reference; then the final kit beside the peer (one process per model, as run23).
# carry [".gpu24/wheels", ".gpu24/lib", ".gpu24/models", ".gpu24/images", ".gpu24/KIT.json", ".gpu24/bundles",
#        ".gpu/rq3", ".gpu/int8_reference.npz"]   (MobileNet's reference: .gpu/rq3/mb_kit_reference.npz)
set -u
export kit=.gpu24; source bench/gpu_kit_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
mkdir -p $OUT/simd $OUT/bench $OUT/mb
t() { echo "== $*"; "$@"; }
t python3 bench/tc_compare.py --bundles .gpu/rq3 --variants c,e --no-peer --profile --top 40 --json $OUT/simd/ce.json > $OUT/simd/ce.txt 2>&1
t python3 bench/tc_compare.py --bundles .gpu/rq3 --variants e,c --no-peer --json $OUT/simd/ec.json > $OUT/simd/ec.txt 2>&1
t python3 bench/int8_gpu_reference.py check .gpu/int8_reference.npz .gpu24/bundles/resnet18/resnet18.int8.bs*.edb > $OUT/simd/ref.txt 2>&1
t python3 bench/int8_gpu_reference.py check .gpu/rq3/mb_kit_reference.npz .gpu24/bundles/mobilenet_v1_0.25_224/*.int8.bs*.edb >> $OUT/simd/ref.txt 2>&1
for f in $OUT/simd/*.txt; do echo "#### $f"; grep -v "^\s*$" $f | grep -v "UserWarning\|_warn_once" | grep -v "^  .*\.edb  " | head -30; done
t bash bench/gpu_bench.sh .gpu24 $OUT/bench resnet18 1,64 --deadline-s 250 > $OUT/bench/log.txt 2>&1
t bash bench/gpu_bench.sh .gpu24 $OUT/mb mobilenet_v1_0.25_224 1,64 --modes reduce-overhead --deadline-s 110 --rounds 3 > $OUT/mb/log.txt 2>&1
tail -45 $OUT/bench/gpu_vs_torch.*.txt; tail -30 $OUT/mb/gpu_vs_torch.*.txt

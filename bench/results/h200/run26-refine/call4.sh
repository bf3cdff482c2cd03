#!/usr/bin/env bash
# run26 call 4: the benchmark beside the peer with this run's bundles (INT8 and FP16 batch 64 rebuilt with the
# refined databases; batch 1 INT8 as before: its refinements were slower in the model, call 3) and the new
# INT8 bundles against the exact INT8 reference. Everything in one tarball (the tool returns 8 files at most).
# carry [".gpu/wheels", ".gpu/lib", ".gpu/models", ".gpu/images", ".gpu/KIT.json", ".gpu/bundles/resnet18",
#        ".gpu/int8_reference.npz"]
set -u
o=/tmp/run26; mkdir -p $o/bench
export kit=.gpu; source bench/gpu_kit_env.sh
python3 bench/int8_gpu_reference.py check .gpu/int8_reference.npz .gpu/bundles/resnet18/resnet18.int8.bs64.edb \
  .gpu/bundles/resnet18/resnet18.int8.bs1.edb > $o/reference.txt 2>&1
tail -6 $o/reference.txt
timeout 450 bash bench/gpu_bench.sh .gpu $o/bench resnet18 1,64 --modes reduce-overhead --deadline-s 380 > $o/bench/log.txt 2>&1
grep -v "UserWarning\|_warn_once\|^\s*$\|^\[" $o/bench/log.txt | tail -40
tar -C $o -czf $OUT/run26-call4.tar.gz .

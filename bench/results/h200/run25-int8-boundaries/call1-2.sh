#!/usr/bin/env bash
# run25 calls 1-2 (each twice, see README): the GEMM search (bench/gpu_tune.sh) of the bundles exported by
#   bash bench/gpu_tune_kit.sh .tunekit .ab/resnet18.bs64.b.edb .ab/resnet18.bs1.b.edb [.ab/resnet18.bs64.fp16.edb]
# call 1, carry [".tunekit/compiler.xz.part00"]:
cp .tunekit/compiler.xz.part00 /tmp/
# call 2, carry [".tunekit/compiler.xz.part01", ".tunekit/tvm-py.tar.xz", ".tunekit/tvm-ffi-cp312.tar.xz", ".tunekit/tasks.tar.xz"]:
bash bench/gpu_tune.sh .tunekit "$OUT" 0 0 2.5
# then here: edgedeploy tune --import DIR/<module> --database profiles/tuning/h200/<key> for each module of tuned.tar.xz

#!/usr/bin/env bash
# Kept for the record (bench/oneoff/README.md): the GPU half of bench/oneoff/tc_kit.sh; bench/gpu_variants.sh
# does this job now.
# On the GPU machine (H200, CUDA 13 driver, Python 3.12, PyTorch), from the repo root:
#   bash bench/oneoff/gpu_tc.sh KIT.tar.xz OUT        (KIT.tar.xz from bench/oneoff/tc_kit.sh on the build host)
# Times the ResNet-18 bundles with and without tensor-core convolutions, checks that their outputs
# agree (INT8 bit-identical), profiles kernels; writes tc_compare.{txt,json} and sass.txt to OUT.
set -euo pipefail
tarball=$(realpath "$1"); out=$(realpath "$2")
work=/tmp/tc-kit; rm -rf "$work"; mkdir -p "$work"; tar -C "$work" -xJf "$tarball"
kit=$(echo "$work"/*)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/tc-site "$kit"/wheels/*.whl
export PYTHONPATH=/tmp/tc-site:$PWD/agent:$PWD/bench
export TVM_RUNTIME_LIB=$kit/lib/libtvm_runtime.so   # libcudart.so.13 beside the CUDA backend (RUNPATH $ORIGIN)
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$out/gpu.txt"
cp "$kit/sass.txt" "$out/" 2>/dev/null || true
python3 bench/tc_compare.py --bundles "$kit/bundles" --profile --json "$out/tc_compare.json" | tee "$out/tc_compare.txt"

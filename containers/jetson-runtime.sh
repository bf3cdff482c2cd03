#!/usr/bin/env bash
# Builds the TVM runtime (no compiler, no LLVM) from source on a Jetson with JetPack 5 (L4T r35,
# aarch64, CUDA 11.4), for the agent's Python 3.9 venv.  NOT VERIFIED on hardware: see docs/gpu.md.
#   bash containers/jetson-runtime.sh OUT_DIR [TVM_SOURCE_DIR]
# The TVM source (apache/tvm at the tag matching the host's apache-tvm 0.27) must be present: devices
# usually have no route to the internet either, so copy it over with the bundle tooling.
set -euo pipefail
out=${1:?usage: $0 OUT_DIR [TVM_SOURCE_DIR]}
src=${2:-$HOME/tvm}
nvcc=/usr/local/cuda/bin/nvcc
[ -x "$nvcc" ] || { echo "JetPack CUDA not found at /usr/local/cuda" >&2; exit 1; }
"$nvcc" --version | grep -q "release 11.4" || echo "warning: expected CUDA 11.4 (JetPack 5)" >&2
# TVM 0.27's CUDA runtime calls cuLaunchKernelEx and cuTensorMapEncodeTiled (driver API 12.0+).
# On JetPack 5 either install NVIDIA's cuda-compat 12.x (check that your L4T release supports it)
# or build with a patch that uses cuLaunchKernel when no launch attributes are set and guards the
# TMA code with CUDA_VERSION >= 12000. Bundles declare min_cuda_driver = 12.0 for this reason.
mkdir -p "$src/build" && cd "$src/build"
cat > config.cmake <<CFG
set(USE_CUDA ON)
set(USE_LLVM OFF)
set(USE_CUTLASS OFF)
set(USE_CUBLAS OFF)
set(USE_CUDNN OFF)
set(USE_THRUST OFF)
set(USE_TENSORRT_RUNTIME OFF)
set(CMAKE_CUDA_ARCHITECTURES 72)
CFG
cmake .. -G Ninja -DCMAKE_BUILD_TYPE=Release
ninja tvm_runtime
mkdir -p "$out"
cp lib/libtvm_runtime*.so "$out/"
echo "runtime in $out; point the agent at it: edgedeploy-agent init --tvm-runtime-lib $out/libtvm_runtime.so"

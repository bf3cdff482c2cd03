#!/usr/bin/env bash
# Usage: tvm-runtime-kit.sh OUT_DIR
# Puts libtvm_runtime.so and libtvm_runtime_cuda.so from the pinned apache-tvm wheel (x86_64,
# manylinux_2_28) into OUT_DIR. The CUDA backend needs libcudart.so.13 beside it (RUNPATH $ORIGIN)
# and a CUDA 13 driver (R580+); CPU devices never load it.
# The library does not depend on the Python version; libtvm_ffi.so comes with the agent's own
# apache-tvm-ffi package (which supports Python 3.9). aarch64 (Jetson) needs a source build instead.
set -euo pipefail
out=${1:?usage: $0 OUT_DIR}
ver=0.27.0.post1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.10 \
  --platform manylinux_2_28_x86_64 -d "$tmp" "apache-tvm==$ver"
mkdir -p "$out"
python3 - "$tmp" "$out" <<'PY'
import sys, zipfile, pathlib
tmp, out = map(pathlib.Path, sys.argv[1:])
wheel = next(tmp.glob("apache_tvm-*.whl"))
with zipfile.ZipFile(wheel) as z:
    for lib in ("libtvm_runtime.so", "libtvm_runtime_cuda.so"):
        (out / lib).write_bytes(z.read(f"tvm/lib/{lib}"))
        print(f"{out / lib} from {wheel.name}")
PY
chmod 755 "$out"/libtvm_runtime*.so

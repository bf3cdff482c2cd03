"""The INT8 1x1 convolution kernels alone (compile/int8/x86_int8.py) against a float32 matrix product of the same
size, in one run: MobileNetV1-0.25's pointwise layer shapes, batch 1.

    python bench/int8_pointwise.py [--runs 200] [--threads N]

The peer is numpy's float32 matmul (the BLAS numpy ships, OpenBLAS for the PyPI wheel): W[o, c] @ X[c, h*w], the
same multiply-adds as the 1x1 convolution. The kernels include their requantize epilogue; the peer does not.
The VNNI kernel is measured only on CPUs with avx512_vnni. TVM's thread count: TVM_NUM_THREADS (default: all
cores); on the 2-vCPU development machine one thread was faster than two (docs/int8.md).

Prints a row per layer shape: the float32 matmul's time and each INT8 kernel's as a ratio to it (x fp32).
"""

from __future__ import annotations

import argparse
import timeit

import numpy as np
import tvm

from edgedeploy.compile.int8.x86_int8 import AVX2, VNNI, pack_activations_numpy, pack_weights, pointwise_kernel
from edgedeploy_agent.bundle import cpu_flags

# (in channels, out channels, height = width) of MobileNetV1-0.25's 13 pointwise layers, distinct shapes
SHAPES = [(8, 16, 112), (16, 32, 56), (32, 32, 56), (32, 64, 28), (64, 64, 28), (64, 128, 14), (128, 128, 14),
          (128, 256, 7), (256, 256, 7)]  # fmt: skip
TARGETS = {
    AVX2: {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "x86-64-v3"},
    VNNI: {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "x86-64-v4", "mattr": ["+avx512vnni"]},
}


def best_us(fn: object, runs: int) -> float:
    return min(timeit.repeat(fn, number=runs, repeat=5)) / runs * 1e6  # type: ignore[arg-type]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    args = ap.parse_args()
    kinds = [k for k in (AVX2, VNNI) if k.cpu_flag in (cpu_flags() or ())]
    rng, dev = np.random.default_rng(0), tvm.cpu()
    print("shape (c->o @ hw)      fp32 matmul  " + "  ".join(f"{k.name:>12s} (x fp32)" for k in kinds))
    for c, o, hw in SHAPES:
        x = rng.integers(0, 256, (1, c, hw, hw)).astype(np.uint8)
        w = rng.integers(-128, 128, (o, c, 1, 1)).astype(np.int8)
        xf, wf = x.reshape(c, -1).astype(np.float32), w.reshape(o, c).astype(np.float32)
        fp32 = best_us(lambda wf=wf, xf=xf: np.matmul(wf, xf), args.runs)
        row = f"{c:4d}->{o:<4d} @ {hw:3d}x{hw:<3d}   {fp32:8.1f} us "
        for kind in kinds:
            kernel = pointwise_kernel(kind, 1, c, o, hw, hw, 0, "uint8").with_attr("global_symbol", "main")
            lib = tvm.compile(tvm.IRModule({"main": kernel}), target=tvm.target.Target(TARGETS[kind]))
            bias, mult = np.zeros(o, np.int32), np.full(o, 1e-3, np.float32)
            host = [
                pack_activations_numpy(x, kind),
                pack_weights(w, kind),
                bias,
                mult,
                np.zeros((1, o, hw * hw), np.uint8),
            ]
            arrays = [tvm.runtime.tensor(a, dev) for a in host]
            t = best_us(lambda arrays=arrays, lib=lib: lib["main"](*arrays), args.runs)
            row += f"  {t:8.1f} us ({fp32 / t:4.2f}x)"
        print(row)


if __name__ == "__main__":
    main()

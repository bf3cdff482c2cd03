"""Kept for the record (bench/oneoff/README.md): the prototype of issue 12 that showed the tensor-core rule
reaching HMMA/IMMA; bench/conv_variants.py does this job now and is maintained.

Prototype (build host, no GPU): do FP16/INT8 convolutions reach the tensor cores? Builds single
ResNet-18 convolutions for a CUDA arch with TVM's default pipeline and with edgedeploy's tensor-core
pipeline (`compile/cuda/tensorcore.py`), in NCHW or NHWC, and counts HMMA / IMMA / IDP.4A in the SASS.

    PYTHONPATH=bench .venv/bin/python bench/oneoff/conv_tensorcore.py --arch sm_75 --precision int8 \
        --layout nhwc --rule tc [--out DIR]

INT8 cases have the int8 rewrite's shape: int8 pad with the zero point, conv2d(int8, int8) -> int32,
then the requantize (+ int32 constant, * float32 multiplier, round, + zero point, clip, -> int8).
Runs itself again in the CUDA toolchain's environment (stub libcuda, nvcc), as edgedeploy's worker does.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from conv_variants import CASES  # the distinct ResNet-18 convolutions, one table for both scripts


def conv_module(case: str, precision: str, layout: str, batch: int) -> Any:
    from tvm import relax

    c, h, k, r, s, p = CASES[case]
    nhwc = layout == "nhwc"
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    xdtype = "int8" if precision == "int8" else "float16"
    x = relax.Var("x", relax.TensorType((batch, h, h, c) if nhwc else (batch, c, h, h), xdtype))
    wshape = (k, r, r, c) if nhwc else (k, c, r, r)
    lay = {"data_layout": "NHWC", "kernel_layout": "OHWI"} if nhwc else {}
    bshape = [1, 1, 1, k] if nhwc else [1, k, 1, 1]
    with bb.function("main", [x]):
        with bb.dataflow():
            if precision == "int8":
                w = rng.integers(-127, 128, size=wshape).astype("int8")
                width = [0, 0, p, p, p, p, 0, 0] if nhwc else [0, 0, 0, 0, p, p, p, p]
                xp = bb.emit(relax.op.nn.pad(x, width, pad_value=-3.0)) if p else x
                acc = bb.emit(relax.op.nn.conv2d(xp, relax.const(w), strides=[s, s], out_dtype="int32", **lay))
                acc = bb.emit(relax.op.add(acc, relax.const(rng.integers(-999, 999, bshape).astype("int32"))))
                mult = rng.uniform(1e-4, 1e-3, bshape).astype("float32")
                f = bb.emit(relax.op.round(relax.op.multiply(relax.op.astype(acc, "float32"), relax.const(mult))))
                f = bb.emit(relax.op.add(f, relax.const(5.0, "float32")))
                y = bb.emit(relax.op.astype(relax.op.clip(f, -128, 127), "int8"))
            else:
                w = (rng.standard_normal(wshape) * 0.05).astype("float16")
                y = bb.emit(relax.op.nn.conv2d(x, relax.const(w), strides=[s, s], padding=[p] * 4, **lay))
                y = bb.emit(relax.op.add(y, relax.const(rng.standard_normal(bshape).astype("float16"))))
                y = bb.emit(relax.op.nn.relu(y))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def build_one(args: argparse.Namespace) -> dict[str, Any]:
    import tvm
    from tc_sass import sass_counts

    from edgedeploy.compile.cuda.tensorcore import TIR_PIPELINE, cuda_pipeline, pass_config

    mod = conv_module(args.case, args.precision, args.layout, args.batch)
    target = tvm.target.Target({"kind": "cuda", "arch": args.arch, "host": {"kind": "llvm"}})
    t = time.perf_counter()
    with target, tvm.transform.PassContext(opt_level=3, config=pass_config(target)):
        ex = tvm.compile(
            mod,
            target=target,
            relax_pipeline=cuda_pipeline(target, tensor_cores=args.rule == "tc"),
            tir_pipeline=TIR_PIPELINE,
        )
    seconds = time.perf_counter() - t
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"{args.case}.{args.precision}.{args.layout}.{args.rule}.{args.arch}.bs{args.batch}"
    lib = out / f"{name}.so"
    ex.export_library(str(lib))
    return {"name": name, "compile_s": round(seconds, 1), **sass_counts(lib)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="sm_75")
    ap.add_argument("--precision", choices=["fp16", "int8"], default="fp16")
    ap.add_argument("--layout", choices=["nchw", "nhwc"], default="nhwc")
    ap.add_argument("--rule", choices=["default", "tc"], default="tc")
    ap.add_argument("--case", default="all", help=f"one of {', '.join(CASES)} or all")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--out", default="/tmp/conv_tensorcore")
    ap.add_argument("--in-toolchain", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not args.in_toolchain:
        from edgedeploy.compile.cuda.toolchain import resolve_toolchain
        from edgedeploy.profiles import get_profile

        profile = {"sm_75": "t4", "sm_90": "h200", "sm_72": "xavier-agx"}[args.arch]
        env = {**os.environ, **resolve_toolchain(get_profile(profile)).env}
        sys.exit(subprocess.call([sys.executable, *sys.argv, "--in-toolchain"], env=env))
    cases = list(CASES) if args.case == "all" else [args.case]
    for case in cases:
        args.case = case
        try:
            print(json.dumps(build_one(args)), flush=True)
        except Exception as e:  # report and go on with the next case
            lines = [ln for ln in str(e).splitlines() if ln.strip()]
            print(json.dumps({"case": case, "error": lines[-1] if lines else type(e).__name__}), flush=True)


if __name__ == "__main__":
    main()

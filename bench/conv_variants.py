"""Schedule variants of single ResNet-18 convolutions, built here and timed on the GPU machine.

A whole-model bundle takes 5-10 minutes to build on the 2-core build host; one module holding every
distinct ResNet-18 convolution (INT8 as the int8 rewrite emits it: zero-point pad, conv2d int8 x int8 ->
int32, requantize; or FP16 conv + bias + ReLU) builds in about a minute per schedule variant
(`compile/cuda/tiles.py`'s `Knobs`), so variants are compared layer by layer before a model is rebuilt.

    # here (no GPU): one library per variant, KIT/<precision>.bs<N>.<variant>.so, plus KIT/variants.json
    .venv/bin/python bench/conv_variants.py build KIT --precision int8 --batch 64 \
        --variant base: --variant v16:load_bytes=16 --variant k64v16:int8_k=64,load_bytes=16
    # on the GPU machine, from the repo root (python3 with torch for the CUPTI profile; KIT carries
    # libtvm_runtime*.so, libcudart.so.13 and the apache-tvm-ffi wheel as bench/gpu_kit.sh makes them):
    python3 bench/conv_variants.py run KIT [--json OUT/results.json]

`run` times each case of each variant (median wall clock of 50 calls with the output copied back, and
the GPU time of its kernels by CUPTI), checks that every INT8 variant's output is bit-identical to the
first variant's (exact int32 sums, same requantize; FP16 within 1e-2 relative), and prints a table of
ms per case with the speed-up over the first variant. Every kernel's time goes to --json, by default
`results.json` in a new folder outside the source tree (bench/results_dir.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from results_dir import output_file

# name: (C, H, K, kernel, stride, pad): the distinct convolutions of ResNet-18 (stem_c4: the stem with its
# RGB input padded to 4 channels, zero weights for the fourth)
CASES = {
    "stem": (3, 224, 64, 7, 2, 3),
    "stem_c4": (4, 224, 64, 7, 2, 3),
    "l1_3x3": (64, 56, 64, 3, 1, 1),
    "l2_3x3s2": (64, 56, 128, 3, 2, 1),
    "l2_3x3": (128, 28, 128, 3, 1, 1),
    "l2_1x1s2": (64, 56, 128, 1, 2, 0),
    "l3_3x3": (256, 14, 256, 3, 1, 1),
    "l4_3x3": (512, 7, 512, 3, 1, 1),
}


def conv(bb: Any, name: str, case: str, precision: str, batch: int) -> None:
    from tvm import relax

    c, h, k, r, s, p = CASES[case]
    rng = np.random.default_rng(0)
    xdtype = "int8" if precision == "int8" else "float16"
    x = relax.Var("x", relax.TensorType((batch, h, h, c), xdtype))
    lay = {"data_layout": "NHWC", "kernel_layout": "OHWI"}
    with bb.function(name, [x]):
        with bb.dataflow():
            if precision == "int8":
                w = rng.integers(-127, 128, size=(k, r, r, c)).astype("int8")
                xp = bb.emit(relax.op.nn.pad(x, [0, 0, p, p, p, p, 0, 0], pad_value=-3.0)) if p else x
                acc = bb.emit(relax.op.nn.conv2d(xp, relax.const(w), strides=[s, s], out_dtype="int32", **lay))
                acc = bb.emit(relax.op.add(acc, relax.const(rng.integers(-999, 999, (1, 1, 1, k)).astype("int32"))))
                mult = rng.uniform(1e-4, 1e-3, (1, 1, 1, k)).astype("float32")
                f = bb.emit(relax.op.round(relax.op.multiply(relax.op.astype(acc, "float32"), relax.const(mult))))
                f = bb.emit(relax.op.add(f, relax.const(5.0, "float32")))
                y = bb.emit(relax.op.astype(relax.op.clip(f, -128, 127), "int8"))
            else:
                w = (rng.standard_normal((k, r, r, c)) * 0.05).astype("float16")
                y = bb.emit(relax.op.nn.conv2d(x, relax.const(w), strides=[s, s], padding=[p] * 4, **lay))
                y = bb.emit(relax.op.add(y, relax.const(rng.standard_normal((1, 1, 1, k)).astype("float16"))))
                y = bb.emit(relax.op.nn.relu(y))
            out = bb.emit_output(y)
        bb.emit_func_output(out)


def parse_variant(text: str) -> tuple[str, dict[str, int]]:
    name, _, spec = text.partition(":")
    knobs = {}
    for item in filter(None, spec.split(",")):
        key, _, value = item.partition("=")
        knobs[key] = int(value)
    return name, knobs


def build(args: argparse.Namespace) -> None:
    import tvm
    from tc_sass import sass_counts

    from edgedeploy.compile.config import Knobs
    from edgedeploy.compile.cuda.tensorcore import TIR_PIPELINE, TensorCoreGemm, cuda_pipeline, pass_config

    kit = Path(args.kit)
    kit.mkdir(parents=True, exist_ok=True)
    (kit / ".gitignore").write_text("*\n")  # the kit ignores itself: it travels with the device tool's carry
    index_path = kit / "variants.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else []
    target = tvm.target.Target({"kind": "cuda", "arch": args.arch, "host": {"kind": "llvm"}})
    cases = args.cases.split(",") if args.cases else list(CASES)
    for text in args.variant:
        name, knobs = parse_variant(text)
        tag = f"{args.precision}.bs{args.batch}.{name}"
        bb = tvm.relax.BlockBuilder()
        for case in cases:
            conv(bb, case, case, args.precision, args.batch)
        t = time.perf_counter()
        row: dict[str, Any] = {"lib": f"{tag}.so", "variant": name, "knobs": knobs, "precision": args.precision}
        row |= {"batch": args.batch, "cases": cases}
        try:
            with target, tvm.transform.PassContext(opt_level=3, config=pass_config(target)):
                pipeline = cuda_pipeline(target, rule=TensorCoreGemm(Knobs(**knobs)))
                ex = tvm.compile(bb.get(), target=target, relax_pipeline=pipeline, tir_pipeline=TIR_PIPELINE)
            ex.export_library(str(kit / row["lib"]))
            row |= {"compile_s": round(time.perf_counter() - t, 1), **sass_counts(kit / row["lib"])}
        except Exception as e:  # a variant TVM cannot compile: say why, go on with the next
            lines = [ln for ln in str(e).splitlines() if ln.strip()]
            row["error"] = lines[-1] if lines else type(e).__name__
        print(json.dumps(row), flush=True)
        index = [r for r in index if r["lib"] != row["lib"]] + [row]
        index_path.write_text(json.dumps(index, indent=1))


def run(args: argparse.Namespace) -> None:
    import ctypes

    import tvm_ffi

    kit = Path(args.kit)
    lib = Path(os.environ.get("TVM_RUNTIME_LIB", kit / "lib" / "libtvm_runtime.so"))
    ctypes.CDLL(str(lib), ctypes.RTLD_GLOBAL)
    ctypes.CDLL(str(lib.with_name("libtvm_runtime_cuda.so")), ctypes.RTLD_GLOBAL)
    alloc = tvm_ffi.get_global_func("runtime.TVMTensorAllocWithScope")
    copy = tvm_ffi.get_global_func("runtime.TVMTensorCopyFromTo")
    gpu, cpu = tvm_ffi.device("cuda", 0), tvm_ffi.device("cpu", 0)
    try:
        from tc_compare import kernel_profile
    except ImportError:  # no torch: wall clock only
        kernel_profile = None  # type: ignore[assignment]

    def to_host(t: Any) -> np.ndarray:
        host = alloc(t.shape, t.dtype, cpu, None)
        copy(t, host)
        return np.from_dlpack(host).copy()

    rows = [r for r in json.loads((kit / "variants.json").read_text()) if "error" not in r]
    results: dict[tuple[str, str], dict[str, Any]] = {}
    reference: dict[tuple[str, int, str], np.ndarray] = {}
    for r in rows:
        module = tvm_ffi.load_module(str((kit / r["lib"]).resolve()))
        vm = module["vm_load_executable"]()
        vm["vm_initialization"](2, 0, 2, 1, 0, 2)
        for case in r["cases"]:
            c, h, *_ = CASES[case]
            rng = np.random.default_rng(1)
            shape = (r["batch"], h, h, c)
            if r["precision"] == "int8":
                x = rng.integers(-128, 128, size=shape).astype(np.int8)
            else:
                x = rng.standard_normal(shape).astype(np.float16)
            xd = alloc(x.shape, str(x.dtype), gpu, None)
            copy(tvm_ffi.from_dlpack(x), xd)
            fn = vm[case]
            out = to_host(fn(xd))
            key = (r["precision"], r["batch"], case)
            ref = reference.setdefault(key, out)
            if r["precision"] == "int8":
                ok = bool(np.array_equal(ref, out))
            else:
                ok = bool(np.abs(ref.astype(np.float32) - out).max() <= 1e-2 * max(float(np.abs(ref).max()), 1e-6))

            def call(fn: Any = fn, xd: Any = xd) -> Any:
                return to_host(fn(xd))

            for _ in range(10):
                call()
            samples = []
            for _ in range(args.n):
                t = time.perf_counter()
                call()
                samples.append((time.perf_counter() - t) * 1e3)
            kernels = [
                k for k in (kernel_profile(call) if kernel_profile else []) if "memcpy" not in k["kernel"].lower()
            ]
            gpu_ms = sum(k["ms_per_run"] for k in kernels)
            results[(r["lib"], case)] = {
                "lib": r["lib"],
                "case": case,
                "wall_ms": round(statistics.median(samples), 4),
                "gpu_ms": round(gpu_ms, 4),
                "same_as_first": ok,
                "kernels": kernels[:4],
            }
            print(json.dumps(results[(r["lib"], case)]), flush=True)
    args.json.write_text(json.dumps(list(results.values()), indent=1))
    print(f"kernel times: {args.json}")
    libs = [r["lib"] for r in rows]
    cases = list(dict.fromkeys(c for r in rows for c in r["cases"]))
    print("\nGPU ms per case (CUPTI kernel time; speed-up over the first variant of the same precision/batch)")
    print(f"{'case':12s}" + "".join(f"{lib[:-3]:>26s}" for lib in libs))
    for case in cases:
        line = f"{case:12s}"
        for lib in libs:
            res = results.get((lib, case))
            if res is None:
                line += f"{'-':>26s}"
                continue
            first = next(
                results[(x, case)] for x in libs if (x, case) in results and x.split(".")[:2] == lib.split(".")[:2]
            )
            ratio = first["gpu_ms"] / res["gpu_ms"] if res["gpu_ms"] else float("nan")
            mark = "" if res["same_as_first"] else " DIFF"
            line += f"{res['gpu_ms']:>13.4f} ({ratio:4.2f}x){mark:5s}"
        print(line)


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("kit")
    b.add_argument("--precision", choices=["int8", "fp16"], default="int8")
    b.add_argument("--batch", type=int, default=64)
    b.add_argument("--arch", default="sm_90")
    b.add_argument("--cases", default="", help=f"comma-separated, of {', '.join(CASES)} (default all)")
    b.add_argument("--variant", action="append", default=[], help="NAME:knob=value,... (Knobs fields)")
    b.add_argument("--in-toolchain", action="store_true", help=argparse.SUPPRESS)
    r = sub.add_parser("run")
    r.add_argument("kit")
    r.add_argument("--n", type=int, default=50)
    r.add_argument("--json")
    args = ap.parse_args()
    if args.cmd == "run":
        args.json = output_file(args.json, "conv_variants", "results.json")
        run(args)
        return
    if not args.in_toolchain:
        from edgedeploy.compile.cuda.toolchain import resolve_toolchain
        from edgedeploy.profiles import get_profile

        profile = {"sm_75": "t4", "sm_90": "h200", "sm_72": "xavier-agx"}[args.arch]
        env = {**os.environ, **resolve_toolchain(get_profile(profile)).env}
        sys.exit(subprocess.call([sys.executable, *sys.argv, "--in-toolchain"], env=env))
    build(args)


if __name__ == "__main__":
    main()

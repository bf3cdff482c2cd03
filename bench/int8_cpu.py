"""CPU latency, in one run and on the same inputs: TVM FP32 and INT8 bundles against onnxruntime FP32 and INT8.

    python bench/int8_cpu.py [--model mobilenet|mnist] [--runs 50] [--data ../shared/data]

The bundles are built (or taken from the build cache) exactly like `edgedeploy build`, so a stored tuning
database under profiles/tuning/cpu-x86_64/ is applied when there is one; the TVM libraries run through the
agent's runtime, as on a device. onnxruntime runs the bundle's own FP32 source and QDQ model (from the host's
build store, where the build put them): it is the peer a user would pick, measured for speed only. Its INT8
outputs are not a reference (its integer kernels depend on the CPU; compile/int8/qdq_reference.py is the exact
INT8 reference).

Prints each case's median ms and the ratios: TVM INT8 over TVM FP32, onnxruntime INT8 over its FP32, and
TVM / onnxruntime latency at each precision.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edgedeploy.api import build
from edgedeploy.build_store import host_file
from edgedeploy.compile.int8.build import Int8Config
from edgedeploy.compile.int8.datasets import load_calibration
from edgedeploy.compile.int8.quantize import QuantizeOptions
from edgedeploy.compile.package import load_card
from edgedeploy.profiles import get_profile
from edgedeploy_agent.bundle import extract_bundle
from edgedeploy_agent.runtime.tvm import TvmRuntime

REPO = Path(__file__).resolve().parents[1]
MODELS = {
    "mobilenet": ("mobilenet_v1_0.25_224.onnx", "imagenet-sample", "mobilenet_v1_0.25_224.toml"),
    "mnist": ("mnist-8_opset13.onnx", "mnist", "mnist-8.toml"),
}


def median_ms(fn: Callable[[np.ndarray], object], inputs: np.ndarray, runs: int) -> float:
    for x in inputs[:3]:
        fn(x[None])
    times = []
    for i in range(runs):
        x = inputs[i % len(inputs)][None]
        t = time.perf_counter()
        fn(x)
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="mobilenet")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    ort.set_default_logger_severity(3)
    file, data, card_file = MODELS[args.model]
    model, card = args.data / "models" / file, load_card(REPO / "examples" / "cards" / card_file)
    cfg = Int8Config(calibration=args.data / data, eval_data=args.data / data, options=QuantizeOptions())
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        t = time.perf_counter()
        fp32 = build(model, "cpu-x86_64", work / "fp32.edb", card)
        int8 = build(model, "cpu-x86_64", work / "int8.edb", card, int8=cfg)
        print(f"bundles ready in {time.perf_counter() - t:.1f} s (cached: fp32 {fp32.cached}, int8 {int8.cached})")
        rel_f, rel_i = work / "rf", work / "ri"
        mf, mi = extract_bundle(fp32.bundle, rel_f), extract_bundle(int8.bundle, rel_i)
        tvm_f, tvm_i = TvmRuntime(rel_f, mf), TvmRuntime(rel_i, mi)
        so = ort.SessionOptions()
        so.log_severity_level = 3
        ort_f = ort.InferenceSession(str(host_file(mf, "onnx-model", rel_f)), so)
        ort_i = ort.InferenceSession(str(host_file(mi, "qdq-onnx", rel_i)), so)
        name = mf.inputs[0].name
        inputs = load_calibration(args.data / data, card.preprocess, mf.inputs[0], 16, "evaluation")
        rows = {
            "TVM FP32 bundle": median_ms(lambda x: tvm_f.run([x]), inputs, args.runs),
            "TVM INT8 bundle": median_ms(lambda x: tvm_i.run([x]), inputs, args.runs),
            "onnxruntime FP32": median_ms(lambda x: ort_f.run(None, {name: x}), inputs, args.runs),
            "onnxruntime INT8 (QDQ)": median_ms(lambda x: ort_i.run(None, {name: x}), inputs, args.runs),
        }
    target = get_profile("cpu-x86_64").compiler.target
    print(f"{file}, batch 1, median of {args.runs} runs; cpu-x86_64 target {dict(target)}")
    for label, m in (("FP32", mf), ("INT8", mi)):
        db, _, names = m.provenance.options.get("tuning", "").partition(": ")
        used = f"{len(names.split(', '))} kernels from {db}" if names else "none (default schedules)"
        print(f"  {label} bundle, kernels from a tuning database: {used}")
    for k, v in rows.items():
        print(f"  {k:24s} {v:9.3f} ms")
    r = rows
    print(f"  TVM INT8 speed-up over TVM FP32:          {r['TVM FP32 bundle'] / r['TVM INT8 bundle']:6.2f}x")
    print(f"  onnxruntime INT8 speed-up over its FP32:  {r['onnxruntime FP32'] / r['onnxruntime INT8 (QDQ)']:6.2f}x")
    print(f"  TVM FP32 / onnxruntime FP32 latency:      {r['TVM FP32 bundle'] / r['onnxruntime FP32']:6.2f}x")
    print(f"  TVM INT8 / onnxruntime INT8 latency:      {r['TVM INT8 bundle'] / r['onnxruntime INT8 (QDQ)']:6.2f}x")


if __name__ == "__main__":
    main()

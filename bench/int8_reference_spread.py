"""How far apart FP32, the exact INT8 reference and other INT8 runs of one Q/DQ model are, on real images.

    python bench/int8_reference_spread.py [--data ../shared/data] [--samples 128] [--chunk 8]

The numbers behind two thresholds: the build-time gate of a TensorRT bundle (its reference outputs must
agree with the FP32 model's top-1 on enough reference samples) and the device's acceptance of an engine
(its outputs against the reference: `min_top1_agreement`, `atol`). MobileNetV1-0.25 is quantized with the
asymmetric default recipe and the symmetric TensorRT recipe, calibrated on the `calibration` half of
imagenet-sample; every image of both halves is then run through:
  * FP32: onnxruntime on the source model;
  * exact: the exact INT8 reference (compile/int8/qdq_reference.py), what the bundle ships;
  * fake-quant f32: onnxruntime with graph optimizations off (Q/DQ as float32 ops). It stands in for an
    INT8 engine that rounds differently from the reference (float32 sums, other summation order);
  * onnxruntime INT8: its default, optimized CPU run (QLinearConv). A peer, not a reference: its kernels
    depend on this CPU (int16 saturation on AVX2-only CPUs).
For each pair: top-1 agreement over all images, the worst agreement over consecutive chunks of `--chunk`
images (what a reference set of that size can see), and the largest |difference| of the softmax outputs.

Prints per recipe, half and pair of runs the top-1 agreement, the worst chunk's and the max |difference|.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from edgedeploy.compile.int8.datasets import load_calibration, load_labeled
from edgedeploy.compile.int8.qdq_reference import reference_outputs
from edgedeploy.compile.int8.quantize import QuantizeOptions, quantize_qdq
from edgedeploy.compile.package import load_card

REPO = Path(__file__).resolve().parents[1]


def ort_run(model: onnx.ModelProto, x: np.ndarray, optimized: bool) -> np.ndarray:
    so = ort.SessionOptions()
    if not optimized:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    return np.concatenate([sess.run(None, {name: x[i : i + 16]})[0] for i in range(0, len(x), 16)])


def compare(a: np.ndarray, b: np.ndarray, chunk: int) -> str:
    same = a.argmax(axis=1) == b.argmax(axis=1)
    worst = min(same[i : i + chunk].mean() for i in range(0, len(same) - chunk + 1, chunk))
    return f"{same.mean() * 100:6.2f} % {worst * 100:6.1f} % {np.abs(a - b).max():9.5f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--data", type=Path, default=Path(os.environ.get("EDGEDEPLOY_DATA", REPO.parent / "shared" / "data"))
    )
    ap.add_argument("--samples", type=int, default=128)
    ap.add_argument("--chunk", type=int, default=8)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    ort.set_default_logger_severity(3)
    model_path = args.data / "models" / "mobilenet_v1_0.25_224.onnx"
    model = onnx.load(model_path)
    card = load_card(REPO / "examples" / "cards" / "mobilenet_v1_0.25_224.toml")
    from edgedeploy.compile.frontends.onnx_model import load_onnx

    spec = load_onnx(model_path).inputs[0]
    images = args.data / "imagenet-sample"
    calib = load_calibration(images, card.preprocess, spec, args.samples, "calibration")
    halves = {h: load_labeled(images, card.preprocess, spec, h).inputs for h in ("calibration", "evaluation")}
    print(f"MobileNetV1-0.25, {args.samples} calibration samples; chunks of {args.chunk} images")
    print(f"{'recipe':11s} {'half':11s} {'pair':34s} {'top-1 agree':>11s} {'worst chunk':>10s} {'max |d|':>9s}")
    for recipe, symmetric in (("asymmetric", False), ("symmetric", True)):
        qdq = quantize_qdq(model, calib, QuantizeOptions(samples=args.samples, symmetric_activations=symmetric)).model
        for half, x in halves.items():
            runs = {
                "FP32": ort_run(model, x, optimized=True),
                "exact": reference_outputs(qdq, x)[0].reshape(len(x), -1),
                "fake-quant f32": ort_run(qdq, x, optimized=False),
                "onnxruntime INT8 (peer)": ort_run(qdq, x, optimized=True),
            }
            for other in ("FP32", "fake-quant f32", "onnxruntime INT8 (peer)"):
                pair = f"exact vs {other}"
                print(f"{recipe:11s} {half:11s} {pair:34s} {compare(runs['exact'], runs[other], args.chunk)}")


if __name__ == "__main__":
    main()

"""INT8 accuracy on both halves of the data: onnxruntime's default static QDQ against edgedeploy's recipes.

    python bench/int8_accuracy.py [--data ../shared/data] [--samples 128] [--model mobilenet|mnist|all]

MobileNetV1-0.25: calibration on the `calibration` half of imagenet-sample; every recipe is scored on that
half (seen in calibration) and on the `evaluation` half (held out), split by sha1 of the file name
(edgedeploy.compile.int8.datasets.split_of). mnist-8: the same split of the MNIST test set by sample index. FP32 is
onnxruntime; every INT8 number is the exact INT8 reference of the Q/DQ model (compile/int8/qdq_reference.py),
so the table is the same on every CPU (onnxruntime's own INT8 kernels are not: they saturate on AVX2-only
CPUs). Columns: top-1 in percent, drop against FP32 on the same half, top-1 agreement with FP32.

Prints per variant top-1, its drop against FP32 (onnxruntime) and top-1 agreement with FP32, on each half.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from edgedeploy.compile.int8.datasets import load_calibration, load_labeled
from edgedeploy.compile.int8.evaluate import OrtClassifier, agreement, score
from edgedeploy.compile.int8.qdq_reference import QdqReference
from edgedeploy.compile.int8.quantize import QuantizeOptions, quantize_qdq
from edgedeploy.compile.package import load_card

REPO = Path(__file__).resolve().parents[1]


def ort_default(model: Path, calib: np.ndarray, symmetric: bool) -> onnx.ModelProto:
    """onnxruntime.quantization.quantize_static as documented: QDQ, per-channel weights, MinMax."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self.it = iter(calib[i : i + 1] for i in range(len(calib)))

        def get_next(self) -> dict[str, np.ndarray] | None:
            x = next(self.it, None)
            return None if x is None else {onnx.load(model).graph.input[0].name: x}

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "q.onnx"
        quantize_static(
            str(model), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
            activation_type=QuantType.QInt8 if symmetric else QuantType.QUInt8, weight_type=QuantType.QInt8,
            extra_options={"ActivationSymmetric": symmetric},
        )  # fmt: skip
        return onnx.load(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--data", type=Path, default=Path(os.environ.get("EDGEDEPLOY_DATA", REPO.parent / "shared" / "data"))
    )
    ap.add_argument("--samples", type=int, default=128)
    ap.add_argument("--model", choices=("mobilenet", "mnist", "all"), default="all")
    ap.add_argument("--symmetric-only", action="store_true", help="only the symmetric (TensorRT-kind) recipes")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    ort.set_default_logger_severity(3)
    cases = [
        ("mobilenet_v1_0.25_224", "imagenet-sample", REPO / "examples/cards/mobilenet_v1_0.25_224.toml"),
        ("mnist-8_opset13", "mnist", REPO / "examples/cards/mnist-8.toml"),
    ]
    n = args.samples
    ours = {
        "edgedeploy minmax + bias correction": QuantizeOptions(samples=n),
        "edgedeploy entropy + bias correction": QuantizeOptions(samples=n, method="entropy"),
        "edgedeploy percentile 99.99 + bias corr.": QuantizeOptions(samples=n, method="percentile", percentile=99.99),
        "edgedeploy minmax, no bias correction": QuantizeOptions(samples=n, bias_correction=False),
    }
    sym = {"samples": n, "symmetric_activations": True, "refine": False}  # the recipes before refinement
    symmetric = {
        "symmetric minmax + bias corr.": QuantizeOptions(**sym),
        "symmetric + CLE + bias corr.": QuantizeOptions(**sym, equalize=True),
        "symmetric entropy + bias corr.": QuantizeOptions(**sym, method="entropy"),
        "symmetric percentile 99.99 + bias corr.": QuantizeOptions(**sym, method="percentile", percentile=99.99),
        "symmetric percentile 99.999 + bias corr.": QuantizeOptions(**sym, method="percentile", percentile=99.999),
        "symmetric + first and last layer float": QuantizeOptions(**sym, keep_float=("first-last",)),
        "symmetric, refined (default)": QuantizeOptions(samples=n, symmetric_activations=True),
    }
    if args.model != "all":
        cases = [c for c in cases if c[0].startswith(args.model)]
    for name, data, card_path in cases:
        model_path = args.data / "models" / f"{name}.onnx"
        card = load_card(card_path)
        model = onnx.load(model_path)
        from edgedeploy.compile.frontends.onnx_model import load_onnx

        spec = load_onnx(model_path).inputs[0]
        calib = load_calibration(args.data / data, card.preprocess, spec, args.samples, "calibration")
        halves = {h: load_labeled(args.data / data, card.preprocess, spec, h) for h in ("calibration", "evaluation")}
        off = card.postprocess.label_offset
        fp32 = {h: score(OrtClassifier(model), d, off) for h, d in halves.items()}
        sizes = ", ".join(f"{h} half {len(d)}" for h, d in halves.items())
        print(f"\n{name}: {len(calib)} calibration samples; images: {sizes}")
        print(f"  {'':46s} {'calibration half':>22s}   {'evaluation half (held out)':>26s}")
        print(f"  {'variant':46s} {'top-1':>7s} {'drop':>6s} {'agree':>7s}   {'top-1':>7s} {'drop':>6s} {'agree':>7s}")
        c, e = fp32["calibration"], fp32["evaluation"]
        print(f"  {'FP32 (onnxruntime)':46s} {c.top1:7.2f} {'':>6s} {'':>7s}   {e.top1:7.2f}")
        variants: list[tuple[str, object]] = [
            *([] if args.symmetric_only else [("onnxruntime default, asymmetric", False)]),
            ("onnxruntime default, symmetric", True),
            *([] if args.symmetric_only else ours.items()),
            *symmetric.items(),
        ]
        for label, how in variants:
            t = time.perf_counter()
            if isinstance(how, QuantizeOptions):
                q = quantize_qdq(model, calib, how).model
            else:
                q = ort_default(model_path, calib, bool(how))
            secs = time.perf_counter() - t
            cells = []
            for h, d in halves.items():
                s = score(QdqReference(q), d, off)
                cells.append(f"{s.top1:7.2f} {fp32[h].top1 - s.top1:6.2f} {agreement(fp32[h], s):6.2f}%")
            print(f"  {label:46s} {'   '.join(cells)}   (quantized in {secs:.1f} s)", flush=True)


if __name__ == "__main__":
    main()

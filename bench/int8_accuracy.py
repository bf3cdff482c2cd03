"""INT8 accuracy on the full evaluation halves: onnxruntime's default static QDQ against edgedeploy's.

    python bench/int8_accuracy.py [--data ../shared/data] [--samples 128]

MobileNetV1-0.25: calibration on the `calibration` half of imagenet-sample, evaluation on the other half
(split by sha1 of the file name, edgedeploy.datasets.split_of). mnist-8: the same split of the MNIST
test set by sample index. Every number is top-1 in percent measured with onnxruntime in this run.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from edgedeploy.compile.package import load_card
from edgedeploy.compile.quantize import QuantizeOptions, quantize_qdq
from edgedeploy.datasets import load_calibration, load_labeled
from edgedeploy.evaluate import OrtClassifier, agreement, score

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
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    ap.add_argument("--samples", type=int, default=128)
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
        "edgedeploy symmetric (TensorRT) + bias corr.": QuantizeOptions(samples=n, symmetric_activations=True),
        "edgedeploy symmetric + CLE + bias corr.": QuantizeOptions(
            samples=n, symmetric_activations=True, equalize=True
        ),
        "edgedeploy minmax, no bias correction": QuantizeOptions(samples=n, bias_correction=False),
    }
    for name, data, card_path in cases:
        model_path = args.data / "models" / f"{name}.onnx"
        card = load_card(card_path)
        model = onnx.load(model_path)
        spec_name = model.graph.input[0].name
        from edgedeploy.compile.onnx_model import load_onnx

        spec = load_onnx(model_path).inputs[0]
        calib = load_calibration(args.data / data, card.preprocess, spec, args.samples, "calibration")
        ev = load_labeled(args.data / data, card.preprocess, spec, "evaluation")
        off = card.postprocess.label_offset
        fp32 = score(OrtClassifier(model), ev, off)
        print(f"\n{name}: {len(calib)} calibration samples, {len(ev)} evaluation images ({spec_name})")
        print(f"  {'variant':46s} {'top-1':>7s} {'drop':>6s} {'agree':>7s} {'time':>6s}")
        print(f"  {'FP32 (onnxruntime)':46s} {fp32.top1:7.2f} {'':>6s} {'':>7s}")
        variants: list[tuple[str, object]] = [
            ("onnxruntime default, asymmetric", False),
            ("onnxruntime default, symmetric", True),
            *ours.items(),
        ]
        for label, how in variants:
            t = time.perf_counter()
            if isinstance(how, QuantizeOptions):
                q = quantize_qdq(model, calib, how).model
            else:
                q = ort_default(model_path, calib, bool(how))
            secs = time.perf_counter() - t
            s = score(OrtClassifier(q), ev, off)
            print(f"  {label:46s} {s.top1:7.2f} {fp32.top1 - s.top1:6.2f} {agreement(fp32, s):6.2f}% {secs:5.1f}s")


if __name__ == "__main__":
    main()

"""Held-out INT8 accuracy of MobileNetV1-0.25, 2-fold: calibrate on one half of imagenet-sample, score on the
other, then swap, so every one of the 500 photos is scored once by a model that never saw it.

    python bench/int8_twofold.py [--data ../shared/data] [--samples 128]

FP32 is onnxruntime; INT8 is the exact INT8 reference of each Q/DQ model (compile/int8/qdq_reference.py). Columns:
top-1 in percent over the 500 held-out predictions, drop against FP32, top-1 agreement with FP32, and the
calibration wall time of each fold (this machine, whatever else runs on it).
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from edgedeploy.compile.frontends.onnx_model import load_onnx
from edgedeploy.compile.int8.datasets import load_labeled
from edgedeploy.compile.int8.evaluate import OrtClassifier, score
from edgedeploy.compile.int8.qdq_reference import QdqReference
from edgedeploy.compile.int8.quantize import QuantizeOptions, quantize_qdq
from edgedeploy.compile.package import load_card

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--data", type=Path, default=Path(os.environ.get("EDGEDEPLOY_DATA", REPO.parent / "shared" / "data"))
    )
    ap.add_argument("--samples", type=int, default=128)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    ort.set_default_logger_severity(3)
    path = args.data / "models" / "mobilenet_v1_0.25_224.onnx"
    card = load_card(REPO / "examples/cards/mobilenet_v1_0.25_224.toml")
    model, spec, off = onnx.load(path), load_onnx(path).inputs[0], card.postprocess.label_offset
    halves = {
        h: load_labeled(args.data / "imagenet-sample", card.preprocess, spec, h) for h in ("calibration", "evaluation")
    }
    n = args.samples
    variants = {
        "asymmetric (default)": QuantizeOptions(samples=n),
        "symmetric, refinement off (before)": QuantizeOptions(samples=n, symmetric_activations=True, refine=False),
        "symmetric, refined (default)": QuantizeOptions(samples=n, symmetric_activations=True),
    }
    fp32 = {h: score(OrtClassifier(model), d, off) for h, d in halves.items()}
    labels = np.concatenate([halves[h].labels for h in halves])
    f_pred = np.concatenate([fp32[h].predictions for h in halves])
    print(f"MobileNetV1-0.25, {len(labels)} held-out predictions (2 folds), {n} calibration images per fold")
    print(f"  {'variant':38s} {'top-1':>7s} {'drop':>6s} {'agree':>7s}   calibration time per fold")
    print(f"  {'FP32 (onnxruntime)':38s} {100 * np.mean(f_pred == labels):7.2f}")
    for label, opts in variants.items():
        preds, secs = [], []
        for calib_half, eval_half in (("calibration", "evaluation"), ("evaluation", "calibration")):
            t = time.perf_counter()
            q = quantize_qdq(model, halves[calib_half].inputs[:n], replace(opts)).model
            secs.append(time.perf_counter() - t)
            preds.append(score(QdqReference(q), halves[eval_half], off).predictions)
        # fold 1 scored the evaluation half, fold 2 the calibration half: put them back in halves' order
        pred = np.concatenate([preds[1], preds[0]])
        top1 = 100 * np.mean(pred == labels)
        agree = 100 * np.mean(pred == f_pred)
        base = 100 * np.mean(f_pred == labels)
        times = ", ".join(f"{s:.0f} s" for s in secs)
        print(f"  {label:38s} {top1:7.2f} {base - top1:6.2f} {agree:6.2f}%   {times}", flush=True)


if __name__ == "__main__":
    main()

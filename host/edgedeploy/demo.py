"""The demo's ingredients: a digits classifier trained in seconds, a video of held-out digits,
and a local device. No downloads: scikit-learn ships the 8x8 digits dataset (1,797 images).

The model is a multi-layer perceptron (64 -> 64 ReLU -> 10) trained with scikit-learn and written as
ONNX (Flatten, Gemm, Relu, Gemm). The video shows each held-out digit for one frame, scaled 8x8 ->
64x64, so the agent's accuracy on the video can be checked against the true labels.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgedeploy_agent.bundle import Postprocess, Preprocess

from .compile.cards import ModelCard

MODEL_DESCRIPTION = "MLP 64-64-10 (ReLU) trained here on scikit-learn's 8x8 handwritten digits; input: 8x8 grey, 0..1"
FRAME_SIZE = 64


@dataclass(frozen=True)
class DigitsDemo:
    model: Path
    card: ModelCard
    video: Path
    labels: np.ndarray  # true digit per video frame
    train_accuracy: float
    test_accuracy_sklearn: float


def train_digits_model(work: Path, seed: int = 0) -> DigitsDemo:
    from sklearn.datasets import load_digits
    from sklearn.neural_network import MLPClassifier

    x, y = load_digits(return_X_y=True)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(y))
    train, test = order[:1200], order[1200:]
    clf = MLPClassifier(hidden_layer_sizes=(64,), max_iter=600, random_state=seed)
    clf.fit(x[train] / 16.0, y[train])
    work.mkdir(parents=True, exist_ok=True)
    model = work / "digits-mlp.onnx"
    onnx.save(_to_onnx(clf), model)
    video = work / "digits-test.avi"
    write_digit_video(x[test], video)
    card = ModelCard(
        name="digits-mlp",
        version="1",
        description=MODEL_DESCRIPTION,
        labels=[str(d) for d in range(10)],
        # the video's pixels are digit values 0..16 scaled to 0..255; the model was trained on 0..1
        preprocess=Preprocess(color="gray", resize="stretch", interpolation="area", scale=1 / 255.0),
        postprocess=Postprocess(kind="classifier", top_k=3, softmax=True),
    )
    return DigitsDemo(
        model,
        card,
        video,
        y[test],
        float(clf.score(x[train] / 16.0, y[train])),
        float(clf.score(x[test] / 16.0, y[test])),
    )


def _to_onnx(clf: object) -> onnx.ModelProto:
    w1, w2 = (np.asarray(w, dtype=np.float32) for w in clf.coefs_)  # type: ignore[attr-defined]
    b1, b2 = (np.asarray(b, dtype=np.float32) for b in clf.intercepts_)  # type: ignore[attr-defined]
    graph = helper.make_graph(
        [
            helper.make_node("Flatten", ["image"], ["flat"], axis=1),
            helper.make_node("Gemm", ["flat", "w1", "b1"], ["h"]),
            helper.make_node("Relu", ["h"], ["hr"]),
            helper.make_node("Gemm", ["hr", "w2", "b2"], ["logits"]),
        ],
        "digits_mlp",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="edgedeploy-demo")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def write_digit_video(images: np.ndarray, path: Path, fps: float = 25.0) -> int:
    """One frame per 8x8 image (values 0..16), upscaled with nearest neighbour; MJPG at top quality."""
    fourcc = cv2.VideoWriter.fourcc(*"MJPG")
    writer = cv2.VideoWriter(str(path), fourcc, fps, (FRAME_SIZE, FRAME_SIZE))
    writer.set(cv2.VIDEOWRITER_PROP_QUALITY, 100)
    if not writer.isOpened():
        raise RuntimeError(f"OpenCV cannot write {path}")
    for img in images:
        grey = np.clip(np.asarray(img, dtype=np.float64).reshape(8, 8) * 255.0 / 16.0, 0, 255).astype(np.uint8)
        big = cv2.resize(grey, (FRAME_SIZE, FRAME_SIZE), interpolation=cv2.INTER_NEAREST)
        writer.write(cv2.cvtColor(big, cv2.COLOR_GRAY2BGR))
    writer.release()
    return len(images)


def accuracy(reports: list[dict[str, Any]], labels: np.ndarray) -> tuple[float, int]:
    """Top-1 accuracy of the agent's reported predictions against the frame labels."""
    preds = {p["frame"]: p["top"][0][0] for r in reports for p in r.get("predictions", [])}
    if not preds:
        return 0.0, 0
    hits = sum(1 for f, c in preds.items() if f < len(labels) and int(c) == int(labels[f]))
    return hits / len(preds), len(preds)

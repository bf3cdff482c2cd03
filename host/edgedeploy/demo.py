"""The demo's ingredients: a digits classifier trained in seconds, a video of held-out digits,
and a local device. No downloads: the digits are the MNIST set in the shared data folder
(`mnist/`, 10,000 labelled 28x28 images; `--data`, default ../shared/data).

The model is a multi-layer perceptron (784 -> 64 ReLU -> 10) trained here with NumPy (minibatch SGD with
momentum, a few seconds on 2 cores) and written as ONNX (Flatten, Gemm, Relu, Gemm). The video shows each
held-out digit for one frame, scaled 28x28 -> 56x56, so the agent's accuracy on the video can be checked
against the true labels and against the same model on the raw images.
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
from .compile.int8.datasets import read_mnist
from .errors import InputError

HIDDEN = 64
HELD_OUT = 600  # digits kept out of training: they become the video
MODEL_DESCRIPTION = f"MLP 784-{HIDDEN}-10 (ReLU) trained here with NumPy on MNIST digits; input: 28x28 grey, 0..1"
FRAME_SIZE = 56


@dataclass(frozen=True)
class DigitsDemo:
    model: Path
    card: ModelCard
    video: Path
    labels: np.ndarray  # true digit per video frame
    train_accuracy: float
    test_accuracy: float  # the trained model on the held-out images themselves (not the video)


@dataclass(frozen=True)
class Mlp:
    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray
    b2: np.ndarray

    def logits(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(np.maximum(x @ self.w1 + self.b1, 0) @ self.w2 + self.b2)

    def accuracy(self, x: np.ndarray, y: np.ndarray) -> float:
        return float((self.logits(x).argmax(1) == y).mean())


def train_mlp(x: np.ndarray, y: np.ndarray, rng: np.random.Generator, epochs: int = 10, batch: int = 128) -> Mlp:
    """Softmax cross-entropy, minibatch SGD with momentum 0.9, He initialisation; x is (N, 784) in 0..1."""
    n_in, classes = x.shape[1], int(y.max()) + 1
    params = [
        (rng.standard_normal((n_in, HIDDEN)) * np.sqrt(2 / n_in)).astype(np.float32),
        np.zeros(HIDDEN, np.float32),
        (rng.standard_normal((HIDDEN, classes)) * np.sqrt(2 / HIDDEN)).astype(np.float32),
        np.zeros(classes, np.float32),
    ]
    velocity = [np.zeros_like(p) for p in params]
    lr = 0.1
    for _ in range(epochs):
        order = rng.permutation(len(y))
        for i in range(0, len(order), batch):
            idx = order[i : i + batch]
            w1, b1, w2, b2 = params
            h = np.maximum(x[idx] @ w1 + b1, 0)
            z = h @ w2 + b2
            p = np.exp(z - z.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            p[np.arange(len(idx)), y[idx]] -= 1  # d(loss)/dz, summed over the batch
            g = p / len(idx)
            gh = (g @ w2.T) * (h > 0)
            for k, grad in enumerate((x[idx].T @ gh, gh.sum(0), h.T @ g, g.sum(0))):
                velocity[k] = 0.9 * velocity[k] - lr * grad
                params[k] += velocity[k]
        lr *= 0.85
    return Mlp(*params)


def train_digits_model(work: Path, data: Path, seed: int = 0) -> DigitsDemo:
    if not (data / "mnist").is_dir():
        raise InputError(
            f"the demo trains on the MNIST digits of the shared data folder, and {data / 'mnist'} does not exist",
            hint="give the folder with --data DIR or EDGEDEPLOY_DATA=DIR (it holds mnist/, models/, ...)",
        )
    images, labels = read_mnist(data / "mnist")
    x = images.reshape(len(images), -1).astype(np.float32) / 255.0
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(labels))
    train, test = order[:-HELD_OUT], order[-HELD_OUT:]
    mlp = train_mlp(x[train], labels[train], rng)
    work.mkdir(parents=True, exist_ok=True)
    model = work / "digits-mlp.onnx"
    onnx.save(_to_onnx(mlp, images.shape[1:]), model)
    video = work / "digits-test.avi"
    write_digit_video(images[test], video)
    card = ModelCard(
        name="digits-mlp",
        version="1",
        description=MODEL_DESCRIPTION,
        labels=[str(d) for d in range(10)],
        preprocess=Preprocess(color="gray", resize="stretch", interpolation="area", scale=1 / 255.0),
        postprocess=Postprocess(kind="classifier", top_k=3, softmax=True),
    )
    return DigitsDemo(
        model, card, video, labels[test], mlp.accuracy(x[train], labels[train]), mlp.accuracy(x[test], labels[test])
    )


def _to_onnx(mlp: Mlp, image_shape: tuple[int, ...]) -> onnx.ModelProto:
    w1, b1, w2, b2 = mlp.w1, mlp.b1, mlp.w2, mlp.b2
    graph = helper.make_graph(
        [
            helper.make_node("Flatten", ["image"], ["flat"], axis=1),
            helper.make_node("Gemm", ["flat", "w1", "b1"], ["h"]),
            helper.make_node("Relu", ["h"], ["hr"]),
            helper.make_node("Gemm", ["hr", "w2", "b2"], ["logits"]),
        ],
        "digits_mlp",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 1, *image_shape])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="edgedeploy-demo")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def write_digit_video(images: np.ndarray, path: Path, fps: float = 25.0) -> int:
    """One frame per grey image (uint8), upscaled with nearest neighbour; MJPG at top quality."""
    fourcc = cv2.VideoWriter.fourcc(*"MJPG")
    writer = cv2.VideoWriter(str(path), fourcc, fps, (FRAME_SIZE, FRAME_SIZE))
    writer.set(cv2.VIDEOWRITER_PROP_QUALITY, 100)
    if not writer.isOpened():
        raise RuntimeError(f"OpenCV cannot write {path}")
    for img in images:
        big = cv2.resize(np.asarray(img, dtype=np.uint8), (FRAME_SIZE, FRAME_SIZE), interpolation=cv2.INTER_NEAREST)
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

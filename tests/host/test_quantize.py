"""Calibration sources, the QDQ quantizer and its graph transforms, on real models and real data."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgedeploy.compile.int8.datasets import list_images, load_calibration, load_labeled, split_of
from edgedeploy.compile.int8.equalize import cross_layer_equalize
from edgedeploy.compile.int8.quantize import (
    QuantizeOptions,
    quantizable_layers,
    quantize_qdq,
    resolve_keep_float,
    tensorrt_qdq,
)
from edgedeploy.errors import InputError, ModelError
from edgedeploy_agent.bundle import Preprocess, TensorSpec

MNIST_SPEC = TensorSpec(name="Input3", shape=[1, 1, 28, 28], layout="NCHW")
MNV1_SPEC = TensorSpec(name="input", shape=[1, 3, 224, 224], layout="NCHW")
MNV1_PRE = Preprocess(resize="center_crop", crop_fraction=0.875, mean=[127.5], std=[127.5])
GRAY = Preprocess(color="gray")


@pytest.fixture(scope="module")
def mnist_calib(data_dir: Path) -> np.ndarray:
    return load_calibration(data_dir / "mnist", GRAY, MNIST_SPEC, 64)


def _mnist(data_dir: Path) -> onnx.ModelProto:
    return onnx.load(data_dir / "models" / "mnist-8_opset13.onnx")


def test_split_is_deterministic_and_disjoint(data_dir: Path) -> None:
    folder = data_dir / "imagenet-sample"
    cal, ev = list_images(folder, "calibration"), list_images(folder, "evaluation")
    assert not {p.name for p in cal} & {p.name for p in ev}
    assert len(cal) + len(ev) == len(list_images(folder)) == 500
    assert 200 < len(cal) < 300  # roughly half
    assert all(split_of(p.name) == "calibration" for p in cal)


def test_a_build_without_eval_data_calibrates_on_the_half_eval_skips(data_dir: Path) -> None:
    """`build --calibration DIR` then `eval --data DIR` (split auto: the evaluation half) must not score
    photos the build calibrated on: the build reads the calibration half whether or not it evaluates."""
    from edgedeploy.compile.int8.build import Int8Config

    folder = data_dir / "imagenet-sample"
    assert Int8Config(calibration=folder).splits() == ("calibration", "all")
    assert Int8Config(calibration=folder, eval_data=folder).splits() == ("calibration", "evaluation")
    assert Int8Config(calibration=folder, eval_data=data_dir / "mnist").splits() == ("calibration", "all")


def test_calibration_from_images_video_and_npy(data_dir: Path, tmp_path: Path) -> None:
    imgs = load_calibration(data_dir / "imagenet-sample", MNV1_PRE, MNV1_SPEC, 4)
    assert imgs.shape == (4, 3, 224, 224) and imgs.dtype == np.float32
    assert -1.0 <= imgs.min() < 0 < imgs.max() <= 1.0  # (x - 127.5) / 127.5
    video = load_calibration(data_dir / "video" / "bikes.mp4", MNV1_PRE, MNV1_SPEC, 5)
    assert video.shape == (5, 3, 224, 224)
    assert not np.array_equal(video[0], video[-1])  # spread over the clip, not one frame
    np.save(tmp_path / "a.npy", imgs[:2])
    np.save(tmp_path / "b.npy", imgs[2])  # one sample without the batch axis
    assert load_calibration(tmp_path, MNV1_PRE, MNV1_SPEC, 10).shape == (3, 3, 224, 224)


@pytest.mark.parametrize("case", ["empty", "unreadable", "wrong-shape", "missing", "bad-video"])
def test_bad_calibration_source_names_the_file(case: str, tmp_path: Path) -> None:
    src = tmp_path / "calib"
    src.mkdir()
    if case == "unreadable":
        (src / "broken.jpg").write_bytes(b"not a jpeg")
    elif case == "wrong-shape":
        np.save(src / "batch.npy", np.zeros((2, 3, 32, 32), np.float32))
    elif case == "missing":
        src = tmp_path / "nowhere"
    elif case == "bad-video":
        src = tmp_path / "clip.mp4"
        src.write_bytes(b"\0" * 100)
    with pytest.raises(InputError) as e:
        load_calibration(src, MNV1_PRE, MNV1_SPEC, 8)
    expected = {"unreadable": "broken.jpg", "wrong-shape": "batch.npy"}.get(case, str(src))
    assert expected in e.value.message


def test_labeled_sets(data_dir: Path, tmp_path: Path) -> None:
    imagenet = load_labeled(data_dir / "imagenet-sample", MNV1_PRE, MNV1_SPEC, "evaluation", limit=3)
    first = list_images(data_dir / "imagenet-sample", "evaluation")[0].name.split("_")[0]
    synsets = (data_dir / "labels" / "imagenet_synsets_1000.txt").read_text().split("\n")
    assert synsets[imagenet.labels[0]].split()[0] == first
    mnist = load_labeled(data_dir / "mnist", GRAY, MNIST_SPEC, limit=10)
    assert mnist.inputs.shape == (10, 1, 28, 28) and mnist.labels[0] == 7  # the first MNIST test digit
    for cls in ("cat", "dog"):
        (tmp_path / cls).mkdir()
        cv2.imwrite(str(tmp_path / cls / "a.png"), np.zeros((8, 8, 3), np.uint8))
    folders = load_labeled(tmp_path, GRAY, MNIST_SPEC)
    assert folders.kind == "class-folders" and sorted(folders.labels.tolist()) == [0, 1]


def test_keep_float_presets_and_patterns(data_dir: Path) -> None:
    m = _mnist(data_dir)
    layers = quantizable_layers(m)
    assert layers == ["Convolution28", "Convolution110", "Times212"]
    assert resolve_keep_float(m, ("first-last",)) == ["Convolution28", "Times212"]
    assert resolve_keep_float(m, ("Conv*",)) == ["Convolution28", "Convolution110"]
    with pytest.raises(InputError, match="matches no quantizable layer"):
        resolve_keep_float(m, ("nope",))


def test_qdq_model_keeps_named_layers_float(data_dir: Path, mnist_calib: np.ndarray) -> None:
    rep = quantize_qdq(_mnist(data_dir), mnist_calib, QuantizeOptions(keep_float=("last",)))
    assert rep.float_layers == ["Times212"] and rep.quantized_layers == ["Convolution28", "Convolution110"]
    ops = [n.op_type for n in rep.model.graph.node]
    assert ops.count("QuantizeLinear") >= 2 and "DequantizeLinear" in ops
    matmul = next(n for n in rep.model.graph.node if n.op_type == "MatMul")
    producers = {o: n.op_type for n in rep.model.graph.node for o in n.output}
    assert producers.get(matmul.input[1]) != "DequantizeLinear"  # its weight stays float


def test_tensorrt_preset_has_zero_zero_points(data_dir: Path, mnist_calib: np.ndarray) -> None:
    rep = tensorrt_qdq(_mnist(data_dir), mnist_calib)
    inits = {t.name: numpy_helper.to_array(t) for t in rep.model.graph.initializer}
    zps = [inits[n.input[2]] for n in rep.model.graph.node if n.op_type == "QuantizeLinear"]
    assert zps and all(z.dtype == np.int8 and not z.any() for z in zps)


def test_power_of_two_scales(data_dir: Path, mnist_calib: np.ndarray) -> None:
    rep = quantize_qdq(_mnist(data_dir), mnist_calib, QuantizeOptions(power_of_two=True))
    inits = {t.name: numpy_helper.to_array(t) for t in rep.model.graph.initializer}
    scales = [inits[n.input[1]] for n in rep.model.graph.node if n.op_type == "QuantizeLinear"]
    assert scales
    for s in scales:
        assert np.allclose(np.log2(s), np.round(np.log2(s)))


def test_model_without_quantizable_layers(tmp_path: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu-only", [x], [y]))
    with pytest.raises(ModelError, match="no quantizable layers"):
        quantize_qdq(model, np.zeros((2, 1, 4), np.float32), QuantizeOptions())


def test_equalization_keeps_the_float_function(data_dir: Path) -> None:
    model = onnx.load(data_dir / "models" / "mobilenet_v1_0.25_224.onnx")
    eq, pairs = cross_layer_equalize(model)
    assert pairs == 26  # every depthwise/pointwise pair across a ReLU6
    x = load_calibration(data_dir / "imagenet-sample", MNV1_PRE, MNV1_SPEC, 4)
    a = ort.InferenceSession(model.SerializeToString()).run(None, {"input": x})[0]
    b = ort.InferenceSession(eq.SerializeToString()).run(None, {"input": x})[0]
    np.testing.assert_allclose(a, b, atol=2e-4)


def test_unsupported_operator_names_it() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = numpy_helper.from_array(np.ones((1, 1, 1, 1), np.float32), "w")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv0"),
        helper.make_node("Weird", ["c"], ["y"], domain="acme"),
    ]
    graph = helper.make_graph(nodes, "custom", [x], [y], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("acme", 1)])
    with pytest.raises(ModelError, match="acme:Weird"):
        quantize_qdq(model, np.zeros((2, 1, 4, 4), np.float32), QuantizeOptions())

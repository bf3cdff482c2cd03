"""The layer-wise refinement of symmetric INT8 (compile/int8/refine.py) on small synthetic layers and models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgedeploy.compile.int8.qdq_reference import QdqReference
from edgedeploy.compile.int8.quantize import QuantizeOptions, quantize_qdq
from edgedeploy.compile.int8.refine import (
    adaround,
    center_relu6,
    fake_quant,
    held_out_gain,
    layer_stats,
    mse_clip,
    reconstruction_error,
)


def test_mse_clip_beats_max_scaling_on_a_long_tail() -> None:
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.exponential(0.5, 1_000_000), [20.0]])  # one outlier sets the max
    scale, err, naive = mse_clip(x)
    assert scale * 127 < 0.5 * 20.0
    assert err < 0.5 * naive
    assert np.isclose(naive, np.mean((x - fake_quant(x, 20.0 / 127)) ** 2))
    flat = rng.uniform(-1, 1, 100_000)  # no tail: the max is (nearly) optimal, never worse
    s2, e2, n2 = mse_clip(flat)
    assert e2 <= n2 and s2 * 127 > 0.9


def _window_node(pads: list[int]) -> onnx.NodeProto:
    return helper.make_node("Conv", ["x", "w"], ["y"], pads=pads, strides=[1, 1])


def test_learned_rounding_beats_nearest_on_a_small_conv() -> None:
    """A 3x3 conv (8 → 4 channels) on a quantized input: learned rounding lowers the output error."""
    rng = np.random.default_rng(1)
    xf = np.maximum(rng.normal(0.5, 1.0, (16, 8, 10, 10)), 0).astype(np.float32)
    xq = fake_quant(xf, float(xf.max()) / 127 * 4).astype(np.float32)  # a coarse input grid, as after ReLU6
    w = rng.normal(0, 0.1, (4, 8, 3, 3))
    node = _window_node([1, 1, 1, 1])
    stats = layer_stats(xq, xf, node, (3, 3), 1)
    assert stats.rows == 16 * 10 * 10
    cov = stats.centered()
    wg = w.reshape(1, 4, -1)
    scale = np.abs(wg).max(axis=2, keepdims=True) / 127
    nearest = np.clip(np.rint(wg / scale), -127, 127)
    learned = adaround(wg, scale, cov)
    gap = np.abs(learned - wg / scale)
    assert gap.max() <= 1  # each weight is floor(w / s) or floor(w / s) + 1, never further
    assert np.abs(learned).max() <= 127
    before = reconstruction_error(nearest * scale, wg, cov)
    after = reconstruction_error(learned * scale, wg, cov)
    assert after < 0.98 * before  # most of this error is the input's own quantization, which no rounding undoes
    # the covariance form is the direct error after the best bias: the mean output variance of the error
    from edgedeploy.compile.int8.refine import conv_windows

    cq, cf = conv_windows(xq, node, (3, 3), 1)[:, 0], conv_windows(xf, node, (3, 3), 1)[:, 0]
    direct = float(np.var(cq @ (learned * scale)[0].T - cf @ wg[0].T, axis=0).mean())
    assert np.isclose(direct, after, rtol=1e-3)


def test_learned_rounding_is_kept_only_when_it_holds_on_unseen_windows() -> None:
    """held_out_gain fits on one half of the images and scores on the other: positive where the weight
    rounding error meets correlated inputs (what learned rounding fixes), negative where the halves disagree
    (a fit to one half's input error, here a gain of 1.05 against 0.95)."""
    rng = np.random.default_rng(7)
    z = rng.normal(0, 1, (32, 3, 10, 10))
    xf = np.einsum("cd,ndhw->nchw", rng.normal(0, 1, (32, 3)), z) + 0.05 * rng.normal(0, 1, (32, 32, 10, 10))
    xf = xf.astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"])
    w = rng.normal(0, 0.1, (1, 16, 32))
    scale = np.abs(w).max(axis=2, keepdims=True) / 7  # coarse weights: rounding matters
    same = [layer_stats(xf[i::2], xf[i::2], node, (1, 1), 1).centered() for i in (0, 1)]
    assert held_out_gain(w, scale, same, 1.0) > 20
    apart = [layer_stats(xf[i::2] * g, xf[i::2], node, (1, 1), 1).centered() for i, g in ((0, 1.05), (1, 0.95))]
    assert held_out_gain(w, scale, apart, 1.0) < 0


def _relu6_model() -> onnx.ModelProto:
    """conv 3x3 → ReLU6 → conv 1x1 (unpadded) → ReLU6 → conv 3x3 padded (centred through an explicit Pad)."""
    rng = np.random.default_rng(2)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.5, (8, 3, 3, 3)).astype(np.float32), "w0"),
        numpy_helper.from_array(rng.normal(0, 0.1, 8).astype(np.float32), "b0"),
        numpy_helper.from_array(rng.normal(0, 0.3, (8, 8, 1, 1)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.normal(0, 0.1, 8).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.normal(0, 0.3, (4, 8, 3, 3)).astype(np.float32), "w2"),
        numpy_helper.from_array(rng.normal(0, 0.1, 4).astype(np.float32), "b2"),
        numpy_helper.from_array(np.float32(0), "lo"),
        numpy_helper.from_array(np.float32(6), "hi"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], name="conv0", pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c0", "lo", "hi"], ["a0"], name="relu0"),
        helper.make_node("Conv", ["a0", "w1", "b1"], ["c1"], name="conv1"),
        helper.make_node("Clip", ["c1", "lo", "hi"], ["a1"], name="relu1"),
        helper.make_node("Conv", ["a1", "w2", "b2"], ["y"], name="conv2", pads=[1, 1, 1, 1]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3, 12, 12])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    return helper.make_model(
        helper.make_graph(nodes, "relu6", [x], [y], inits), opset_imports=[helper.make_opsetid("", 13)]
    )


def _ort(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return np.asarray(ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0])


def test_centred_relu6_keeps_the_float_function() -> None:
    model = _relu6_model()
    x = np.random.default_rng(3).normal(0, 1, (4, 3, 12, 12)).astype(np.float32)
    centred, names, pads = center_relu6(model)
    # relu1 feeds a padded conv: its padding becomes a Pad with the shifted zero, so the border stays right
    assert names == ["relu0", "relu1"] and pads == ["conv2_centred_pad"]
    np.testing.assert_allclose(_ort(centred, x), _ort(model, x), atol=1e-4)
    bounds = {t.name: numpy_helper.to_array(t) for t in centred.graph.initializer}
    for relu in names:
        clip = next(n for n in centred.graph.node if n.name == relu)
        assert (float(bounds[clip.input[1]]), float(bounds[clip.input[2]])) == (-3.0, 3.0)
    pad = next(n for n in centred.graph.node if n.op_type == "Pad")
    conv2 = next(n for n in centred.graph.node if n.name == "conv2")
    assert float(bounds[pad.input[2]]) == -3.0 and list(bounds[pad.input[1]]) == [0, 0, 1, 1, 0, 0, 1, 1]
    assert conv2.input[0] == pad.output[0] and not any(p for a in conv2.attribute if a.name == "pads" for p in a.ints)


def test_relu6_before_an_average_pool_is_centred_through_it() -> None:
    """ReLU6 → AveragePool → conv (MobileNet's head): the pool's mean shifts with its input, so the conv after
    it takes the compensation; a ReLU6 read by anything else (here a Softmax) stays as it is."""
    rng = np.random.default_rng(6)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.5, (8, 3, 1, 1)).astype(np.float32), "w0"),
        numpy_helper.from_array(rng.normal(0, 0.1, 8).astype(np.float32), "b0"),
        numpy_helper.from_array(rng.normal(0, 0.3, (5, 8, 1, 1)).astype(np.float32), "w1"),
        numpy_helper.from_array(np.float32(0), "lo"),
        numpy_helper.from_array(np.float32(6), "hi"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], name="conv0"),
        helper.make_node("Clip", ["c0", "lo", "hi"], ["a0"], name="relu0"),
        helper.make_node("AveragePool", ["a0"], ["p0"], name="pool", kernel_shape=[4, 4], strides=[4, 4]),
        helper.make_node("Conv", ["p0", "w1"], ["y"], name="logits"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    model = helper.make_model(
        helper.make_graph(nodes, "head", [x], [y], inits), opset_imports=[helper.make_opsetid("", 13)]
    )
    feed = rng.normal(0, 2, (4, 3, 8, 8)).astype(np.float32)
    centred, names, pads = center_relu6(model)
    assert names == ["relu0"] and pads == []
    np.testing.assert_allclose(_ort(centred, feed), _ort(model, feed), atol=1e-4)
    model.graph.node.append(helper.make_node("Softmax", ["a0"], ["s"], name="other"))
    model.graph.output.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, None))
    assert center_relu6(model)[1] == []


def test_centring_pad_is_quantized_with_its_input_scale() -> None:
    """The Pad's output Q/DQ use the Clip's scale: the border is the integer an interior ReLU6 zero becomes."""
    rng = np.random.default_rng(5)
    calib = rng.normal(0, 1, (32, 3, 12, 12)).astype(np.float32)
    rep = quantize_qdq(_relu6_model(), calib, QuantizeOptions(symmetric_activations=True))
    g = rep.model.graph
    producer = {o: n for n in g.node for o in n.output}
    pad = next(n for n in g.node if n.op_type == "Pad")
    dq_in = producer[pad.input[0]]
    q_out = next(n for n in g.node if pad.output[0] in n.input)
    dq_out = next(n for n in g.node if q_out.output[0] in n.input)
    assert dq_in.op_type == "DequantizeLinear" and q_out.op_type == "QuantizeLinear"
    assert q_out.input[1] == dq_out.input[1] == dq_in.input[1]
    # the relu1 output of 0 (centred: -3) and the border give the same integer in the exact reference
    conv2_in = next(n for n in g.node if n.name == "conv2").input[0]
    g.output.append(onnx.ValueInfoProto(name=conv2_in))
    border = QdqReference(rep.model).run({"x": calib[:2]})[1]
    scale = float(numpy_helper.to_array(next(t for t in g.initializer if t.name == q_out.input[1])))
    assert np.all(border[:, :, 0, :] == border.min()) and np.isclose(border.min(), -127 * scale)


def test_symmetric_qdq_stays_tensorrt_kind_and_refined_is_closer_to_fp32() -> None:
    """Refined or not: int8 zero points 0, int8 weights in [-127, 127], int32 biases; refined is closer to FP32."""
    rng = np.random.default_rng(4)
    calib = rng.normal(0, 1, (64, 3, 12, 12)).astype(np.float32)
    held_out = rng.normal(0, 1, (32, 3, 12, 12)).astype(np.float32)
    model = _relu6_model()
    want = _ort(model, held_out)
    errors = {}
    for refine in (False, True):
        rep = quantize_qdq(model, calib, QuantizeOptions(symmetric_activations=True, refine=refine))
        inits = {t.name: numpy_helper.to_array(t) for t in rep.model.graph.initializer}
        q_nodes = [n for n in rep.model.graph.node if n.op_type == "QuantizeLinear"]
        assert q_nodes and all(inits[n.input[2]].dtype == np.int8 and not inits[n.input[2]].any() for n in q_nodes)
        weights = [inits[f"w{i}_quantized"] for i in range(3)]
        assert all(w.dtype == np.int8 and np.abs(w).max() <= 127 for w in weights)
        assert inits["b0_quantized"].dtype == inits["b2_quantized"].dtype == np.int32
        assert bool(rep.choices) == refine
        errors[refine] = float(np.mean((QdqReference(rep.model).run({"x": held_out})[0] - want) ** 2))
    assert any(line.startswith("relu0: ReLU6 output centred") for line in rep.choices)
    assert sum(line.startswith("conv") and "rounding" in line for line in rep.choices) == 3
    assert errors[True] < errors[False]


@pytest.mark.compile
def test_build_prints_the_per_layer_choice(data_dir: Path, tmp_path: Path, cli: Any) -> None:
    """`edgedeploy build --int8 --symmetric` prints what the refinement chose for each layer."""
    r = cli(
        "build",
        str(data_dir / "models" / "mnist-8_opset13.onnx"),
        "-p",
        "cpu-x86_64",
        "--int8",
        "--symmetric",
        "--calibration",
        str(data_dir / "mnist"),
        "--samples",
        "32",
        "-o",
        str(tmp_path / "m.edb"),
    )
    assert r.code == 0, r.err
    assert "calibration samples" in r.out and " s;" in r.out
    lines = [ln.strip() for ln in r.out.splitlines() if "rounding" in ln]
    assert len(lines) == 2 and all(ln.startswith("Convolution") for ln in lines), r.out
    # eval reports agreement with FP32 beside top-1, for the bundle and for the exact INT8 reference
    r = cli("eval", str(tmp_path / "m.edb"), "--data", str(data_dir / "mnist"), "--limit", "300", "--json")
    assert r.code == 0, r.err
    res = json.loads(r.out)
    assert res["top1_agreement_fp32_vs_bundle"] >= 95.0 and res["top1_agreement_fp32_vs_int8_reference"] >= 95.0

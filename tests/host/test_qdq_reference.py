"""The exact INT8 reference (compile/int8/qdq_reference.py): integer sums exact past float32's 2^24, the same
answer as an independent int64 computation, and the same operator semantics as onnxruntime on float models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgedeploy.compile.int8.qdq_reference import QdqReference, reference_outputs
from edgedeploy.errors import ModelError


def _qdq_conv(w_q: np.ndarray, bias_q: np.ndarray, sx: float, zx: int, sw: np.ndarray, sy: float, zy: int, **attrs):  # type: ignore[no-untyped-def]
    """x -> Q(uint8) -> DQ -> Conv(DQ(w int8, per channel), DQ(bias int32)) -> Relu -> Q(uint8) -> DQ -> y."""
    k = w_q.shape[0]
    inits = [
        numpy_helper.from_array(np.float32(sx), "sx"),
        numpy_helper.from_array(np.uint8(zx), "zx"),
        numpy_helper.from_array(w_q.astype(np.int8), "wq"),
        numpy_helper.from_array(sw.astype(np.float32), "sw"),
        numpy_helper.from_array(np.zeros(k, np.int8), "zw"),
        numpy_helper.from_array(bias_q.astype(np.int32), "bq"),
        numpy_helper.from_array((np.float32(sx) * sw.astype(np.float32)).astype(np.float32), "sb"),
        numpy_helper.from_array(np.zeros(k, np.int32), "zb"),
        numpy_helper.from_array(np.float32(sy), "sy"),
        numpy_helper.from_array(np.uint8(zy), "zy"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
        helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["wd"], axis=0),
        helper.make_node("DequantizeLinear", ["bq", "sb", "zb"], ["bd"], axis=0),
        helper.make_node("Conv", ["xd", "wd", "bd"], ["c"], **attrs),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("QuantizeLinear", ["r", "sy", "zy"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _int64_conv(xq: np.ndarray, zx: int, w_q: np.ndarray, stride: int, pad: int, group: int) -> np.ndarray:
    """A plain loop over output positions in int64: the second, independent way."""
    x = np.pad(xq.astype(np.int64) - zx, [(0, 0), (0, 0), (pad, pad), (pad, pad)])
    n, c, h, w = x.shape
    k, cg, kh, kw = w_q.shape
    oh, ow = (h - kh) // stride + 1, (w - kw) // stride + 1
    out = np.zeros((n, k, oh, ow), np.int64)
    per = k // group
    for o in range(k):
        g = o // per
        for i in range(oh):
            for j in range(ow):
                patch = x[:, g * cg : (g + 1) * cg, i * stride : i * stride + kh, j * stride : j * stride + kw]
                out[:, o, i, j] = (patch * w_q[o].astype(np.int64)).sum(axis=(1, 2, 3))
    return out


@pytest.mark.parametrize(("group", "stride", "pad"), [(1, 1, 1), (1, 2, 0), (8, 1, 1)])
def test_matches_an_independent_int64_computation(group: int, stride: int, pad: int) -> None:
    rng = np.random.default_rng(group * 10 + stride)
    c, k = 8, 8
    w_q = rng.integers(-127, 128, (k, c // group, 3, 3))
    bias_q = rng.integers(-5000, 5000, k)
    sx, zx, sy, zy = 0.02, 120, 0.05, 3
    sw = rng.uniform(0.001, 0.01, k)
    model = _qdq_conv(w_q, bias_q, sx, zx, sw, sy, zy, group=group, strides=[stride] * 2, pads=[pad] * 4)
    x = rng.normal(0, 1.5, (2, c, 9, 9)).astype(np.float32)

    got = QdqReference(model).run({"x": x})[0]

    xq = np.clip(np.rint(x.astype(np.float64) / np.float64(np.float32(sx))) + zx, 0, 255)
    acc = _int64_conv(xq, zx, w_q, stride, pad, group)
    sxw = np.float64(np.float32(sx)) * sw.astype(np.float32).astype(np.float64)
    sb = (np.float32(sx) * sw.astype(np.float32)).astype(np.float32).astype(np.float64)
    real = np.maximum(acc * sxw.reshape(1, k, 1, 1) + (bias_q * sb).reshape(1, k, 1, 1), 0)
    yq = np.clip(np.rint(real / np.float64(np.float32(sy))) + zy, 0, 255)
    want = ((yq - zy) * np.float64(np.float32(sy))).astype(np.float32)
    np.testing.assert_array_equal(got, want)


def test_integer_sums_stay_exact_past_float32_precision() -> None:
    """65536 input channels at full scale: the sum is an odd number near 2^31, so float32 (24-bit mantissa)
    cannot hold it or the partial sums on the way, whatever order a BLAS adds them in."""
    k, c = 4, 65536
    w_q = np.full((k, c, 1, 1), 127)
    model = _qdq_conv(w_q, np.zeros(k, np.int64), 1.0, 0, np.ones(k), 1.0, 0, group=1)
    x = np.full((1, c, 1, 1), 255.0, np.float32)
    x[0, 0::7] = 254.0  # 9363 of them: the total 127 * (255 * 65536 - 9363) is odd
    xq = np.clip(np.rint(x.astype(np.float64)), 0, 255)
    acc = (xq[0, :, 0, 0].astype(np.int64) * 127).sum()
    assert acc % 2 == 1 and acc > 2**30
    # the model requantizes to uint8, so read the exact pre-activation sum from the Conv node itself
    conv_only = onnx.ModelProto.FromString(model.SerializeToString())
    conv_only.graph.output[0].name = "c"
    got = QdqReference(conv_only, float64_outputs=True).run({"x": x})[0]
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got.reshape(-1), np.full(k, acc, np.float64))


@pytest.mark.parametrize("name", ["mnist-8_opset13.onnx", "mobilenet_v1_0.25_224.onnx"])
def test_float_models_run_as_onnxruntime_runs_them(data_dir: Path, name: str) -> None:
    """Operator semantics (pooling, padding, reshape, softmax, gemm) checked on the real float models."""
    model = onnx.load(data_dir / "models" / name)
    inp = model.graph.input[0]
    shape = [d.dim_value or 2 for d in inp.type.tensor_type.shape.dim]
    x = np.random.default_rng(0).normal(0, 1, shape).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {inp.name: x})[0]
    got = reference_outputs(model, x)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_an_unknown_operator_is_one_clear_error() -> None:
    graph = helper.make_graph(
        [helper.make_node("Einsum", ["x", "x"], ["y"], equation="ij,jk->ik")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
    )
    with pytest.raises(ModelError, match="no Einsum operator") as e:
        QdqReference(helper.make_model(graph))
    assert "\n" not in e.value.message

"""The exact INT8 reference: what a Q/DQ ONNX model should output, the same on every machine.

Everything in the project that asks "what should the INT8 model output" uses this module: the reference
outputs a TensorRT bundle ships for the device's acceptance check, `edgedeploy eval`, the INT8 accuracy
gate of `edgedeploy build --int8`, the benchmarks and the tests.

Why not onnxruntime: its optimized CPU run fuses Q/DQ pairs into integer kernels (QLinearConv) whose
arithmetic depends on the build host's CPU. On AVX2-only CPUs the U8S8/S8S8 kernels use `vpmaddubsw`,
whose int16 pair sums saturate; on AVX-512 VNNI CPUs `vpdpbusd` does not. The same model then gives
different outputs on different machines (issue 17 reports a symmetric MobileNetV1 at 10 % top-1 on one,
53 % on another). onnxruntime with graph optimizations off is fake-quant float32: its convolution sums scaled
values in float32, so its rounding depends on the summation order of the CPU's GEMM kernel.

What this computes, and why it is exact:
  * DequantizeLinear keeps the integer form `q - zero_point` beside its scale. A Conv, Gemm or MatMul whose
    operands are both dequantized (a per-tensor scale on the activation, per-tensor or per-output-channel
    on the weight) sums the integer products first, then multiplies by the scales. The integers are summed
    in float64: every product is below 2^16 and every partial sum below 2^53 (K < 2^37 terms), so each
    float64 addition is exact and the result does not depend on the summation order, the BLAS library or
    the CPU. This is what an integer engine (TensorRT's IMMA, TVM's int32 kernels) accumulates.
  * Everything else (scales, bias, requantization, elementwise ops, pooling, softmax, layers kept in float)
    is float64. QuantizeLinear rounds half to even, as the ONNX spec says.

Where it stops being bit-exact: values that are not integer sums (float layers, average pooling, softmax,
the scale products) carry float64 rounding (relative ~1e-16). A quantized value can only differ between two
machines if it lies within that distance of a rounding boundary; integer engines differ from this
reference far more (float32 multipliers, fused scales), which is why comparisons against it allow one
quantization step. The outputs are returned as float32.

Operators are interpreted one by one in numpy; an operator this module does not know is a one-line error
naming it. It is a reference, not a runtime: MobileNetV1-0.25 takes about 0.1 s per image.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from numpy.lib.stride_tricks import sliding_window_view
from onnx import numpy_helper

from ...errors import ModelError


@dataclass(frozen=True)
class IntForm:
    """A dequantized tensor as integers and scale: value = ints * scale (scale broadcast along `axis`)."""

    ints: np.ndarray  # q - zero_point, as float64 holding integers
    scale: np.ndarray  # float64, scalar or 1-D
    axis: int

    @property
    def per_tensor(self) -> bool:
        return self.scale.size == 1


class QdqReference:
    """Runs a Q/DQ (or plain float) ONNX model exactly; `run({input: array}) -> [outputs]`."""

    def __init__(self, model: onnx.ModelProto, float64_outputs: bool = False) -> None:
        self.graph = model.graph
        self.float64_outputs = float64_outputs  # outputs as computed, for checks finer than float32
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
        self.consts: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in self.graph.initializer}
        self.inputs = [i.name for i in self.graph.input if i.name not in self.consts]
        for node in self.graph.node:
            if node.op_type not in _OPS:
                raise ModelError(
                    f"the exact INT8 reference has no {node.op_type} operator (node {node.name or node.output[0]})",
                    hint=f"it interprets: {', '.join(sorted(_OPS))}",
                )

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        values: dict[str, Any] = dict(self.consts)
        values.update({k: np.asarray(v) for k, v in feeds.items()})
        ints: dict[str, IntForm] = {}
        for node in self.graph.node:
            ins = [values[n] if n else None for n in node.input]
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            ctx = _Node(node, ins, attrs, [ints.get(n) for n in node.input], self.opset)
            outs = _OPS[node.op_type](ctx)
            if ctx.int_form is not None:  # set by DequantizeLinear
                ints[node.output[0]] = ctx.int_form
            for name, value in zip(node.output, outs, strict=False):
                values[name] = value
        dtype = np.float64 if self.float64_outputs else np.float32
        return [np.asarray(values[o.name]).astype(dtype) for o in self.graph.output]

    def predict(self, batch: np.ndarray) -> np.ndarray:
        """Classifier protocol (int8/evaluate.py): the first output, one row per sample, 16 samples at a time."""
        outs = [self.run({self.inputs[0]: batch[i : i + 16]})[0] for i in range(0, len(batch), 16)]
        return np.concatenate(outs).reshape(len(batch), -1)


@dataclass
class _Node:
    node: onnx.NodeProto
    ins: list[Any]
    attrs: dict[str, Any]
    int_forms: list[IntForm | None]
    opset: int
    int_form: IntForm | None = None

    def f(self, i: int) -> np.ndarray:
        """Input i as float64."""
        return np.asarray(self.ins[i], dtype=np.float64)

    def has(self, i: int) -> bool:
        return i < len(self.ins) and self.ins[i] is not None

    def ints(self, i: int) -> list[int]:
        """Input i (a shape, axes or pads tensor) as Python ints."""
        return [int(v) for v in np.asarray(self.ins[i]).reshape(-1)]


Op = Callable[[_Node], list[Any]]
_OPS: dict[str, Op] = {}


def _op(*names: str) -> Callable[[Op], Op]:
    def register(fn: Op) -> Op:
        for n in names:
            _OPS[n] = fn
        return fn

    return register


def _along(scale: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    """A per-axis scale (or zero point) shaped to broadcast along `axis` of an ndim tensor."""
    if scale.size == 1:
        return scale.reshape(())
    shape = [1] * ndim
    shape[axis % ndim] = -1
    return scale.reshape(shape)


@_op("DequantizeLinear")
def _dequantize(n: _Node) -> list[Any]:
    q = np.asarray(n.ins[0])
    scale = n.f(1)
    zp = np.asarray(n.ins[2]).astype(np.float64) if n.has(2) else np.zeros(())
    axis = int(n.attrs.get("axis", 1)) % max(q.ndim, 1)
    ints = q.astype(np.float64) - _along(zp, axis, q.ndim)
    n.int_form = IntForm(ints, scale.reshape(-1) if scale.size > 1 else scale.reshape(()), axis)
    return [ints * _along(scale, axis, q.ndim)]


@_op("QuantizeLinear")
def _quantize(n: _Node) -> list[Any]:
    # The graph's float tensors are float32: the exact value is rounded once to float32, then divided by the
    # float32 scale in float32 (IEEE division is correctly rounded, so this is the same on every CPU, and it
    # is what the ONNX reference implementation and onnxruntime compute). It matters: ties are common. An
    # input preprocessed as (p - 127.5) / 127.5 and calibrated to [-1, 1] gets scale 2/255, so x / scale
    # is k + 0.5 for every pixel, and float64 division would break those ties differently.
    x = np.asarray(n.ins[0]).astype(np.float32)
    scale = np.asarray(n.ins[1]).astype(np.float32)
    zp_arr = np.asarray(n.ins[2]) if n.has(2) else np.zeros((), np.uint8)
    axis = int(n.attrs.get("axis", 1)) % max(x.ndim, 1)
    info = np.iinfo(zp_arr.dtype)
    q = np.rint(x / _along(scale, axis, x.ndim)).astype(np.float64) + _along(zp_arr.astype(np.float64), axis, x.ndim)
    return [np.clip(q, info.min, info.max).astype(zp_arr.dtype)]


def _conv_windows(x: np.ndarray, kernel: tuple[int, ...], n: _Node, pad_value: float = 0.0) -> np.ndarray:
    """[N, C, OH, OW, KH, KW] windows of x (2-D convolution or pooling), padded with `pad_value`."""
    nd = len(kernel)
    strides = list(n.attrs.get("strides", [1] * nd))
    dil = list(n.attrs.get("dilations", [1] * nd))
    pads = list(n.attrs.get("pads", [0] * (2 * nd)))
    auto = n.attrs.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        for d in range(nd):
            size = x.shape[2 + d]
            out = -(-size // strides[d])
            total = max(0, (out - 1) * strides[d] + (kernel[d] - 1) * dil[d] + 1 - size)
            small, big = total // 2, total - total // 2
            pads[d], pads[d + nd] = (small, big) if auto == "SAME_UPPER" else (big, small)
    elif auto == "VALID":
        pads = [0] * (2 * nd)
    if n.attrs.get("ceil_mode", 0):
        raise ModelError(f"the exact INT8 reference does not support ceil_mode (node {n.node.name})")
    width = [(k - 1) * d + 1 for k, d in zip(kernel, dil, strict=True)]
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pads[d], pads[d + nd]) for d in range(nd)], constant_values=pad_value)
    w = sliding_window_view(xp, width, axis=tuple(range(2, 2 + nd)))
    index = (slice(None), slice(None), *[slice(None, None, s) for s in strides], *[slice(None, None, d) for d in dil])
    return np.asarray(w[index])


def _conv_sum(x: np.ndarray, w: np.ndarray, n: _Node) -> np.ndarray:
    """Convolution of float64 arrays (exact when both hold integers): [N, K, OH, OW]."""
    if x.ndim != 4:
        raise ModelError(f"the exact INT8 reference handles 2-D convolutions only (node {n.node.name})")
    groups = int(n.attrs.get("group", 1))
    win = _conv_windows(x, tuple(w.shape[2:]), n)  # N C OH OW KH KW
    nb, c, oh, ow = win.shape[:4]
    k = w.shape[0]
    if groups == 1:
        return np.asarray(np.tensordot(win, w, axes=([1, 4, 5], [1, 2, 3])).transpose(0, 3, 1, 2))
    if groups == c and k == c:  # depthwise: one multiply-add per kernel tap
        out = np.zeros((nb, c, oh, ow))
        for i, j in np.ndindex(*w.shape[2:]):
            out += win[..., i, j] * w[:, 0, i, j].reshape(1, c, 1, 1)
        return out
    win_g = win.reshape(nb, groups, c // groups, oh, ow, *win.shape[4:])
    w_g = w.reshape(groups, k // groups, *w.shape[1:])
    return np.asarray(np.einsum("ngchwij,gkcij->ngkhw", win_g, w_g)).reshape(nb, k, oh, ow)


def _integer_pair(n: _Node, act: int, weight: int, weight_axis: int) -> tuple[IntForm, IntForm] | None:
    """Both operands dequantized, the activation per tensor and the weight per tensor or along `weight_axis`."""
    a, w = n.int_forms[act], n.int_forms[weight]
    if a is None or w is None or not a.per_tensor:
        return None
    if not w.per_tensor and w.axis != weight_axis % w.ints.ndim:
        return None
    return a, w


@_op("Conv")
def _conv(n: _Node) -> list[Any]:
    pair = _integer_pair(n, 0, 1, 0)
    if pair is None:
        y = _conv_sum(n.f(0), n.f(1), n)
    else:
        a, w = pair
        y = _conv_sum(a.ints, w.ints, n) * (a.scale * _along(w.scale, 1, 4))
    if n.has(2):
        y = y + n.f(2).reshape(1, -1, 1, 1)
    return [y]


@_op("MatMul")
def _matmul(n: _Node) -> list[Any]:
    pair = _integer_pair(n, 0, 1, -1)
    if pair is None:
        return [np.matmul(n.f(0), n.f(1))]
    a, w = pair
    return [np.matmul(a.ints, w.ints) * (a.scale * w.scale)]


@_op("Gemm")
def _gemm(n: _Node) -> list[Any]:
    ta, tb = int(n.attrs.get("transA", 0)), int(n.attrs.get("transB", 0))
    alpha, beta = float(n.attrs.get("alpha", 1.0)), float(n.attrs.get("beta", 1.0))
    pair = _integer_pair(n, 0, 1, 0 if tb else 1)
    if pair is None:
        a, b = n.f(0), n.f(1)
        y = (a.T if ta else a) @ (b.T if tb else b)
    else:
        ai, wi = pair
        y = ((ai.ints.T if ta else ai.ints) @ (wi.ints.T if tb else wi.ints)) * (ai.scale * wi.scale)
    y = alpha * y
    return [y + beta * n.f(2) if n.has(2) else y]


def _pool(n: _Node, reduce: Callable[[np.ndarray], np.ndarray], pad_value: float) -> np.ndarray:
    return reduce(_conv_windows(n.f(0), tuple(n.attrs["kernel_shape"]), n, pad_value))


@_op("MaxPool")
def _maxpool(n: _Node) -> list[Any]:
    return [_pool(n, lambda w: w.max(axis=(-2, -1)), -np.inf)]


@_op("AveragePool")
def _avgpool(n: _Node) -> list[Any]:
    total = _pool(n, lambda w: w.sum(axis=(-2, -1)), 0.0)
    if n.attrs.get("count_include_pad", 0):
        return [total / float(np.prod(n.attrs["kernel_shape"]))]
    ones = np.ones((1, 1, *n.f(0).shape[2:]))
    counts = _conv_windows(ones, tuple(n.attrs["kernel_shape"]), n).sum(axis=(-2, -1))
    return [total / counts]


@_op("GlobalAveragePool")
def _gap(n: _Node) -> list[Any]:
    x = n.f(0)
    return [x.mean(axis=tuple(range(2, x.ndim)), keepdims=True)]


@_op("GlobalMaxPool")
def _gmp(n: _Node) -> list[Any]:
    x = n.f(0)
    return [x.max(axis=tuple(range(2, x.ndim)), keepdims=True)]


_ELEMENTWISE: dict[str, Callable[..., np.ndarray]] = {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Div": np.divide,
    "Relu": lambda x: np.maximum(x, 0.0),
    "Sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "Tanh": np.tanh,
    "Sqrt": np.sqrt,
    "Exp": np.exp,
    "Neg": np.negative,
    "Abs": np.abs,
}


@_op("Min", "Max")
def _min_max(n: _Node) -> list[Any]:
    fn = np.minimum if n.node.op_type == "Min" else np.maximum
    out = n.f(0)
    for i in range(1, len(n.ins)):
        out = fn(out, n.f(i))
    return [out]


@_op(*_ELEMENTWISE)
def _elementwise(n: _Node) -> list[Any]:
    return [_ELEMENTWISE[n.node.op_type](*[n.f(i) for i in range(len(n.ins))])]


@_op("Clip")
def _clip(n: _Node) -> list[Any]:
    lo = n.f(1) if n.has(1) else n.attrs.get("min", -np.inf)
    hi = n.f(2) if n.has(2) else n.attrs.get("max", np.inf)
    return [np.clip(n.f(0), lo, hi)]


@_op("LeakyRelu")
def _leaky(n: _Node) -> list[Any]:
    x = n.f(0)
    return [np.where(x >= 0, x, x * float(n.attrs.get("alpha", 0.01)))]


@_op("HardSigmoid")
def _hardsigmoid(n: _Node) -> list[Any]:
    a, b = float(n.attrs.get("alpha", 0.2)), float(n.attrs.get("beta", 0.5))
    return [np.clip(a * n.f(0) + b, 0.0, 1.0)]


@_op("HardSwish")
def _hardswish(n: _Node) -> list[Any]:
    x = n.f(0)
    return [x * np.clip(x / 6.0 + 0.5, 0.0, 1.0)]


@_op("Softmax")
def _softmax(n: _Node) -> list[Any]:
    x = n.f(0)
    axis = int(n.attrs.get("axis", -1 if n.opset >= 13 else 1))
    if n.opset < 13:  # opset < 13: softmax over the flattened trailing dimensions
        flat = x.reshape(int(np.prod(x.shape[: axis % x.ndim])), -1)
        e = np.exp(flat - flat.max(axis=1, keepdims=True))
        return [(e / e.sum(axis=1, keepdims=True)).reshape(x.shape)]
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return [e / e.sum(axis=axis, keepdims=True)]


@_op("Identity", "Dropout")
def _identity(n: _Node) -> list[Any]:
    return [n.ins[0]]


@_op("Constant")
def _constant(n: _Node) -> list[Any]:
    return [numpy_helper.to_array(n.attrs["value"])]


@_op("Cast")
def _cast(n: _Node) -> list[Any]:
    to = onnx.helper.tensor_dtype_to_np_dtype(int(n.attrs["to"]))
    return [np.asarray(n.ins[0]).astype(np.float64 if np.issubdtype(to, np.floating) else to)]


@_op("Shape")
def _shape(n: _Node) -> list[Any]:
    return [np.array(np.asarray(n.ins[0]).shape, dtype=np.int64)]


@_op("Gather")
def _gather(n: _Node) -> list[Any]:
    return [np.take(np.asarray(n.ins[0]), np.asarray(n.ins[1]), axis=int(n.attrs.get("axis", 0)))]


@_op("Reshape")
def _reshape(n: _Node) -> list[Any]:
    x = np.asarray(n.ins[0])
    shape = [x.shape[i] if d == 0 and not n.attrs.get("allowzero", 0) else d for i, d in enumerate(n.ints(1))]
    return [x.reshape(shape)]


@_op("Flatten")
def _flatten(n: _Node) -> list[Any]:
    x = np.asarray(n.ins[0])
    axis = int(n.attrs.get("axis", 1)) % max(x.ndim, 1) if x.ndim else 0
    return [x.reshape(int(np.prod(x.shape[:axis])), -1)]


def _axes(n: _Node) -> list[int] | None:
    if n.has(1):
        return n.ints(1)
    return list(n.attrs["axes"]) if "axes" in n.attrs else None


@_op("Squeeze")
def _squeeze(n: _Node) -> list[Any]:
    axes = _axes(n)
    x = np.asarray(n.ins[0])
    return [np.squeeze(x) if axes is None else np.squeeze(x, axis=tuple(axes))]


@_op("Unsqueeze")
def _unsqueeze(n: _Node) -> list[Any]:
    return [np.expand_dims(np.asarray(n.ins[0]), tuple(_axes(n) or []))]


@_op("Transpose")
def _transpose(n: _Node) -> list[Any]:
    perm = n.attrs.get("perm")
    return [np.transpose(np.asarray(n.ins[0]), perm)]


@_op("Concat")
def _concat(n: _Node) -> list[Any]:
    return [np.concatenate([np.asarray(v) for v in n.ins if v is not None], axis=int(n.attrs["axis"]))]


@_op("Pad")
def _pad(n: _Node) -> list[Any]:
    mode = n.attrs.get("mode", b"constant")
    if (mode.decode() if isinstance(mode, bytes) else mode) != "constant":
        raise ModelError(f"the exact INT8 reference supports constant Pad only (node {n.node.name})")
    x = n.f(0)
    pads = n.ints(1) if n.has(1) else list(n.attrs["pads"])
    value = float(n.f(2).reshape(-1)[0]) if n.has(2) else float(n.attrs.get("value", 0.0))
    half = len(pads) // 2
    return [np.pad(x, list(zip(pads[:half], pads[half:], strict=True)), constant_values=value)]


@_op("ReduceMean")
def _reduce_mean(n: _Node) -> list[Any]:
    axes = _axes(n)
    keep = bool(n.attrs.get("keepdims", 1))
    return [n.f(0).mean(axis=None if axes is None else tuple(axes), keepdims=keep)]


@_op("BatchNormalization")
def _batchnorm(n: _Node) -> list[Any]:
    x, scale, bias, mean, var = (n.f(i) for i in range(5))
    eps = float(n.attrs.get("epsilon", 1e-5))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    inv = scale / np.sqrt(var + eps)
    return [(x - mean.reshape(shape)) * inv.reshape(shape) + bias.reshape(shape)]


def reference_outputs(model: onnx.ModelProto, inputs: np.ndarray) -> list[np.ndarray]:
    """The exact outputs of `model` for `inputs` fed to its first input, 16 samples at a time."""
    ref = QdqReference(model)
    chunks = [ref.run({ref.inputs[0]: inputs[i : i + 16]}) for i in range(0, len(inputs), 16)]
    return [np.concatenate([c[k] for c in chunks]) for k in range(len(chunks[0]))] if chunks else []

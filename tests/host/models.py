"""Small models built in the tests (ONNX graphs and Relax modules) and the CPU reference that runs them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm import relax

ZP = -128  # a ReLU output's zero point (uint8 0) in the signed activations of CUDA builds


def pool_model(shape: tuple[int, ...], layout: str, dtype: str = "int8") -> Any:
    """ResNet's 3x3 stride-2 max pooling as a Relax module (also test_cuda_source's)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            pooled = relax.op.nn.max_pool2d(x, pool_size=(3, 3), strides=(2, 2), padding=(1, 1, 1, 1), layout=layout)
            out = bb.emit_output(bb.emit(pooled))
        bb.emit_func_output(out)
    return bb.get()


def pointwise_then_depthwise(batch: int) -> Any:
    """MobileNet's pair in NCHW as int8_rewrite emits it: a 1x1 int8 convolution with a requantizing epilogue,
    then pad(ZP) with a stride-2 layer's asymmetric (0, 1) pad and a 3x3 stride-2 depthwise convolution.
    Left alone, FuseOps fuses that pad into the 1x1 convolution's epilogue."""
    rng = np.random.default_rng(2)
    c_in, c = 32, 64
    w1 = rng.integers(-127, 128, (c, c_in, 1, 1)).astype("int8")
    wd = rng.integers(-127, 128, (c, 1, 3, 3)).astype("int8")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((batch, c_in, 14, 14), "int8"))

    def requantize(acc: Any) -> Any:
        y = relax.op.round(relax.op.multiply(relax.op.astype(acc, "float32"), relax.const(1e-3)))
        return bb.emit(relax.op.astype(relax.op.clip(y, -128, 127), "int8"))

    with bb.function("main", [x]):
        with bb.dataflow():
            pw = requantize(bb.emit(relax.op.nn.conv2d(x, relax.const(w1), out_dtype="int32")))
            p = bb.emit(relax.op.nn.pad(pw, [0, 0, 0, 0, 0, 1, 0, 1], pad_value=float(ZP)))
            dw = relax.op.nn.conv2d(p, relax.const(wd), strides=[2, 2], groups=c, out_dtype="int32")
            out = bb.emit_output(requantize(bb.emit(dw)))
        bb.emit_func_output(out)
    return bb.get()


def int8_conv_model(
    batch: int, channels: int, size: int, scales: tuple[float, float] = (1e-3, 0.5), pad: int = 0
) -> object:
    """3x3 int8 convolution (NHWC/OHWI, int32 accumulation) whose epilogue requantizes and adds a residual
    (dequantized from another input), as int8_rewrite emits for a ResNet block; `scales`: the requantize's
    and the residual's, scalars as a per-tensor calibration gives them. `pad` 1: the convolution pads its
    input (as the model's do) instead of taking it padded."""
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((batch, size + 2 - 2 * pad, size + 2 - 2 * pad, channels), "int8"))
    r = relax.Var("r", relax.TensorType((batch, size, size, channels), "int8"))
    w = rng.integers(-127, 128, (channels, 3, 3, channels)).astype("int8")
    with bb.function("main", [x, r]):
        with bb.dataflow():
            acc = bb.emit(
                relax.op.nn.conv2d(
                    x,
                    relax.const(w),
                    padding=pad,
                    data_layout="NHWC",
                    kernel_layout="OHWI",
                    out_layout="NHWC",
                    out_dtype="int32",
                )
            )
            f = relax.op.multiply(relax.op.astype(acc, "float32"), relax.const(np.float32(scales[0])))
            res = relax.op.dequantize(r, relax.const(np.float32(scales[1])), relax.const(3, "int8"), axis=3)
            y = bb.emit(relax.op.astype(relax.op.clip(relax.op.round(relax.op.add(f, res)), -128, 127), "int8"))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def convnet(path: Path, width: int = 32, downsample: bool = False) -> Path:
    """A small ResNet-like block in ONNX: 3x3 stem, 3x3 conv, 1x1 conv with a residual add, pooling and
    a classifier; channel counts are multiples of 16, so every convolution fits the tensor cores. With
    `downsample`, a basic block with a downsampling shortcut instead: two 3x3 convolutions (the first stride 2,
    twice the channels) beside a 1x1 stride-2 shortcut, then the add and its ReLU."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    inits, nodes = [], []

    def conv(name: str, x: str, cin: int, cout: int, k: int, stride: int = 1, relu: bool = True) -> str:
        w = (rng.standard_normal((cout, cin, k, k)) * (2.0 / (cin * k * k)) ** 0.5).astype(np.float32)
        b = (rng.standard_normal(cout) * 0.1).astype(np.float32)
        inits.extend([numpy_helper.from_array(w, f"{name}.w"), numpy_helper.from_array(b, f"{name}.b")])
        ins = [x, f"{name}.w", f"{name}.b"]
        attrs = {"pads": [k // 2] * 4} | ({"strides": [stride, stride]} if stride > 1 else {})
        nodes.append(helper.make_node("Conv", ins, [f"{name}.y"], name=name, **attrs))
        if not relu:
            return f"{name}.y"
        nodes.append(helper.make_node("Relu", [f"{name}.y"], [f"{name}.r"]))
        return f"{name}.r"

    h = conv("stem", "x", 3, width, 3)
    if downsample:
        main = conv("c2", conv("c1", h, width, 2 * width, 3, stride=2), 2 * width, 2 * width, 3, relu=False)
        shortcut = conv("down", h, width, 2 * width, 1, stride=2, relu=False)
        nodes.append(helper.make_node("Add", [main, shortcut], ["sum"]))
        nodes.append(helper.make_node("Relu", ["sum"], ["res"]))
        width *= 2
    else:
        h2 = conv("c1", h, width, width, 3)
        h3 = conv("c2", h2, width, width, 1)
        nodes.append(helper.make_node("Add", [h, h3], ["res"]))
    nodes.append(helper.make_node("GlobalAveragePool", ["res"], ["gap"]))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"]))
    inits.append(numpy_helper.from_array(rng.standard_normal((width, 10)).astype(np.float32), "fc.w"))
    nodes.append(helper.make_node("MatMul", ["flat", "fc.w"], ["y"], name="fc"))
    graph = helper.make_graph(
        nodes,
        "convnet",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


def float_and_int8_modules(model: Any, calib: np.ndarray) -> tuple[Any, Any, Any]:
    """An ONNX model's float Relax module, and its QDQ model (calibrated on `calib`) rewritten to integer
    ops, both for batch 1: (fp32 module, int8 module, int8_rewrite's report)."""
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    from edgedeploy.compile.int8.quantize import QuantizeOptions, quantizable_layers, quantize_qdq
    from edgedeploy.compile.int8.rewrite import rewrite_int8

    qdq = quantize_qdq(model, calib, QuantizeOptions(samples=len(calib))).model
    shape = {"x": [1, *calib.shape[1:]]}
    fp32 = relax.transform.DecomposeOpsForInference()(from_onnx(model, shape, keep_params_in_input=False))
    qdq_mod = relax.transform.DecomposeOpsForInference()(from_onnx(qdq, shape, keep_params_in_input=False))
    int8, report = rewrite_int8(qdq_mod, quantizable_layers(qdq))
    return fp32, int8, report


def run_on_cpu(mod: Any, inputs: np.ndarray) -> np.ndarray:
    """The module compiled for llvm, run on each input (batch 1), outputs concatenated."""
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return np.concatenate([vm["main"](tvm.runtime.tensor(x[None])).numpy() for x in inputs])

"""A ResNet-18-shaped ONNX model (BN folded into the conv biases, opset 13, dynamic batch) with random
weights, for speed measurements only. Every weight tensor repeats one small random block, so bundles
and kits compress to a few MB (the transfer to the GPU machine carries at most 64 MiB).

    .venv/bin/python bench/resnet18_onnx.py resnet18.onnx
"""

from __future__ import annotations

import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

BLOCK = np.random.default_rng(18).standard_normal(4093).astype(np.float32)  # prime length: no aliasing


def _weights(shape: tuple[int, ...], fan_in: int) -> np.ndarray:
    n = int(np.prod(shape))
    reps = -(-n // BLOCK.size)
    result: np.ndarray = (np.tile(BLOCK, reps)[:n] * (2.0 / fan_in) ** 0.5).reshape(shape)
    return result


def resnet18(classes: int = 1000) -> onnx.ModelProto:
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []

    def conv(x: str, cin: int, cout: int, k: int, stride: int, relu: bool, name: str) -> str:
        inits.append(numpy_helper.from_array(_weights((cout, cin, k, k), cin * k * k), f"{name}.w"))
        inits.append(numpy_helper.from_array(np.full(cout, 0.01, np.float32), f"{name}.b"))
        attrs = {"kernel_shape": [k, k], "strides": [stride, stride], "pads": [k // 2] * 4}
        nodes.append(helper.make_node("Conv", [x, f"{name}.w", f"{name}.b"], [f"{name}.y"], name=name, **attrs))
        if not relu:
            return f"{name}.y"
        nodes.append(helper.make_node("Relu", [f"{name}.y"], [f"{name}.r"]))
        return f"{name}.r"

    x = conv("input", 3, 64, 7, 2, True, "conv1")
    nodes.append(helper.make_node("MaxPool", [x], ["pool"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
    x, cin = "pool", 64
    for stage, cout in enumerate((64, 128, 256, 512), start=1):
        for blk in range(2):
            stride = 2 if stage > 1 and blk == 0 else 1
            name = f"layer{stage}.{blk}"
            h = conv(x, cin, cout, 3, stride, True, f"{name}.conv1")
            h = conv(h, cout, cout, 3, 1, False, f"{name}.conv2")
            short = conv(x, cin, cout, 1, stride, False, f"{name}.down") if stride != 1 or cin != cout else x
            nodes.append(helper.make_node("Add", [h, short], [f"{name}.sum"]))
            nodes.append(helper.make_node("Relu", [f"{name}.sum"], [f"{name}.out"]))
            x, cin = f"{name}.out", cout
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"]))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"]))
    inits.append(numpy_helper.from_array(_weights((classes, 512), 512), "fc.w"))
    inits.append(numpy_helper.from_array(np.zeros(classes, np.float32), "fc.b"))
    nodes.append(helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["logits"], name="fc", transB=1))
    graph = helper.make_graph(
        nodes,
        "resnet18",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 224, 224])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    return model


if __name__ == "__main__":
    onnx.save(resnet18(), sys.argv[1] if len(sys.argv) > 1 else "resnet18.onnx")

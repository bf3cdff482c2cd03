"""Run an ONNX graph with PyTorch ops: the same model, weights and arithmetic as the bundle, so
PyTorch eager and torch.compile are measured on exactly what edgedeploy compiles.

Covers the operators of the models in ../shared/data (Conv incl. grouped and asymmetric padding,
Clip, Relu, Add, MatMul, Gemm, Max/AveragePool, Flatten, Reshape, Softmax).
"""

from __future__ import annotations

from typing import Any

import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _same_pads(kernel: list[int], x: torch.Tensor, strides: list[int]) -> list[int]:
    pads = []
    for k, s, n in zip(kernel, strides, x.shape[2:], strict=True):
        total = max((-(-n // s) - 1) * s + k - n, 0)
        pads.append((total // 2, total - total // 2))
    return [v for pair in pads for v in pair]  # [top, bottom, left, right]


class OnnxModule(torch.nn.Module):
    def __init__(self, path: str) -> None:
        super().__init__()
        model = onnx.load(path)
        self.nodes = list(model.graph.node)
        self.input_name = next(
            i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}
        )
        self.output_name = model.graph.output[0].name
        self._names: dict[str, str] = {}
        consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        for i, (name, value) in enumerate(consts.items()):
            self.register_buffer(f"w{i}", torch.from_numpy(value.copy()))
            self._names[name] = f"w{i}"
        # scalars and shapes as Python values, so torch.compile sees no data-dependent control flow
        self._py = {name: value.tolist() for name, value in consts.items() if value.size <= 8}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        env: dict[str, torch.Tensor] = {self.input_name: x}

        def get(name: str) -> torch.Tensor:
            return env[name] if name in env else getattr(self, self._names[name])

        for n in self.nodes:
            a, ins = _attrs(n), [get(i) for i in n.input if i]
            op = n.op_type
            if op == "Conv":
                x_, w = ins[0], ins[1]
                k, s = list(a.get("kernel_shape", w.shape[2:])), list(a.get("strides", [1, 1]))
                if a.get("auto_pad", b"NOTSET") in (b"SAME_UPPER", "SAME_UPPER"):
                    t, b, l_, r = _same_pads(k, x_, s)
                else:
                    t, l_, b, r = a.get("pads", [0, 0, 0, 0])
                if (t, l_) != (b, r):
                    x_, t, l_ = F.pad(x_, (l_, r, t, b)), 0, 0
                y = F.conv2d(
                    x_, w, ins[2] if len(ins) > 2 else None, s, (t, l_), a.get("dilations", [1, 1]), a.get("group", 1)
                )
            elif op == "Clip":
                y = torch.clamp(ins[0], float(self._py[n.input[1]]), float(self._py[n.input[2]]))
            elif op == "Relu":
                y = F.relu(ins[0])
            elif op == "Add":
                y = ins[0] + ins[1]
            elif op == "MatMul":
                y = ins[0] @ ins[1]
            elif op == "Gemm":
                y = F.linear(ins[0], ins[1] if a.get("transB", 0) else ins[1].t(), ins[2] if len(ins) > 2 else None)
            elif op in ("MaxPool", "AveragePool"):
                pool = F.max_pool2d if op == "MaxPool" else F.avg_pool2d
                p = a.get("pads", [0, 0, 0, 0])
                y = pool(ins[0], a["kernel_shape"], a.get("strides", a["kernel_shape"]), (p[0], p[1]))
            elif op == "Flatten":
                y = torch.flatten(ins[0], a.get("axis", 1))
            elif op == "Reshape":
                shape = self._py[n.input[1]]
                y = torch.reshape(ins[0], [int(v) if v != 0 else ins[0].shape[i] for i, v in enumerate(shape)])
            elif op == "Softmax":
                y = torch.softmax(ins[0], a.get("axis", -1))
            else:
                raise NotImplementedError(op)
            env[n.output[0]] = y
        return env[self.output_name]

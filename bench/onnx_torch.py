"""Run an ONNX graph with PyTorch ops: the same model, weights and arithmetic as the bundle, so
PyTorch eager and torch.compile are measured on exactly what edgedeploy compiles.

Everything ONNX is read in `__init__`: attributes, Clip bounds, Reshape shapes and Gemm flags become
plain Python ints/floats/tuples in `self.steps`, weights become buffers. `forward` only walks that list
and calls torch functions, so dynamo traces it into ONE graph: `torch.compile(m, fullgraph=True)`
raises on a graph break instead of silently running op by op (issue 12: the earlier peer read
attributes with `onnx.helper.get_attribute_value` inside `forward` and torch.compile ran slower than
eager). An operator or attribute this module does not cover raises NotImplementedError in `__init__`.

Covers the operators of ../shared/data's models and of bench/resnet18_onnx.py: Conv (grouped,
asymmetric padding, auto_pad SAME_UPPER), BatchNormalization, Clip, Relu, Add, MatMul, Gemm,
Max/AveragePool, GlobalAveragePool, Flatten, Reshape, Softmax, Identity, Constant.
"""

from __future__ import annotations

import math
from typing import Any

import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper

_IN, _BUF = 0, 1  # where a step's input comes from: the running values, or a registered buffer


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    out = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


def _same_upper_pads(kernel: list[int], size: list[int], strides: list[int]) -> list[int]:
    """ONNX pads [top, left, bottom, right] for auto_pad=SAME_UPPER at a static input size."""
    begin, end = [], []
    for k, s, n in zip(kernel, strides, size, strict=True):
        total = max((-(-n // s) - 1) * s + k - n, 0)
        begin.append(total // 2)
        end.append(total - total // 2)
    return begin + end


class OnnxModule(torch.nn.Module):
    """`OnnxModule(path)(x)` computes the ONNX graph's first output. `input_hw` is needed only for
    Conv nodes with auto_pad=SAME_UPPER (their padding depends on the input size)."""

    def __init__(self, path: str, input_hw: tuple[int, int] | None = None) -> None:
        super().__init__()
        model = onnx.load(path)
        graph = model.graph
        inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        self.input_name = next(i.name for i in graph.input if i.name not in inits)
        self.output_name = graph.output[0].name
        buffers: dict[str, str] = {}
        py: dict[str, list[Any]] = {}  # small constants (Clip bounds, shapes) as Python values

        def add_const(name: str, value: Any) -> None:
            buffers[name] = f"w{len(buffers)}"
            self.register_buffer(buffers[name], torch.from_numpy(value.copy()))
            if value.size <= 8:
                py[name] = value.reshape(-1).tolist()

        for name, value in inits.items():
            add_const(name, value)
        self.steps: list[tuple[str, tuple[tuple[int, str], ...], str, tuple[Any, ...]]] = []
        for n in graph.node:
            a = _attrs(n)
            if n.op_type == "Constant":
                add_const(n.output[0], numpy_helper.to_array(a["value"]))
                continue
            ins = tuple((_BUF, buffers[i]) if i in buffers else (_IN, i) for i in n.input if i)
            self.steps.append((n.op_type, ins, n.output[0], self._params(n, a, py, inits, input_hw)))

    @staticmethod
    def _params(
        n: onnx.NodeProto, a: dict[str, Any], py: dict[str, list[Any]], inits: dict[str, Any], hw: Any
    ) -> tuple[Any, ...]:
        """The node's attributes as a tuple of Python values, in the order `forward` uses them."""
        op = n.op_type
        if op == "Conv":
            w = inits[n.input[1]]
            k = list(a.get("kernel_shape", w.shape[2:]))
            s = list(a.get("strides", [1, 1]))
            auto = a.get("auto_pad", "NOTSET")
            if auto == "SAME_UPPER":
                if hw is None:
                    raise NotImplementedError(f"{n.name}: auto_pad SAME_UPPER needs input_hw")
                pads = _same_upper_pads(k, list(hw), s)  # exact for the first layer only; fine for these models
            elif auto in ("NOTSET", "VALID"):
                pads = list(a.get("pads", [0, 0, 0, 0]))
            else:
                raise NotImplementedError(f"{n.name}: auto_pad {auto}")
            t, l_, b, r = pads
            pre_pad = (l_, r, t, b) if (t, l_) != (b, r) else None  # asymmetric: F.pad first
            padding = (0, 0) if pre_pad else (t, l_)
            return (pre_pad, tuple(s), padding, tuple(a.get("dilations", [1, 1])), int(a.get("group", 1)))
        if op == "Clip":
            if len(n.input) > 1:  # opset >= 11: bounds are inputs (initializers here)
                lo = float(py[n.input[1]][0]) if n.input[1] else None
                hi = float(py[n.input[2]][0]) if len(n.input) > 2 and n.input[2] else None
            else:
                lo, hi = a.get("min"), a.get("max")
            return (lo, hi)
        if op in ("MaxPool", "AveragePool"):
            k = tuple(a["kernel_shape"])
            p = list(a.get("pads", [0, 0, 0, 0]))
            if (p[0], p[1]) != (p[2], p[3]) or a.get("auto_pad", "NOTSET") != "NOTSET":
                raise NotImplementedError(f"{n.name}: asymmetric or automatic pooling pads {p}")
            extra = bool(a.get("count_include_pad", 0)) if op == "AveragePool" else None
            return (k, tuple(a.get("strides", k)), (p[0], p[1]), bool(a.get("ceil_mode", 0)), extra)
        if op == "Gemm":
            if a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0:
                raise NotImplementedError(f"{n.name}: Gemm with transA/alpha/beta")
            return (bool(a.get("transB", 0)),)
        if op == "BatchNormalization":
            return (float(a.get("epsilon", 1e-5)),)
        if op in ("Flatten", "Softmax"):
            return (int(a.get("axis", 1 if op == "Flatten" else -1)),)
        if op == "Reshape":
            return (tuple(int(v) for v in py[n.input[1]]),)
        if op in ("Relu", "Add", "MatMul", "GlobalAveragePool", "Identity"):
            if a:
                raise NotImplementedError(f"{n.name}: {op} attributes {sorted(a)}")
            return ()
        raise NotImplementedError(f"ONNX operator {op} ({n.name})")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        env: dict[str, torch.Tensor] = {self.input_name: x}
        for op, sources, out, p in self.steps:
            ins = [getattr(self, key) if where == _BUF else env[key] for where, key in sources]
            if op == "Conv":
                pre_pad, stride, padding, dilation, groups = p
                x_ = F.pad(ins[0], pre_pad) if pre_pad else ins[0]
                y = F.conv2d(x_, ins[1], ins[2] if len(ins) > 2 else None, stride, padding, dilation, groups)
            elif op == "BatchNormalization":
                y = F.batch_norm(ins[0], ins[3], ins[4], ins[1], ins[2], False, 0.0, p[0])
            elif op == "Clip":
                y = torch.clamp(ins[0], p[0], p[1])
            elif op == "Relu":
                y = F.relu(ins[0])
            elif op == "Add":
                y = ins[0] + ins[1]
            elif op == "MatMul":
                y = ins[0] @ ins[1]
            elif op == "Gemm":
                y = F.linear(ins[0], ins[1] if p[0] else ins[1].t(), ins[2] if len(ins) > 2 else None)
            elif op == "MaxPool":
                y = F.max_pool2d(ins[0], p[0], p[1], p[2], ceil_mode=p[3])
            elif op == "AveragePool":
                y = F.avg_pool2d(ins[0], p[0], p[1], p[2], ceil_mode=p[3], count_include_pad=p[4])
            elif op == "GlobalAveragePool":
                y = F.adaptive_avg_pool2d(ins[0], 1)
            elif op == "Flatten":
                y = torch.flatten(ins[0], 1) if p[0] == 1 else ins[0].reshape(math.prod(ins[0].shape[: p[0]]), -1)
            elif op == "Reshape":
                y = torch.reshape(ins[0], [v if v != 0 else ins[0].shape[i] for i, v in enumerate(p[0])])
            elif op == "Softmax":
                y = torch.softmax(ins[0], p[0])
            else:  # Identity
                y = ins[0]
            env[out] = y
        return env[self.output_name]

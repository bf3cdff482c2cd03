"""Float-graph clean-ups before quantization, so every weight is a plain initializer and every pad explicit.

- `Reshape(initializer, constant shape)` is folded into a new initializer: the quantizer then sees a
  weight (per-channel, symmetric) instead of an activation quantized at run time.
- `Conv` with `auto_pad=SAME_*` gets explicit `pads`, which the TVM importer keeps as conv padding
  (an explicit pad operator in front of the conv would hide the integer pattern).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference


def prepare_float_model(model: onnx.ModelProto) -> onnx.ModelProto:
    model = onnx.ModelProto.FromString(model.SerializeToString())
    _fold_constant_reshapes(model)
    _explicit_pads(model)
    return model


def _fold_constant_reshapes(model: onnx.ModelProto) -> None:
    inits = {t.name: t for t in model.graph.initializer}
    for node in list(model.graph.node):
        if node.op_type != "Reshape" or node.input[0] not in inits or node.input[1] not in inits:
            continue
        data = numpy_helper.to_array(inits[node.input[0]])
        shape = [int(d) for d in numpy_helper.to_array(inits[node.input[1]])]
        shape = [data.shape[i] if d == 0 else d for i, d in enumerate(shape)]
        model.graph.initializer.append(numpy_helper.from_array(data.reshape(shape), node.output[0]))
        model.graph.node.remove(node)
    used = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
    for t in list(model.graph.initializer):
        if t.name not in used:
            model.graph.initializer.remove(t)


def _explicit_pads(model: onnx.ModelProto) -> None:
    convs = [
        n for n in model.graph.node if n.op_type == "Conv" and _attr(n, "auto_pad") in (b"SAME_UPPER", b"SAME_LOWER")
    ]
    if not convs:
        return
    inferred = shape_inference.infer_shapes(model)
    shapes = {
        v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in list(inferred.graph.value_info) + list(inferred.graph.input)
    }
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in convs:
        in_shape, w = shapes.get(node.input[0]), inits.get(node.input[1])
        if in_shape is None or w is None or any(d <= 0 for d in in_shape[2:]):
            continue
        kernel = list(w.shape[2:])
        strides = list(_attr(node, "strides") or [1] * len(kernel))  # type: ignore[call-overload]
        dil = list(_attr(node, "dilations") or [1] * len(kernel))  # type: ignore[call-overload]
        begin, end = [], []
        for size, k, s, d in zip(in_shape[2:], kernel, strides, dil, strict=True):
            out = -(-size // s)
            total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
            small, big = total // 2, total - total // 2
            lower = _attr(node, "auto_pad") == b"SAME_LOWER"
            begin.append(big if lower else small)
            end.append(small if lower else big)
        for a in list(node.attribute):
            if a.name in ("auto_pad", "pads"):
                node.attribute.remove(a)
        node.attribute.append(helper.make_attribute("pads", [int(v) for v in np.concatenate([begin, end])]))


def _attr(node: onnx.NodeProto, name: str) -> object:
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return None

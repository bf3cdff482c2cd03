"""Graph transforms before calibration: cross-layer equalization and bias correction (Nagel et al. 2019).

Both work in numpy on the ONNX initializers and keep the float model's function. Equalization rescales
output channel c of conv1 by 1/s_c and input channel c of the next conv by s_c across a ReLU or ReLU6;
a ReLU6 (Clip 0..6) becomes Relu followed by Min with the per-channel bound 6/s_c, which is exact.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

Runner = Callable[[onnx.ModelProto, list[str]], list[np.ndarray]]


@dataclass
class _Pair:
    conv1: onnx.NodeProto
    act: onnx.NodeProto | None
    conv2: onnx.NodeProto


def _inits(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    return {t.name: t for t in model.graph.initializer}


def _group(node: onnx.NodeProto) -> int:
    return next((int(a.i) for a in node.attribute if a.name == "group"), 1)


def _scalar(model: onnx.ModelProto, name: str) -> float | None:
    init = _inits(model).get(name)
    if init is None:
        return None
    v = numpy_helper.to_array(init)
    return float(v) if v.size == 1 else None


def _equalizable_pairs(model: onnx.ModelProto) -> list[_Pair]:
    """conv -> (Relu | Clip(0, max)) -> conv chains where the middle tensor has one consumer."""
    inits = _inits(model)
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    outputs = {o.name for o in model.graph.output}
    pairs = []
    for n in model.graph.node:
        if n.op_type != "Conv" or len(n.input) < 2 or n.input[1] not in inits:
            continue
        nxt = consumers.get(n.output[0], [])
        if len(nxt) != 1 or n.output[0] in outputs:
            continue
        act: onnx.NodeProto | None = None
        if nxt[0].op_type in ("Relu", "Clip"):
            act = nxt[0]
            if act.op_type == "Clip" and (len(act.input) < 2 or _scalar(model, act.input[1]) != 0.0):
                continue
            after = consumers.get(act.output[0], [])
            if len(after) != 1 or act.output[0] in outputs:
                continue
            nxt = after
        conv2 = nxt[0]
        if conv2.op_type == "Conv" and len(conv2.input) >= 2 and conv2.input[1] in inits:
            g1, g2 = _group(n), _group(conv2)
            out1 = numpy_helper.to_array(inits[n.input[1]]).shape[0]
            if g2 == 1 or g2 == out1:  # plain or depthwise consumer; other grouped convs are left alone
                pairs.append(_Pair(n, act, conv2))
            del g1
    return pairs


def cross_layer_equalize(model: onnx.ModelProto, iterations: int = 4) -> tuple[onnx.ModelProto, int]:
    """Equalize weight ranges across conv->act->conv pairs; returns the new model and the pair count."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    pairs = _equalizable_pairs(model)
    if not pairs:
        return model, 0
    inits = _inits(model)
    weights = {t.name: numpy_helper.to_array(t).astype(np.float32) for t in model.graph.initializer}
    clip_bound: dict[str, np.ndarray] = {}  # act node name -> per-channel upper bound
    for pair in pairs:
        if pair.act is not None and pair.act.op_type == "Clip" and len(pair.act.input) > 2 and pair.act.input[2]:
            hi = _scalar(model, pair.act.input[2])
            out1 = weights[pair.conv1.input[1]].shape[0]
            clip_bound[pair.act.name or pair.act.output[0]] = np.full(
                out1, hi if hi is not None else np.inf, np.float32
            )
    for _ in range(iterations):
        for pair in pairs:
            w1, w2 = weights[pair.conv1.input[1]], weights[pair.conv2.input[1]]
            depthwise2 = _group(pair.conv2) == w1.shape[0] and _group(pair.conv2) > 1
            r1 = np.abs(w1.reshape(w1.shape[0], -1)).max(axis=1)
            w2_in = w2[:, 0] if depthwise2 else np.moveaxis(w2, 1, 0)  # [C, ...] per input channel
            r2 = np.abs(w2_in.reshape(w1.shape[0], -1)).max(axis=1)
            s = np.where((r1 > 0) & (r2 > 0), np.sqrt(r1 / np.maximum(r2, 1e-12)), 1.0).astype(np.float32)
            shape1 = (-1,) + (1,) * (w1.ndim - 1)
            weights[pair.conv1.input[1]] = w1 / s.reshape(shape1)
            if len(pair.conv1.input) > 2 and pair.conv1.input[2]:
                weights[pair.conv1.input[2]] = weights[pair.conv1.input[2]] / s
            if depthwise2:
                weights[pair.conv2.input[1]] = w2 * s.reshape(shape1)
            else:
                weights[pair.conv2.input[1]] = w2 * s.reshape((1, -1) + (1,) * (w2.ndim - 2))
            key = pair.act.name or pair.act.output[0] if pair.act is not None else ""
            if key in clip_bound:
                clip_bound[key] = clip_bound[key] / s
    for name, arr in weights.items():
        inits[name].CopyFrom(numpy_helper.from_array(arr.astype(np.float32), name))
    _replace_clips(model, pairs, clip_bound)
    return model, len(pairs)


def _replace_clips(model: onnx.ModelProto, pairs: list[_Pair], bounds: dict[str, np.ndarray]) -> None:
    """Clip(x, 0, hi) with per-channel hi: Relu then Min against a [1, C, 1, 1] constant."""
    for pair in pairs:
        act = pair.act
        if act is None or (act.name or act.output[0]) not in bounds:
            continue
        hi = bounds[act.name or act.output[0]]
        base = act.name or act.output[0]
        const = numpy_helper.from_array(hi.reshape(1, -1, 1, 1).astype(np.float32), f"{base}/channel_max")
        model.graph.initializer.append(const)
        relu_out = f"{base}/relu"
        idx = list(model.graph.node).index(act)
        relu = helper.make_node("Relu", [act.input[0]], [relu_out], name=f"{base}/Relu")
        mn = helper.make_node("Min", [relu_out, const.name], [act.output[0]], name=f"{base}/Min")
        model.graph.node.remove(act)
        model.graph.node.insert(idx, mn)
        model.graph.node.insert(idx, relu)


def correct_bias(
    model: onnx.ModelProto, run: Runner, skip: frozenset[str] = frozenset(), per_channel: bool = True
) -> onnx.ModelProto:
    """Bias correction for the weight rounding error: b += (W - W_int8) . E[x] per output channel.

    W_int8 is the symmetric per-channel int8 rounding the quantizer applies; E[x] is the per-channel mean
    of each conv input over the calibration data, from `run(model, tensor names)`.
    """
    model = onnx.ModelProto.FromString(model.SerializeToString())
    inits = _inits(model)
    convs = [
        n
        for n in model.graph.node
        if n.op_type == "Conv"
        and len(n.input) > 2
        and n.input[2] in inits
        and n.input[1] in inits
        and n.name not in skip
    ]
    if not convs:
        return model
    means = run(model, [n.input[0] for n in convs])
    for node, x in zip(convs, means, strict=True):
        ex = x.mean(axis=tuple(i for i in range(x.ndim) if i != 1)).astype(np.float32)
        w = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
        scale = np.abs(w.reshape(w.shape[0], -1)).max(axis=1) / 127.0
        scale = scale if per_channel else np.full_like(scale, scale.max())
        scale = np.where(scale > 0, scale, 1.0).reshape((-1,) + (1,) * (w.ndim - 1))
        err = w - np.clip(np.round(w / scale), -127, 127) * scale
        groups = _group(node)
        per_in = w.shape[1]
        ex_g = ex.reshape(groups, per_in)  # input means per group
        out_per_group = w.shape[0] // groups
        ex_o = np.repeat(ex_g, out_per_group, axis=0)  # [O, I/g]
        delta = (err.reshape(w.shape[0], per_in, -1).sum(axis=2) * ex_o).sum(axis=1)
        bias = numpy_helper.to_array(inits[node.input[2]]).astype(np.float32)
        inits[node.input[2]].CopyFrom(numpy_helper.from_array(bias + delta.astype(np.float32), node.input[2]))
    return model

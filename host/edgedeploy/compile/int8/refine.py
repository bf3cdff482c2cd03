"""Layer-wise refinement of a Q/DQ model: MSE-optimal activation clipping, learned weight rounding, bias correction.

Symmetric (TensorRT-kind) INT8 spends one of its 8 bits on the sign that a ReLU6 output never uses, so its
activations have half the resolution of the asymmetric kind. This pass recovers most of that loss without
labels and without changing the format (symmetric per-tensor activation scales, per-channel int8 weights,
int32 biases: still TensorRT explicit quantization); only scale values and the integer weights and biases
change:

1. **Activation ranges** (`mse_clip`): each ReLU/ReLU6 output (and the convolution output quantized just
   before it, which shares its scale) gets the symmetric scale that minimizes the mean squared quantization
   error over the calibration data, searched on a grid of clipping points below the observed maximum.
   Other tensors (the model input, the logits) keep their max range: clipping the largest logit changes the
   argmax.
2. **Learned rounding of the weights** (`adaround`, Nagel et al. 2020, as in Qualcomm's AIMET): layer by
   layer in graph order, each weight is rounded up or down (never further) so that the layer's output on
   its *quantized* input, from the already refined layers, best matches the float layer's output on its
   float input. The objective is quadratic in the weights, so it is written with the input covariances
   (`LayerStats`) and each step costs one small matrix product, whatever the number of pixels.
3. **Empirical bias correction**: the bias then absorbs the mean output error of that layer, per channel.

A layer keeps nearest rounding unless learned rounding lowers its reconstruction error on input windows it
was not fitted on (`held_out_gain`: fitted on the even calibration images and scored on the odd ones, and the
other way round), or when the calibration data has too few rows for its fan-in (the covariance would be
fitted, not estimated).
`refine_qdq` returns one `LayerChoice` per refined layer, which the build prints.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
from numpy.lib.stride_tricks import sliding_window_view
from onnx import numpy_helper

Runner = Callable[[onnx.ModelProto, np.ndarray, list[str]], list[np.ndarray]]
WINDOWS = 250_000  # input windows per layer for its statistics: fewer images for the large early layers
QMAX = 127  # symmetric int8: [-127, 127], as TensorRT and onnxruntime's symmetric weights use


@dataclass(frozen=True)
class LayerChoice:
    """What the refinement chose for one layer (a ReLU output's range, or a convolution's weights)."""

    layer: str
    what: str  # "range" or "weights"
    detail: str
    error_before: float  # mean squared error of the naive choice (max range / nearest rounding)
    error_after: float

    def line(self) -> str:
        gain = 0.0 if self.error_before == 0 else 100.0 * (1.0 - self.error_after / self.error_before)
        return f"{self.layer}: {self.detail} (error -{gain:.0f}%)" if gain > 0 else f"{self.layer}: {self.detail}"


def fake_quant(x: np.ndarray, scale: float) -> np.ndarray:
    return np.clip(np.rint(x / scale), -QMAX, QMAX) * scale


def mse_clip(values: np.ndarray, grid: int = 80) -> tuple[float, float, float]:
    """(scale, mse, mse at the max scale): the symmetric scale with the least quantization error on `values`."""
    x = values.reshape(-1).astype(np.float32)
    amax = float(np.abs(x).max()) if x.size else 0.0
    if amax == 0.0:
        return 1.0, 0.0, 0.0
    naive = float(np.mean((x - fake_quant(x, amax / QMAX)) ** 2))
    best, best_err = amax / QMAX, naive
    for clip in amax * np.linspace(0.2, 1.0, grid, endpoint=False):
        s = float(clip) / QMAX
        err = float(np.mean((x - fake_quant(x, s)) ** 2))
        if err < best_err:
            best, best_err = s, err
    return best, best_err, naive


@dataclass
class LayerStats:
    """Second moments of a convolution's input windows, per group: float (f) and quantized (q) input."""

    qq: np.ndarray  # [G, K, K]  E[xq xq^T]
    qf: np.ndarray  # [G, K, K]  E[xq xf^T]
    ff: np.ndarray  # [G, K, K]  E[xf xf^T]
    mq: np.ndarray  # [G, K]     E[xq]
    mf: np.ndarray  # [G, K]     E[xf]
    rows: int

    def centered(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return (
            self.qq - _outer(self.mq, self.mq),
            self.qf - _outer(self.mq, self.mf),
            self.ff - _outer(self.mf, self.mf),
        )


def merge_stats(a: LayerStats, b: LayerStats) -> LayerStats:
    """The moments of the union of two disjoint sets of input windows."""
    n = a.rows + b.rows
    mean = {k: (getattr(a, k) * a.rows + getattr(b, k) * b.rows) / n for k in ("qq", "qf", "ff", "mq", "mf")}
    return LayerStats(**mean, rows=n)


def _outer(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per-group outer products of [G, K] vectors: [G, K, K]."""
    return np.asarray(a[:, :, None] * b[:, None, :])


def conv_windows(x: np.ndarray, node: onnx.NodeProto, kernel: tuple[int, int], groups: int) -> np.ndarray:
    """im2col of an NCHW input for a 2-D convolution with explicit pads: [N*OH*OW, G, C/G*KH*KW]."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    strides = list(attrs.get("strides", [1, 1]))
    dil = list(attrs.get("dilations", [1, 1]))
    pads = list(attrs.get("pads", [0, 0, 0, 0]))
    xp = np.pad(x, [(0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])])
    width = [(k - 1) * d + 1 for k, d in zip(kernel, dil, strict=True)]
    w = sliding_window_view(xp, width, axis=(2, 3))[:, :, :: strides[0], :: strides[1], :: dil[0], :: dil[1]]
    n, c, oh, ow, kh, kw = w.shape
    return np.ascontiguousarray(w.transpose(0, 2, 3, 1, 4, 5)).reshape(n * oh * ow, groups, (c // groups) * kh * kw)


def layer_stats(
    xq: np.ndarray, xf: np.ndarray, node: onnx.NodeProto, kernel: tuple[int, int], groups: int
) -> LayerStats:
    """Accumulate the window moments image by image (a 112x112 depthwise layer has 1.6M windows per 128)."""
    acc: dict[str, np.ndarray] = {}
    rows = 0
    for i in range(len(xq)):
        cq = conv_windows(xq[i : i + 1].astype(np.float32), node, kernel, groups).transpose(1, 0, 2)  # G P K
        cf = conv_windows(xf[i : i + 1].astype(np.float32), node, kernel, groups).transpose(1, 0, 2)
        parts = {  # float32 products of one image's windows, summed in float64
            "qq": (cq.transpose(0, 2, 1) @ cq).astype(np.float64),
            "qf": (cq.transpose(0, 2, 1) @ cf).astype(np.float64),
            "ff": (cf.transpose(0, 2, 1) @ cf).astype(np.float64),
            "mq": cq.sum(axis=1, dtype=np.float64),
            "mf": cf.sum(axis=1, dtype=np.float64),
        }
        for k, v in parts.items():
            acc[k] = acc[k] + v if k in acc else v
        rows += cq.shape[1]
    return LayerStats(**{k: v / rows for k, v in acc.items()}, rows=rows)


def reconstruction_error(ws: np.ndarray, w: np.ndarray, cov: tuple[np.ndarray, np.ndarray, np.ndarray]) -> float:
    """E||ws·xq - w·xf||² after the best bias, per output: ws, w [G, O, K]."""
    qq, qf, ff = cov
    t = float((ws @ qq * ws).sum()) - 2 * float((ws @ qf * w).sum()) + float((w @ ff * w).sum())
    return t / float(w.shape[0] * w.shape[1])


def adaround(
    w: np.ndarray,
    scale: np.ndarray,
    cov: tuple[np.ndarray, np.ndarray, np.ndarray],
    iters: int = 400,
    lam: float = 0.01,
    lr: float = 0.05,
) -> np.ndarray:
    """Integer weights [G, O, K] for float weights w [G, O, K] and per-output scales [G, O, 1]: each weight
    rounds down or up, chosen by gradient descent on the reconstruction error with a rectified-sigmoid
    relaxation and a regularizer that anneals every choice to 0 or 1 (AdaRound)."""
    qq, qf, _ = cov
    base = np.floor(w / scale)
    rest = np.clip(w / scale - base, 0.0, 1.0)
    p = np.clip((rest + 0.1) / 1.2, 1e-4, 1 - 1e-4)
    v = np.log(p / (1 - p))
    target = w @ qf.transpose(0, 2, 1)  # [G, O, K]: the cross term's gradient
    norm = max(reconstruction_error(np.clip(np.rint(w / scale), -QMAX, QMAX) * scale, w, cov), 1e-30)
    norm *= w.shape[0] * w.shape[1]
    m, s2 = np.zeros_like(v), np.zeros_like(v)
    warm = int(0.2 * iters)
    for it in range(iters):
        sig = 1 / (1 + np.exp(-v))
        h = np.clip(sig * 1.2 - 0.1, 0, 1)
        ws = (base + h) * scale
        grad_ws = 2 * (ws @ qq - target) / norm
        dh = grad_ws * scale
        if it >= warm:
            beta = 20 + (2 - 20) * (it - warm) / max(iters - warm, 1)
            u = 2 * h - 1
            dh = dh + lam * (-beta * np.abs(u) ** (beta - 1) * np.sign(u) * 2) / h.size
        dv = dh * 1.2 * sig * (1 - sig) * ((sig * 1.2 - 0.1 > 0) & (sig * 1.2 - 0.1 < 1))
        m = 0.9 * m + 0.1 * dv
        s2 = 0.999 * s2 + 0.001 * dv * dv
        v -= lr * (m / (1 - 0.9 ** (it + 1))) / (np.sqrt(s2 / (1 - 0.999 ** (it + 1))) + 1e-8)
    h = np.clip(1 / (1 + np.exp(-v)) * 1.2 - 0.1, 0, 1)
    return np.asarray(np.clip(base + (h >= 0.5), -QMAX, QMAX))


def held_out_gain(
    w: np.ndarray, scale: np.ndarray, covs: list[tuple[np.ndarray, np.ndarray, np.ndarray]], lam: float
) -> float:
    """How much learned rounding lowers the reconstruction error on windows it was not fitted on, in percent
    of nearest rounding's error: fitted on each half of the calibration images, scored on the other."""
    near = np.clip(np.rint(w / scale), -QMAX, QMAX) * scale
    before = after = 0.0
    for fit, test in ((covs[0], covs[1]), (covs[1], covs[0])):
        before += reconstruction_error(near, w, test)
        after += reconstruction_error(adaround(w, scale, fit, lam=lam) * scale, w, test)
    return 0.0 if before == 0 else 100.0 * (1.0 - after / before)


@dataclass
class _QConv:
    """A convolution of the Q/DQ model with the initializers that hold its integer weights and bias."""

    node: onnx.NodeProto
    x_float: str  # the float tensor that is quantized for its input
    x_scale: str
    w_float: np.ndarray
    w_int: str
    w_scale: str
    b_float: np.ndarray
    b_int: str | None
    b_scale: str | None


def _consumers(g: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    out: dict[str, list[onnx.NodeProto]] = {}
    for n in g.node:
        for i in n.input:
            out.setdefault(i, []).append(n)
    return out


def _qconvs(fp: onnx.ModelProto, qdq: onnx.ModelProto) -> list[_QConv]:
    """The convolutions whose input and weight are both dequantized, in graph order."""
    producer = {o: n for n in qdq.graph.node for o in n.output}
    inits = {t.name for t in qdq.graph.initializer}
    fp_nodes = {n.name: n for n in fp.graph.node}
    fp_inits = {t.name: t for t in fp.graph.initializer}
    found = []
    for n in qdq.graph.node:
        if n.op_type != "Conv" or n.name not in fp_nodes or len(n.input) < 2:
            continue
        dx, dw = producer.get(n.input[0]), producer.get(n.input[1])
        if dx is None or dw is None or dx.op_type != "DequantizeLinear" or dw.op_type != "DequantizeLinear":
            continue
        qx = producer.get(dx.input[0])
        if qx is None or qx.op_type != "QuantizeLinear" or dw.input[0] not in inits:
            continue
        f = fp_nodes[n.name]
        w = numpy_helper.to_array(fp_inits[f.input[1]]).astype(np.float64)
        db = producer.get(n.input[2]) if len(n.input) > 2 else None
        has_int_bias = db is not None and db.op_type == "DequantizeLinear" and db.input[0] in inits
        bias = (
            numpy_helper.to_array(fp_inits[f.input[2]]).astype(np.float64)
            if len(f.input) > 2 and f.input[2] in fp_inits
            else np.zeros(w.shape[0])
        )
        found.append(
            _QConv(
                n,
                qx.input[0],
                dx.input[1],
                w,
                dw.input[0],
                dw.input[1],
                bias,
                db.input[0] if has_int_bias and db is not None else None,
                db.input[1] if has_int_bias and db is not None else None,
            )
        )
    return found


def _activation_scales(qdq: onnx.ModelProto) -> list[tuple[str, str, list[str]]]:
    """(layer, float tensor, scale initializers) for each ReLU/ReLU6 output quantized with a symmetric scale,
    with the scale of the quantized tensor right before it (a convolution output) where there is one."""
    producer = {o: n for n in qdq.graph.node for o in n.output}
    cons = _consumers(qdq.graph)
    out = []
    for n in qdq.graph.node:
        if n.op_type not in ("Relu", "Clip"):
            continue
        after = [c for c in cons.get(n.output[0], []) if c.op_type == "QuantizeLinear"]
        if len(after) != 1:
            continue
        scales = [after[0].input[1]]
        dq = producer.get(n.input[0])
        q = producer.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
        if q is not None and q.op_type == "QuantizeLinear" and len(cons.get(q.output[0], [])) == 1:
            scales.append(q.input[1])
        out.append((n.name, n.output[0], scales))
    return out


def _spread(inputs: np.ndarray, count: int) -> np.ndarray:
    """`count` samples spread evenly over `inputs` (all of them when there are fewer)."""
    if count >= len(inputs):
        return inputs
    return np.asarray(inputs[np.linspace(0, len(inputs) - 1, count).round().astype(int)])


def _set(inits: dict[str, onnx.TensorProto], name: str, value: np.ndarray) -> None:
    inits[name].CopyFrom(numpy_helper.from_array(value, name))


def refine_qdq(
    fp: onnx.ModelProto,
    qdq: onnx.ModelProto,
    inputs: np.ndarray,
    run: Runner,
    *,
    clip: bool = True,
    learn_rounding: bool = True,
    lam: float = 0.01,
    progress: Callable[[str], None] = lambda s: None,
) -> list[LayerChoice]:
    """Refine the symmetric Q/DQ model `qdq` of float model `fp` in place (see the module doc).

    `run(model, inputs, names)` runs a model and returns the named tensors; `inputs` are the calibration
    samples (each layer's statistics use at most WINDOWS input windows, from evenly spread samples)."""
    inits = {t.name: t for t in qdq.graph.initializer}
    choices: list[LayerChoice] = []
    if clip:
        acts = _activation_scales(qdq)
        values = run(fp, _spread(inputs, 32), [t for _, t, _ in acts]) if acts else []
        for (layer, _, scales), x in zip(acts, values, strict=True):
            sample = x.reshape(-1)[:: max(1, x.size // 2_000_000)]
            s, err, naive = mse_clip(sample)
            for name in scales:
                _set(inits, name, np.asarray(s, dtype=numpy_helper.to_array(inits[name]).dtype))
            amax = float(np.abs(sample).max())
            choices.append(LayerChoice(layer, "range", f"clip {s * QMAX:.3g} of max {amax:.3g}", naive, err))
    for conv in _qconvs(fp, qdq):
        progress(f"refine {conv.node.name}")
        groups = next((int(a.i) for a in conv.node.attribute if a.name == "group"), 1)
        o = conv.w_float.shape[0]
        kernel = (conv.w_float.shape[2], conv.w_float.shape[3])
        xf = run(fp, inputs[:1], [conv.x_float])[0]
        per_image = len(conv_windows(xf, conv.node, kernel, groups))
        sample = _spread(inputs, max(16, -(-WINDOWS // per_image)))
        xq = run(qdq, sample, [conv.node.input[0]])[0]
        xf = run(fp, sample, [conv.x_float])[0]
        halves = (
            layer_stats(xq[0::2], xf[0::2], conv.node, kernel, groups),
            layer_stats(xq[1::2], xf[1::2], conv.node, kernel, groups),
        )
        stats = merge_stats(*halves)
        cov = stats.centered()
        w = conv.w_float.reshape(groups, o // groups, -1)
        w_scale = numpy_helper.to_array(inits[conv.w_scale]).astype(np.float64)
        scale = np.broadcast_to(w_scale.reshape(-1), (o,)).reshape(groups, o // groups, 1)
        nearest = np.clip(np.rint(w / scale), -QMAX, QMAX)
        err_near = reconstruction_error(nearest * scale, w, cov)
        q, detail, err = nearest, "nearest rounding", err_near
        if learn_rounding and stats.rows >= 8 * w.shape[2]:
            gain = held_out_gain(w, scale, [h.centered() for h in halves], lam)
            if gain > 0:
                learned = adaround(w, scale, cov, lam=lam)
                err = reconstruction_error(learned * scale, w, cov)
                flipped = float(np.mean(learned != nearest)) * 100
                q, detail = (
                    learned,
                    f"learned rounding ({flipped:.1f}% of weights flipped, held-out error -{gain:.0f}%)",
                )
            else:
                detail = f"nearest rounding (learned rounding: held-out error +{-gain:.0f}%)"
        elif learn_rounding:
            detail = f"nearest rounding ({stats.rows} rows for fan-in {w.shape[2]})"
        # the bias takes the mean output error: b' = b + w·E[xf] - wq·E[xq]
        wq = q * scale
        shift = (w @ stats.mf[:, :, None] - wq @ stats.mq[:, :, None]).reshape(o)
        bias = conv.b_float + shift
        q_arr = q.reshape(conv.w_float.shape).astype(numpy_helper.to_array(inits[conv.w_int]).dtype)
        _set(inits, conv.w_int, q_arr)
        if conv.b_int is not None and conv.b_scale is not None:
            detail += ", bias corrected"
            x_scale = float(numpy_helper.to_array(inits[conv.x_scale]))
            b_scale = (x_scale * w_scale).astype(np.float32)  # per channel, or one per tensor
            _set(inits, conv.b_scale, b_scale)
            _set(inits, conv.b_int, np.rint(bias / b_scale.astype(np.float64)).astype(np.int32))
        choices.append(LayerChoice(conv.node.name, "weights", detail, err_near, err))
    return choices


def center_relu6(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str], list[str]]:
    """Shift each ReLU6 output that only feeds convolutions (directly or through an average pool) to be
    centred on zero: Conv(bias b - c) → Clip(-c, 6 - c) → Conv(bias b' + c·ΣW), c = 3. A convolution that
    pads gets its padding as an explicit `Pad` with the shifted zero, -c, before it (and no padding of its
    own), so every input pixel, border included, is shifted and the float model computes the same. A
    symmetric int8 scale then covers [-3, 3] instead of [-6, 6]: these activations get all 8 bits. Returns
    the new model, the Clip nodes and the Pad nodes it added (`pad_in_quantized_domain` ties each to the
    Clip's scale after quantization)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    cons = _consumers(g)
    centred: list[str] = []
    pads: list[str] = []
    for act in list(g.node):
        if act.op_type != "Clip" or len(act.input) < 3 or not all(i in inits for i in act.input[1:3]):
            continue
        lo, hi = (float(numpy_helper.to_array(inits[i])) for i in act.input[1:3])
        src = producer.get(act.input[0])
        if lo != 0.0 or hi <= 0 or src is None or not _biased_conv(src, inits) or len(cons[act.input[0]]) != 1:
            continue
        convs = _shifted_convs(act.output[0], cons, inits)
        if not convs:
            continue
        c = hi / 2
        b = numpy_helper.to_array(inits[src.input[2]])
        _set(inits, src.input[2], (b - c).astype(b.dtype))
        for k, v in ((1, -c), (2, hi - c)):
            old = inits[act.input[k]]
            name = f"{act.name}_centred_{'min' if k == 1 else 'max'}"
            g.initializer.append(numpy_helper.from_array(np.asarray(v, numpy_helper.to_array(old).dtype), name))
            act.input[k] = name
            if not any(old.name in n.input for n in g.node):
                g.initializer.remove(old)
        for u in convs:
            w = numpy_helper.to_array(inits[u.input[1]])
            shift = (c * w.astype(np.float64).sum(axis=(1, 2, 3))).astype(w.dtype)
            if len(u.input) > 2 and u.input[2]:
                ub = numpy_helper.to_array(inits[u.input[2]])
                _set(inits, u.input[2], (ub + shift).astype(ub.dtype))
            else:
                name = f"{u.name}_centred_bias"
                g.initializer.append(numpy_helper.from_array(shift, name))
                del u.input[2:]
                u.input.append(name)
            if _pads(u):
                pads.append(_explicit_pad(g, u, -c, w.dtype))
        centred.append(act.name)
    return model, centred, pads


def pad_in_quantized_domain(qdq: onnx.ModelProto, pads: list[str]) -> None:
    """Give each centring `Pad` (left float by the quantizer: DQ → Pad → Q) the quantization of its input:
    its output's Q/DQ take the input's scale and zero point, so the pad value is the integer the shifted
    zero quantizes to, the border is exactly what an interior ReLU6 zero becomes, and the range refinement
    moves both with one scale. Unused scale initializers are removed."""
    g = qdq.graph
    producer = {o: n for n in g.node for o in n.output}
    cons = _consumers(g)
    for n in g.node:
        if n.op_type != "Pad" or n.name not in pads:
            continue
        dq = producer.get(n.input[0])
        if dq is None or dq.op_type != "DequantizeLinear":
            continue
        for q in cons.get(n.output[0], []):
            if q.op_type != "QuantizeLinear":
                continue
            for node in [q, *(d for d in cons.get(q.output[0], []) if d.op_type == "DequantizeLinear")]:
                node.input[1:3] = dq.input[1:3]
    used = {i for n in g.node for i in n.input}
    for t in [t for t in g.initializer if t.name not in used]:
        g.initializer.remove(t)


def _conv_pads(n: onnx.NodeProto) -> list[int]:
    return [int(p) for a in n.attribute if a.name == "pads" for p in a.ints]


def _pads(n: onnx.NodeProto) -> bool:
    """Whether a convolution or pool pads its input (explicitly or with auto_pad SAME_*)."""
    auto = next((a.s for a in n.attribute if a.name == "auto_pad"), b"NOTSET")
    return auto.startswith(b"SAME") or any(_conv_pads(n))


def _explicit_pad(g: onnx.GraphProto, conv: onnx.NodeProto, value: float, dtype: np.dtype) -> str:
    """Move `conv`'s padding into a `Pad` node before it that pads with `value`; returns the Pad's name."""
    p = _conv_pads(conv)
    half = len(p) // 2
    name = f"{conv.name}_centred_pad"
    both = [0, 0, *p[:half], 0, 0, *p[half:]]  # N, C, then the spatial axes: begins, then ends
    g.initializer.append(numpy_helper.from_array(np.asarray(both, np.int64), f"{name}_pads"))
    g.initializer.append(numpy_helper.from_array(np.asarray(value, dtype), f"{name}_value"))
    out = f"{conv.input[0]}_{name}"
    node = onnx.helper.make_node("Pad", [conv.input[0], f"{name}_pads", f"{name}_value"], [out], name=name)
    g.node.insert(list(g.node).index(conv), node)
    conv.input[0] = out
    for a in conv.attribute:
        if a.name == "pads":
            del a.ints[:]
            a.ints.extend([0] * len(p))
    return name


def _shifted_convs(
    tensor: str, cons: dict[str, list[onnx.NodeProto]], inits: dict[str, onnx.TensorProto]
) -> list[onnx.NodeProto]:
    """The convolutions that read `tensor` directly or through unpadded average pools (the mean of shifted
    values is the shifted mean), or [] when anything else reads it."""
    found = []
    for u in cons.get(tensor, []):
        if u.op_type in ("AveragePool", "GlobalAveragePool") and not _pads(u):
            after = _shifted_convs(u.output[0], cons, inits)
            if not after:
                return []
            found += after
        elif _plain_conv(u, tensor, inits):
            found.append(u)
        else:
            return []
    return found


def _biased_conv(n: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> bool:
    return n.op_type == "Conv" and len(n.input) > 2 and n.input[2] in inits


def _plain_conv(n: onnx.NodeProto, tensor: str, inits: dict[str, onnx.TensorProto]) -> bool:
    """A 2-D Conv reading `tensor` as its data input, with constant weights and explicit (or no) padding."""
    if n.op_type != "Conv" or n.input[0] != tensor or tensor in n.input[1:] or n.input[1] not in inits:
        return False
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
    auto = attrs.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    return auto in ("NOTSET", "VALID") and len(inits[n.input[1]].dims) == 4

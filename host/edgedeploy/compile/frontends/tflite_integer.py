"""Relax rewrite for quantized TFLite models: convolutions in integer arithmetic, TFLite's requantization.

TVM's TFLite frontend imports a QAT convolution as fake quant, with the model's own scales:
`quantize(conv2d(dequantize(xq, sx, zx), dequantize(Wq, sw, zw)) + dequantize(b_int32, sx*sw), sy, zy)`
(NHWC activations, HWIO / HWOI weights, uint8 or int8). This stage rewrites that into

    acc = conv2d(xq - zx, Wq - zw)   (exact integer sums: float32 while every partial sum is below 2**24,
                                      int32 otherwise)
    y   = clamp(MultiplyByQuantizedMultiplier(acc + b_int32, M[o], shift[o]) + zy)

where M and shift come from `sx * sw[o] / sy` exactly as TFLite's `QuantizeMultiplier` makes them, and the
multiply is TFLite's `SaturatingRoundingDoublingHighMul` + `RoundingDivideByPOT` in int64: the arithmetic of
TFLite's reference kernels, so no re-calibration happens and the model's scales are used as they are.
(compile/int8/rewrite.py does the same for ONNX Q/DQ graphs, in NCHW and with int8 weights; TFLite's uint8
weights carry zero points up to 255, so `Wq - zw` does not fit int8.) Convolutions that do not match stay
fake quant and are listed in `float_left`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import tvm
from tvm import relax

from ..stage import BuildContext, stage

_DQ = tvm.ir.Op.get("relax.dequantize")
_Q = tvm.ir.Op.get("relax.quantize")
_CONV = tvm.ir.Op.get("relax.nn.conv2d")
_ADD = tvm.ir.Op.get("relax.add")
_RESHAPE = tvm.ir.Op.get("relax.reshape")
_ASTYPE = tvm.ir.Op.get("relax.astype")
_AVG_POOL = tvm.ir.Op.get("relax.nn.avg_pool2d")
_RANGE = {"uint8": (0, 255), "int8": (-128, 127)}


def quantize_multiplier(m: float) -> tuple[int, int]:
    """TFLite's QuantizeMultiplier: m = q * 2**(shift - 31) with q a Q31 integer (round half away from 0)."""
    if m == 0.0:
        return 0, 0
    frac, shift = math.frexp(m)
    q = int(math.floor(abs(frac) * (1 << 31) + 0.5)) * (1 if frac >= 0 else -1)
    if q == 1 << 31:
        q //= 2
        shift += 1
    if shift < -31:
        return 0, 0
    return q, shift


def multiply_by_quantized_multiplier(x: np.ndarray, q: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """numpy int64 version of TFLite's MultiplyByQuantizedMultiplier (the reference for tests)."""
    x = x.astype(np.int64) * (np.int64(1) << np.maximum(shift, 0))
    ab = x * q.astype(np.int64)
    t = ab + np.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    high = np.where(t >= 0, t >> 31, -((-t) >> 31))
    right = np.maximum(-shift, 0).astype(np.int64)
    mask = (np.int64(1) << right) - 1
    threshold = (mask >> 1) + (high < 0)
    out: np.ndarray = (high >> right) + ((high & mask) > threshold)
    return out


def _mbqm(bb: Any, acc: Any, q: np.ndarray, shift: np.ndarray) -> Any:
    """The same arithmetic as Relax int64 ops over the last (channel) axis."""
    c = relax.const
    x = relax.op.astype(acc, "int64")
    left = np.int64(1) << np.maximum(shift, 0).astype(np.int64)
    if np.any(left != 1):
        x = relax.op.multiply(x, c(left, "int64"))
    ab = bb.emit(relax.op.multiply(x, c(q.astype(np.int64), "int64")))
    pos = bb.emit(relax.op.greater_equal(ab, c(0, "int64")))
    t = bb.emit(relax.op.add(ab, relax.op.where(pos, c(1 << 30, "int64"), c(1 - (1 << 30), "int64"))))
    t_pos = bb.emit(relax.op.greater_equal(t, c(0, "int64")))
    shifted = relax.op.right_shift(t, c(31, "int64"))
    negated = relax.op.negative(relax.op.right_shift(relax.op.negative(t), c(31, "int64")))
    high = bb.emit(relax.op.where(t_pos, shifted, negated))
    right = np.maximum(-shift, 0).astype(np.int64)
    if not np.any(right):
        return high
    mask = (np.int64(1) << right) - 1
    neg = relax.op.astype(relax.op.less(high, c(0, "int64")), "int64")
    threshold = bb.emit(relax.op.add(c(mask >> 1, "int64"), neg))
    rem = bb.emit(relax.op.bitwise_and(high, c(mask, "int64")))
    up = relax.op.astype(relax.op.greater(rem, threshold), "int64")
    return relax.op.add(relax.op.right_shift(high, c(right, "int64")), up)


def _exact_in_float32(k: int) -> bool:
    """k products (x - zx)(w - zw), each |.| <= 255 * 255, sum exactly in float32 (below 2**24)."""
    return k * 255 * 255 < 2**24


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):  # type: ignore[misc]
    def __init__(self, mod: Any) -> None:
        super().__init__(mod)
        self.integer = 0
        self.float_left: list[str] = []
        self.convs = 0

    def _bound(self, expr: Any, op: Any) -> Any:
        if isinstance(expr, relax.Var):
            bound = self.lookup_binding(expr)
            expr = bound if bound is not None else expr
        return expr if isinstance(expr, relax.Call) and expr.op == op else None

    def _const(self, expr: Any) -> np.ndarray | None:
        if isinstance(expr, relax.Var):
            bound = self.lookup_binding(expr)
            expr = bound if bound is not None else expr
        if isinstance(expr, tvm.ir.expr.Constant):
            return np.asarray(expr.value.numpy())
        return None

    def _weights(self, expr: Any, o_axis: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(Wq - zw as int32 in the convolution's kernel layout, sw per output channel)."""
        reshape = self._bound(expr, _RESHAPE)
        dq = self._bound(reshape.args[0] if reshape is not None else expr, _DQ)
        if dq is None:
            return None
        wq, sw, zw = (self._const(a) for a in dq.args)
        if wq is None or sw is None or zw is None or wq.dtype not in (np.uint8, np.int8):
            return None
        shape = [1] * wq.ndim
        if zw.size > 1 or sw.size > 1:
            shape[int(dq.attrs.axis) % wq.ndim] = -1
        w = wq.astype(np.int32) - zw.astype(np.int32).reshape(shape if zw.size > 1 else [1] * wq.ndim)
        scale = np.broadcast_to(sw.astype(np.float32).reshape(shape), wq.shape)
        if reshape is not None:
            target = [int(d) for d in reshape.args[1].values]
            w, scale = w.reshape(target), scale.reshape(target)
        # one scale per output channel (per-tensor: the same everywhere)
        per_o = np.moveaxis(scale, o_axis, 0).reshape(scale.shape[o_axis], -1)
        if not np.all(per_o == per_o[:, :1]):
            return None
        return w, per_o[:, 0].copy()

    def visit_call_(self, call: Any) -> Any:  # noqa: N802 (TVM's visitor naming)
        call = self.visit_expr_post_order(call)
        if call.op == _ASTYPE:
            pooled = self._average_pool(call)
            return call if pooled is None else pooled
        if call.op != _Q:
            return call
        add = self._bound(call.args[0], _ADD)
        conv = self._bound(add.args[0] if add is not None else call.args[0], _CONV)
        if conv is None:
            return call
        out = self._rewrite(call, add, conv)
        if out is None:
            self.float_left.append(f"conv2d #{self.integer + len(self.float_left)}: {self.reason}")
            return call
        self.integer += 1
        return out

    reason = ""

    def _average_pool(self, cast: Any) -> Any:
        """astype(avg_pool2d(astype(xq, int32)), uint8|int8), the frontend's quantized AVERAGE_POOL_2D, becomes
        TFLite's rounding average: (sum + n/2) / n, half away from zero (TVM's integer average truncates)."""
        dtype = str(cast.ty.dtype)
        pool = self._bound(cast.args[0], _AVG_POOL)
        widen = self._bound(pool.args[0], _ASTYPE) if pool is not None else None
        if widen is None or dtype not in _RANGE or str(widen.args[0].ty.dtype) != dtype:
            return None
        a = pool.attrs
        n = int(np.prod([int(k) for k in a.pool_size]))
        if any(int(p) for p in a.padding) or bool(a.ceil_mode) or n * 256 >= 2**24:
            return None  # a constant window size, and sums exact in float32
        bb, c = self.builder_, relax.const
        attrs = {k: getattr(a, k) for k in ("pool_size", "strides", "dilation", "padding", "layout", "out_layout")}
        mean = bb.emit(relax.op.nn.avg_pool2d(relax.op.astype(widen.args[0], "float32"), **attrs))
        total = bb.emit(relax.op.astype(relax.op.round(relax.op.multiply(mean, c(float(n), "float32"))), "int32"))
        magnitude = relax.op.floor_divide(relax.op.add(relax.op.abs(total), c(n // 2, "int32")), c(n, "int32"))
        rounded = relax.op.where(relax.op.less(total, c(0, "int32")), relax.op.negative(magnitude), magnitude)
        lo, hi = _RANGE[dtype]
        return relax.op.astype(relax.op.clip(bb.emit(rounded), lo, hi), dtype)

    def _rewrite(self, q: Any, add: Any, conv: Any) -> Any:
        a = conv.attrs
        self.reason = "layout is not NHWC with HWIO/HWOI weights"
        if a.data_layout != "NHWC" or a.out_layout != "NHWC" or a.kernel_layout not in ("HWIO", "HWOI"):
            return None
        self.reason = "operands, scales or zero points are not constant per-tensor quantized values"
        x_dq = self._bound(conv.args[0], _DQ)
        if x_dq is None:
            return None
        sx, zx = self._const(x_dq.args[1]), self._const(x_dq.args[2])
        sy, zy = self._const(q.args[1]), self._const(q.args[2])
        weights = self._weights(conv.args[1], a.kernel_layout.index("O"))
        dtype = str(q.ty.dtype)
        if any(v is None or v.size != 1 for v in (sx, zx, sy, zy)) or weights is None or dtype not in _RANGE:
            return None
        assert sx is not None and zx is not None and sy is not None and zy is not None
        w, sw = weights
        o = sw.size
        bias = np.zeros(o, np.int64)
        if add is not None:
            b_dq = self._bound(add.args[1], _DQ)
            values = self._const(b_dq.args[0]) if b_dq is not None else None
            sb = self._const(b_dq.args[1]) if b_dq is not None else None
            self.reason = "the bias is not an int32 constant in units of sx * sw"
            if values is None or sb is None or values.dtype != np.int32 or values.size != o:
                return None
            if not np.allclose(np.broadcast_to(sb.reshape(-1), (o,)), np.float32(sx) * sw, rtol=1e-5):
                return None
            bias = values.reshape(-1).astype(np.int64)
        bb = self.builder_
        xq = x_dq.args[0]
        attrs = {"strides": a.strides, "padding": a.padding, "dilation": a.dilation, "groups": int(a.groups)}
        layout = {"data_layout": "NHWC", "kernel_layout": a.kernel_layout, "out_layout": "NHWC"}
        if _exact_in_float32(w.size // o):
            x = relax.op.subtract(relax.op.astype(xq, "float32"), relax.const(float(zx.reshape(())), "float32"))
            accf = bb.emit(relax.op.nn.conv2d(bb.emit(x), relax.const(w.astype(np.float32)), **attrs, **layout))
            acc = bb.emit(relax.op.astype(accf, "int32"))
        else:
            x = relax.op.subtract(relax.op.astype(xq, "int32"), relax.const(int(zx.reshape(())), "int32"))
            acc = bb.emit(relax.op.nn.conv2d(bb.emit(x), relax.const(w, "int32"), out_dtype="int32", **attrs, **layout))
        acc = bb.emit(relax.op.add(acc, relax.const(bias.astype(np.int32), "int32")))
        # TFLite: uint8 kernels use the float32 product sx*sw; per-channel (int8) ones the float64 product
        per_channel = len(set(sw.tolist())) > 1 or dtype == "int8"
        qs, shifts = [], []
        for s in sw:
            prod = float(np.float64(sx.reshape(())) * np.float64(s)) if per_channel else float(np.float32(sx) * s)
            m, sh = quantize_multiplier(prod / float(sy.reshape(())))
            qs.append(m)
            shifts.append(sh)
        y = _mbqm(bb, acc, np.array(qs, np.int64), np.array(shifts, np.int64))
        y = relax.op.add(y, relax.const(int(zy.reshape(())), "int64"))
        lo, hi = _RANGE[dtype]
        return relax.op.astype(relax.op.clip(y, lo, hi), dtype)


def rewrite_tflite_integer(mod: Any) -> tuple[Any, int, list[str]]:
    """Rewrite `mod["main"]`; returns the module, how many convolutions became integer, and those left."""
    rw = _Rewriter(mod.clone())
    func = rw.visit_expr(mod["main"])
    out = rw.builder_.get()
    out["main"] = func
    return relax.transform.DeadCodeElimination()(out), rw.integer, rw.float_left


@stage("tflite-integer")
def tflite_integer_stage(ctx: BuildContext) -> None:
    """Quantized TFLite convolutions in integer arithmetic with TFLite's requantization (a no-op for float
    models: nothing matches)."""
    ctx.ir, _, ctx.float_left = rewrite_tflite_integer(ctx.ir)

"""Relax rewrite: dequantize -> conv2d / matmul (fake quant) becomes integer compute.

`conv2d(dequantize(xq, sx, zx), dequantize(Wq, sw, 0))` turns into
`cast(conv2d(pad(xq, zx), Wq, out_dtype=int32) - zx * sum(Wq[o]), f32) * (sx * sw[o])`: int8 operands, int32
accumulation, the zero-point term precomputed in numpy. Padding is done in the integer domain with the
zero point as pad value, so borders stay exact. Per-channel weight scales, depthwise and grouped
convolutions are handled; `matmul` likewise with per-column scales. Anything not matching stays float
and is reported by index and, where known, by ONNX node name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm
from tvm import relax

from ..stage import BuildContext, stage
from .quantize import quantizable_layers
from .x86_int8 import (
    AVX2,
    OC_KINDS,
    ConvShape,
    DotKind,
    conv_eligible,
    conv_kernel,
    conv_oc_kernel,
    conv_shape,
    depthwise_eligible,
    depthwise_kernel,
    depthwise_lanes,
    dot_kind,
    for_row,
    matvec_eligible,
    matvec_kernel,
    max_pool_kernel,
    oc_eligible,
    oc_shape,
    operand_shift,
    pack_activations,
    pack_channel_weights,
    pack_conv_activations,
    pack_conv_weights,
    pack_depthwise_weights,
    pack_matvec_weights,
    pack_oc_weights,
    pack_pixel_major_kernel,
    pack_weights,
    pack_winograd_weights,
    pointwise_channel_kernel,
    pointwise_eligible,
    pointwise_kernel,
    quantize_pack_kernel,
    residual_add_kernel,
    winograd_eligible,
    winograd_kernel,
)

_DQ = tvm.ir.Op.get("relax.dequantize")
_CONV = tvm.ir.Op.get("relax.nn.conv2d")
_MATMUL = tvm.ir.Op.get("relax.matmul")
_Q = tvm.ir.Op.get("relax.quantize")
_ADD = tvm.ir.Op.get("relax.add")
_MUL = tvm.ir.Op.get("relax.multiply")
_ASTYPE = tvm.ir.Op.get("relax.astype")
_RESHAPE = tvm.ir.Op.get("relax.reshape")
_MAX_POOL = tvm.ir.Op.get("relax.nn.max_pool2d")
_PERMUTE = tvm.ir.Op.get("relax.permute_dims")
_INT_RANGE = {"int8": (-128, 127), "uint8": (0, 255)}
# what a tensorized x86 kernel needs: (integer input, int8 weights [O, C, KH, KW], input zero point, the
# convolution's attributes, or None for a 1x1 stride-1 convolution: the pointwise kernel, or MATVEC for a 1x1
# convolution of one pixel: the matrix-vector kernel)
Dot = tuple[Any, np.ndarray, int, Any]
MATVEC = "matvec"
NHWC_TO_NCHW, NCHW_TO_NHWC = [0, 3, 1, 2], [0, 2, 3, 1]


@dataclass(frozen=True)
class _Depthwise:
    """A Dot's last entry for a depthwise convolution (x86_int8.depthwise_kernel): its attributes."""

    attrs: Any


def _kernel_constants(packed: np.ndarray, w: np.ndarray, z: int, b_q: np.ndarray, mult: np.ndarray) -> list[Any]:
    """An integer kernel's constant operands: its packed weights, the bias with the input zero point folded in
    (b - z * sum of the output channel's weights, int32: the kernels sum raw 8-bit products), the multipliers."""
    total = (b_q.astype(np.int64) - z * w.reshape(w.shape[0], -1).astype(np.int64).sum(axis=1)).astype(np.int32)
    return [relax.const(packed), relax.const(total), relax.const(mult, "float32")]


@dataclass
class RewriteReport:
    integer: list[str] = field(default_factory=list)
    float_left: list[str] = field(default_factory=list)  # "name: reason"


def _value(expr: Any) -> np.ndarray | None:
    if not isinstance(expr, tvm.ir.expr.Constant):
        return None
    return np.asarray(expr.value.numpy())


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):  # type: ignore[misc]
    def __init__(self, mod: Any, names: list[str], float_exact: bool = False, dot: DotKind | None = None) -> None:
        super().__init__(mod)
        self.names = names
        self.float_exact = float_exact
        self.dot = dot
        self.count = 0
        self.report = RewriteReport()
        # int32 accumulator (with zero-point term) -> (raw accumulator, correction, per-channel sx*sw, and what
        # a tensorized x86 kernel needs when the layer is a convolution it computes once requantized)
        self.accumulators: dict[Any, tuple[Any, np.ndarray, np.ndarray, Dot | None]] = {}
        # outputs of those kernels -> the same kernel with a float32 output, y - center, for its consumer
        self.kernel_outputs: dict[Any, Callable[[int], Any]] = {}
        # the channel-lane chain (x86_int8.depthwise_kernel, pointwise_channel_kernel), keyed by the permute_dims
        # that turns a kernel's output into NCHW for other consumers: a 1x1 kernel's [N, O/L, P, L] -> (L, a maker
        # of the same kernel writing y - center in float32); a depthwise kernel's [N, OH, OW, C/V, V] -> a maker
        # of the same kernel writing the channel-lane 1x1 kernel's input (operand type, zero point)
        self.blocked_outputs: dict[Any, tuple[int, Callable[[int], Any]]] = {}
        self.channels_last: dict[Any, Callable[[], tuple[Any, int]]] = {}

    def _const(self, expr: Any) -> np.ndarray | None:
        """A constant, or quantize(constant) evaluated here (ORT leaves some weights quantized at run time)."""
        if isinstance(expr, relax.Var):
            bound = self.lookup_binding(expr)
            expr = bound if bound is not None else expr
        if isinstance(expr, relax.Call) and expr.op == _Q:
            x, s, z = (self._const(a) for a in expr.args)
            dtype = str(expr.ty.dtype)
            if x is None or s is None or z is None or dtype not in _INT_RANGE:
                return None
            axis = int(expr.attrs.axis)
            shape = [1] * x.ndim
            if s.size > 1:
                shape[axis % x.ndim] = -1
            lo, hi = _INT_RANGE[dtype]
            q = np.round(x / s.reshape(shape)) + z.astype(np.float32).reshape(shape)
            result: np.ndarray = np.clip(q, lo, hi).astype(dtype)
            return result
        return _value(expr)

    def _dq(self, expr: Any) -> Any:
        if isinstance(expr, relax.Var):
            bound = self.lookup_binding(expr)
            expr = bound if bound is not None else expr
        if isinstance(expr, relax.Call) and expr.op == _DQ:
            return expr
        return None

    def _bound(self, expr: Any, op: Any) -> Any:
        if isinstance(expr, relax.Var):
            bound = self.lookup_binding(expr)
            expr = bound if bound is not None else expr
        return expr if isinstance(expr, relax.Call) and expr.op == op else None

    def visit_call_(self, call: Any) -> Any:  # noqa: N802 (TVM's visitor naming)
        call = self.visit_expr_post_order(call)
        if call.op == _Q:
            fused = self._fuse_requantize(call)
            if fused is None:
                fused = self._integer_max_pool(call)
            if fused is None and self.dot is not None:
                fused = self._residual_add(call)
            return call if fused is None else fused
        if call.op not in (_CONV, _MATMUL):
            return call
        name = self.names[self.count] if self.count < len(self.names) else f"{call.op.name}#{self.count}"
        self.count += 1
        x_dq, w_dq = self._dq(call.args[0]), self._dq(call.args[1])
        transposed = False
        if w_dq is None and call.op == _MATMUL:
            w_dq = self._transposed_dq(call.args[1])
            transposed = w_dq is not None
        if x_dq is None or w_dq is None:
            self.report.float_left.append(f"{name}: operands are not dequantized (kept in float)")
            return call
        sx, zx = self._const(x_dq.args[1]), self._const(x_dq.args[2])
        wq, sw, zw = (self._const(a) for a in w_dq.args)
        out = None
        if sx is None or zx is None or wq is None or sw is None or zw is None:
            reason = "scales, zero points or weights are not constants"
        elif sx.size != 1 or zx.size != 1:
            reason = "per-channel activation quantization"
        elif not _fits_int8(wq, zw, int(w_dq.attrs.axis)):
            reason = "weight zero point is not 0 and the shifted weights do not fit int8"
        else:
            reason = "unsupported layout or attributes"
            if call.op == _CONV:
                out = self._conv(call, x_dq, wq, sw, zw, sx, zx)
            else:
                out = self._matmul(call, x_dq, wq, sw, zw, sx, zx, int(w_dq.attrs.axis), transposed)
        if out is None:
            self.report.float_left.append(f"{name}: {reason}")
            return call
        self.report.integer.append(name)
        return out

    def _int8_input(self, xq: Any, zx: int) -> tuple[Any, int]:
        """uint8 activations become int8 (x - 128) so both operands share one signed type. GPU builds have made
        their activations int8 beforehand (`signed_activations`); this remains for a uint8 tensor no quantize
        made (a graph input) and for CPU convolutions too long for float32-exact accumulation."""
        if str(xq.ty.dtype) == "uint8":
            shifted = self.builder_.emit(relax.op.subtract(relax.op.astype(xq, "int16"), relax.const(128, "int16")))
            return self.builder_.emit(relax.op.astype(shifted, "int8")), zx - 128
        return xq, zx

    def _conv(self, call: Any, x_dq: Any, wq: np.ndarray, sw: np.ndarray, zw: np.ndarray, sx: Any, zx: Any) -> Any:
        a = call.attrs
        if a.data_layout != "NCHW" or a.kernel_layout != "OIHW" or a.out_layout != "NCHW":
            return None
        w = _shift_weights(wq, zw, int(self._dq(call.args[1]).attrs.axis))
        o = w.shape[0]
        conv: dict[str, Any] = {"strides": a.strides, "dilation": a.dilation, "groups": int(a.groups)}
        dot: Dot | None = None
        x_shape = tuple(int(d) for d in x_dq.args[0].ty.shape)
        if self.dot is not None and matvec_eligible(a, w.shape, x_shape):
            dot = (x_dq.args[0], w, int(zx.reshape(())), MATVEC)
        elif self.dot is not None and pointwise_eligible(self.dot, a, w.shape):
            dot = (x_dq.args[0], w, int(zx.reshape(())), None)
        elif self.dot is not None and conv_eligible(self.dot, a, w.shape):
            dot = (x_dq.args[0], w, int(zx.reshape(())), a)
        elif (
            self.dot is not None
            and self.float_exact
            and _exact_in_float32(w[0].size)  # depthwise_kernel sums in float32
            and depthwise_eligible(a, w.shape, x_shape)
        ):
            dot = (x_dq.args[0], w, int(zx.reshape(())), _Depthwise(a))
        if self.float_exact and _exact_in_float32(w[0].size):
            # (x - zx) * w summed in float32 is exact (every partial sum is an integer below 2**24): the same
            # int32 accumulator on the FMA units, and the convolution pads with 0 itself, as an FP32 graph does
            x0 = self._float_input(x_dq.args[0], int(zx.reshape(())))
            accf = self.builder_.emit(
                relax.op.nn.conv2d(self.builder_.emit(x0), relax.const(w.astype(np.float32)), padding=a.padding, **conv)
            )
            acc = self.builder_.emit(relax.op.astype(accf, "int32"))
            z = 0  # already taken out
        else:
            xq, z = self._int8_input(x_dq.args[0], int(zx.reshape(())))
            pad = [int(p) for p in a.padding]  # top, left, bottom, right
            if any(pad):
                width = [0, 0, 0, 0, pad[0], pad[2], pad[1], pad[3]]
                xq = self.builder_.emit(relax.op.nn.pad(xq, width, pad_value=float(z)))
            conv["padding"] = [0, 0, 0, 0]
            acc = self.builder_.emit(relax.op.nn.conv2d(xq, relax.const(w, "int8"), out_dtype="int32", **conv))
        corr = (-z * w.reshape(o, -1).astype(np.int64).sum(axis=1)).astype(np.int32).reshape(1, o, 1, 1)
        scale = (float(sx.reshape(())) * np.broadcast_to(sw.astype(np.float32).reshape(-1), (o,))).reshape(1, o, 1, 1)
        return self._requant(acc, corr, scale.astype(np.float32), call, dot)

    def _transposed_dq(self, expr: Any) -> Any:
        """dequantize(W) under a 2-D transposition: ONNX Gemm with transB=1 (a classifier) imports as
        matmul(x, permute_dims(dequantize(W)))."""
        t = self._bound(expr, _PERMUTE)
        if t is None or (t.attrs.axes is not None and [int(a) for a in t.attrs.axes] != [1, 0]):
            return None
        return self._dq(t.args[0])

    def _matmul(
        self,
        call: Any,
        x_dq: Any,
        wq: np.ndarray,
        sw: np.ndarray,
        zw: np.ndarray,
        sx: Any,
        zx: Any,
        w_axis: int,
        transposed: bool,
    ) -> Any:
        """`transposed`: the weight is dequantize(W) under permute_dims, W stored N x K (its scales on `w_axis`)."""
        if wq.ndim != 2:
            return None
        w = _shift_weights(wq, zw, w_axis % 2)
        w = np.ascontiguousarray(w.T) if transposed else w
        x_shape = x_dq.args[0].ty.shape
        dot: Dot | None = None
        if (
            self.dot is not None
            and len(x_shape) == 2
            and all(isinstance(d, tvm.tirx.IntImm) for d in x_shape)
            and w.shape[0] % AVX2.depth == 0
        ):
            # a classifier (ResNet-18's Gemm, 512 -> 1000): the matrix-vector kernel, as a 1x1 convolution of
            # one pixel ([O, C] weights); TVM's default int8 matmul took 0.21 ms of ResNet-18's 9.7 on VNNI
            dot = (x_dq.args[0], np.ascontiguousarray(w.T), int(zx.reshape(())), MATVEC)
        xq, z = self._int8_input(x_dq.args[0], int(zx.reshape(())))
        acc = self.builder_.emit(relax.op.matmul(xq, relax.const(w, "int8"), out_dtype="int32"))
        n = w.shape[1]
        corr = (-z * w.astype(np.int64).sum(axis=0)).astype(np.int32)
        scale = float(sx.reshape(())) * np.broadcast_to(sw.astype(np.float32).reshape(-1), (n,))
        return self._requant(acc, corr, scale.astype(np.float32), call, dot)

    def _requant(self, acc: Any, corr: np.ndarray, scale: np.ndarray, call: Any, dot: Dot | None = None) -> Any:
        summed = self.builder_.emit(relax.op.add(acc, relax.const(corr, "int32")))
        self.accumulators[summed] = (acc, corr, scale, dot)
        out = relax.op.multiply(relax.op.astype(summed, "float32"), relax.const(scale, "float32"))
        dtype = str(call.ty.dtype)
        return out if dtype == "float32" else relax.op.astype(self.builder_.emit(out), dtype)

    def _fuse_requantize(self, q: Any) -> Any:
        """quantize(int_conv * s + dequantize(bias_int32)) -> round((acc + bias) * s / sy) + zy in one step,
        the way onnxruntime's QLinearConv requantizes (float32 multiplier, round half to even)."""
        add = self._bound(q.args[0], _ADD)
        mul = self._bound(add.args[0] if add is not None else q.args[0], _MUL)
        cast = self._bound(mul.args[0], _ASTYPE) if mul is not None else None
        if cast is None or cast.args[0] not in self.accumulators:
            return None
        acc, corr, scale, dot = self.accumulators[cast.args[0]]
        bias = self._bias_int32(add.args[1]) if add is not None else (np.zeros(scale.size, np.int32), scale)
        sy, zy = self._const(q.args[1]), self._const(q.args[2])
        dtype = str(q.ty.dtype)
        if bias is None or sy is None or zy is None or sy.size != 1 or zy.size != 1 or dtype not in _INT_RANGE:
            return None
        b_q, b_scale = bias
        flat_scale = scale.reshape(-1)
        if b_q.size != flat_scale.size or not np.allclose(b_scale.reshape(-1), flat_scale, rtol=1e-5):
            return None
        mult = (flat_scale.astype(np.float32) / np.float32(sy.reshape(()))).astype(np.float32).reshape(scale.shape)
        if dot is not None and isinstance(dot[3], _Depthwise):
            return self._depthwise(*dot[:3], dot[3].attrs, b_q, mult.reshape(-1), int(zy.reshape(())), dtype)
        if dot is not None and dot[3] is MATVEC:
            return self._matvec(*dot[:3], b_q, mult.reshape(-1), int(zy.reshape(())), dtype)
        if dot is not None and dot[3] is None:
            return self._pointwise(*dot[:3], b_q, mult.reshape(-1), int(zy.reshape(())), dtype)
        if dot is not None:
            return self._spatial(*dot, b_q, mult.reshape(-1), int(zy.reshape(())), dtype)
        total = (corr.reshape(-1).astype(np.int64) + b_q.astype(np.int64)).astype(np.int32).reshape(corr.shape)
        summed = self.builder_.emit(relax.op.add(acc, relax.const(total, "int32")))
        f = self.builder_.emit(relax.op.round(relax.op.multiply(relax.op.astype(summed, "float32"), relax.const(mult))))
        lo, hi = _INT_RANGE[dtype]
        shifted = relax.op.add(f, relax.const(float(zy.reshape(())), "float32"))
        return relax.op.astype(relax.op.clip(shifted, lo, hi), dtype)

    def _integer_max_pool(self, q: Any) -> Any:
        """quantize(max_pool2d(dequantize(xq, s, z)), s, z) -> max_pool2d(xq): the same integers (dequantize
        is increasing, and quantize gives back xq's values when the scale and zero point are the same, as
        onnxruntime's quantizer makes them), in a quarter of the bytes: on the GPU, ResNet-18's stem wrote
        its output in float32 for the pooling to read (205 MB at batch 64)."""
        pool = self._bound(q.args[0], _MAX_POOL)
        dq = self._dq(pool.args[0]) if pool is not None else None
        if dq is None or str(dq.args[0].ty.dtype) != str(q.ty.dtype):
            return None
        pairs = [(self._const(a), self._const(b)) for a, b in zip(dq.args[1:3], q.args[1:3], strict=True)]
        if any(a is None or b is None or a.shape != b.shape or not np.array_equal(a, b) for a, b in pairs):
            return None
        kernel = self._max_pool_kernel(dq.args[0], pool.attrs) if self.dot is not None else None
        if kernel is None:
            return relax.Call(pool.op, [dq.args[0]], pool.attrs)
        gv = self.builder_.add_func(kernel, "int8_max_pool")
        return relax.call_tir(gv, [dq.args[0]], q.ty)

    @staticmethod
    def _max_pool_kernel(x: Any, a: Any) -> Any:
        """x86: x86_int8.max_pool_kernel for an NCHW pool with static shapes, no dilation, no ceil mode."""
        shape = x.ty.shape
        if (
            a.layout != "NCHW"
            or a.out_layout != "NCHW"
            or bool(a.ceil_mode)
            or any(int(d) != 1 for d in a.dilation)
            or len(shape) != 4
            or any(not isinstance(d, tvm.tirx.IntImm) for d in shape)
            or len(a.padding) != 4
        ):
            return None
        n, c, h, w = (int(d) for d in shape)
        (kh, kw), (sh, sw) = (int(k) for k in a.pool_size), (int(s) for s in a.strides)
        pad = tuple(int(p) for p in a.padding)
        return max_pool_kernel((n, c, h, w), str(x.ty.dtype), (kh, kw), (sh, sw), pad)

    def _residual_add(self, q: Any) -> Any:
        """quantize(dequantize(a) + dequantize(b)) of two 8-bit tensors of one shape, per-tensor scales (a
        residual connection) -> one vectorized kernel with the same arithmetic (x86_int8.residual_add_kernel)."""
        add = self._bound(q.args[0], _ADD)
        operands = [self._dq(a) for a in add.args] if add is not None else []
        if add is None or str(add.ty.dtype) != "float32" or len(operands) != 2 or None in operands:
            return None
        found = [(self._const(d.args[1]), self._const(d.args[2])) for d in operands]
        found.append((self._const(q.args[1]), self._const(q.args[2])))
        params = [(s, z) for s, z in found if s is not None and z is not None and s.size == 1 and z.size == 1]
        ints = [d.args[0] for d in operands]
        dtypes = [str(t.ty.dtype) for t in ints] + [str(q.ty.dtype)]
        if any(not isinstance(d, tvm.tirx.IntImm) for t in ints for d in t.ty.shape):
            return None  # a symbolic (batch) dimension
        shapes = {tuple(int(d) for d in t.ty.shape) for t in ints}
        if len(params) != 3 or any(d not in _INT_RANGE for d in dtypes) or len(shapes) != 1:
            return None
        spec = [(d, float(s.reshape(())), int(z.reshape(()))) for d, (s, z) in zip(dtypes, params, strict=True)]
        shape = shapes.pop()
        inner = [self._pixel_major(t) for t in ints]
        if len(shape) == 4 and any(t is not None for t in inner):
            # an elementwise kernel: on the pixel-major tensors conv_oc_kernel wrote (a plain operand transposed
            # to match: ResNet-18's first block, whose shortcut is the max pool's output), the same bytes
            n, c, h, w = shape
            operands = [
                t if t is not None else self.builder_.emit(relax.op.permute_dims(i, NCHW_TO_NHWC))
                for t, i in zip(inner, ints, strict=True)
            ]
            gv = self.builder_.add_func(residual_add_kernel((n, h, w, c), *spec), "int8_residual_add")
            y = self.builder_.emit(relax.call_tir(gv, operands, relax.TensorType((n, h, w, c), dtypes[2])))
            return relax.op.permute_dims(y, NHWC_TO_NCHW)
        gv = self.builder_.add_func(residual_add_kernel(shape, *spec), "int8_residual_add")
        return relax.call_tir(gv, ints, relax.TensorType(shape, dtypes[2]))

    def _pixel_major(self, x: Any) -> Any:
        """The [N, H, W, C] tensor that x is the NCHW view of (permute_dims(t, NHWC_TO_NCHW)), if it is one."""
        t = self._bound(x, _PERMUTE)
        if t is None or t.attrs.axes is None or [int(a) for a in t.attrs.axes] != NHWC_TO_NCHW:
            return None
        return t.args[0]

    def _pointwise(
        self, xq: Any, w: np.ndarray, zx: int, b_q: np.ndarray, mult: np.ndarray, zy: int, dtype: str
    ) -> Any:
        """The whole 1x1 convolution and its requantize as one tensorized kernel (x86_int8.py)."""
        assert self.dot is not None
        n, c, h, wd = (int(d) for d in xq.ty.shape)
        o = w.shape[0]
        source = self._chain_source(xq, self.channels_last)
        if source is not None and o % self.dot.lanes == 0:
            return self._pointwise_channels(source(), w, b_q, mult, zy, dtype, (n, c, o, h, wd))
        packed, z = pack_activations(self.builder_, xq, zx, self.dot)
        consts = _kernel_constants(pack_weights(w, self.dot), w, z, b_q, mult)
        call = (packed, consts, (n, c, o, h, wd), zy, dtype)
        flat = self._kernel_call(*call)
        self.kernel_outputs[flat] = lambda center: self._kernel_call(*call, center=center)
        return relax.op.reshape(flat, [n, o, h, wd])

    def _chain_source(self, xq: Any, table: dict[Any, Any]) -> Any:
        """table's entry for the kernel output behind xq = reshape(permute_dims(kernel output)), if any."""
        reshaped = self._bound(xq, _RESHAPE)
        return table.get(reshaped.args[0]) if reshaped is not None else None

    def _pointwise_channels(
        self, source: tuple[Any, int], w: np.ndarray, b_q: np.ndarray, mult: np.ndarray, zy: int, dtype: str, dims: Any
    ) -> Any:
        """A 1x1 convolution of a depthwise kernel's output with lanes over output channels
        (x86_int8.pointwise_channel_kernel): reads the NHWC operand the depthwise kernel wrote, writes [N, O/L, P, L];
        a depthwise consumer takes that layout (blocked_outputs), any other the NCHW view."""
        assert self.dot is not None
        bb, kind = self.builder_, self.dot
        (n, c, o, h, wd), p, lanes = dims, dims[3] * dims[4], self.dot.lanes
        x, z = source
        x = bb.emit(relax.op.reshape(x, [n, p, c // kind.depth, kind.depth]))
        consts = _kernel_constants(pack_channel_weights(w, kind), w, z, b_q, mult)

        def call(center: int | None) -> Any:
            kernel = pointwise_channel_kernel(kind, n, c, o, p, zy, dtype, center=center)
            gv = bb.add_func(kernel, f"int8_conv1x1_oc_{kind.name.replace('-', '_')}")
            out = relax.TensorType((n, o // lanes, p, lanes), dtype if center is None else "float32")
            return bb.emit(relax.call_tir(gv, [x, *consts], out))

        nchw = bb.emit(relax.op.permute_dims(call(None), [0, 1, 3, 2]))
        self.blocked_outputs[nchw] = (lanes, lambda center: call(center))
        return relax.op.reshape(nchw, [n, o, h, wd])

    def _depthwise(
        self, xq: Any, w: np.ndarray, zx: int, attrs: Any, b_q: np.ndarray, mult: np.ndarray, zy: int, dtype: str
    ) -> Any:
        """A depthwise convolution and its requantize as one kernel with channels in the float32 lanes
        (x86_int8.depthwise_kernel). Its input: a channel-lane 1x1 kernel's float32 output where that made it,
        else the float32-exact input put in [N, C/V, H, W, V] by Relax ops. Its output: NHWC, in the next
        channel-lane 1x1 kernel's operand type where one reads it (channels_last), the NCHW view for others."""
        assert self.dot is not None
        bb, kind = self.builder_, self.dot
        n, c, h, wd = (int(d) for d in xq.ty.shape)
        lanes = depthwise_lanes(kind, c)
        blocked = self._chain_source(xq, self.blocked_outputs)
        if blocked is not None and blocked[0] == lanes:
            x = bb.emit(relax.op.reshape(blocked[1](zx), [n, c // lanes, h, wd, lanes]))
        else:
            x0 = self._float_input(xq, zx)
            x0 = x0 if isinstance(x0, relax.Var) else bb.emit(x0)
            x = bb.emit(relax.op.permute_dims(relax.op.reshape(x0, [n, c // lanes, lanes, h, wd]), [0, 1, 3, 4, 2]))
        shape: ConvShape = conv_shape(kind, (n, c, h, wd), w.shape, attrs)
        oh, ow = shape.out_hw
        consts = [
            relax.const(pack_depthwise_weights(w, lanes)),
            relax.const(b_q.astype(np.int32)),
            relax.const(mult, "float32"),
        ]

        def call(store: str | None, shift: int) -> Any:
            kernel = depthwise_kernel(lanes, shape, zy, dtype, store, shift)
            gv = bb.add_func(kernel, f"int8_depthwise_{lanes}")
            out = relax.TensorType((n, oh, ow, c // lanes, lanes), store or dtype)
            return bb.emit(relax.call_tir(gv, [x, *consts], out))

        shift = operand_shift(kind.act_dtype, dtype)

        def operand() -> tuple[Any, int]:
            return call(kind.act_dtype, shift), zy + shift

        nchw = bb.emit(relax.op.permute_dims(call(None, 0), [0, 3, 4, 1, 2]))
        self.channels_last[nchw] = operand
        return relax.op.reshape(nchw, [n, c, oh, ow])

    def _matvec(self, xq: Any, w: np.ndarray, zx: int, b_q: np.ndarray, mult: np.ndarray, zy: int, dtype: str) -> Any:
        """A 1x1 convolution of one pixel (a classifier) and its requantize as one kernel whose lanes run over the
        output channels (x86_int8.matvec_kernel); any channel count, the weights padded with zero rows."""
        n, c = (int(d) for d in list(xq.ty.shape)[:2])
        o, depth = w.shape[0], AVX2.depth
        x = self.builder_.emit(relax.op.reshape(relax.op.astype(xq, "int16"), [n, c // depth, depth]))
        consts = _kernel_constants(pack_matvec_weights(w), w, zx, b_q, mult)
        gv = self.builder_.add_func(matvec_kernel(n, c, o, zy, dtype), "int8_matvec_avx2")
        y = self.builder_.emit(relax.call_tir(gv, [x, *consts], relax.TensorType((n, o), dtype)))
        return y if len(xq.ty.shape) == 2 else relax.op.reshape(y, [n, o, 1, 1])  # a matmul's, or a 1x1 conv's

    def _spatial(
        self, xq: Any, w: np.ndarray, zx: int, attrs: Any, b_q: np.ndarray, mult: np.ndarray, zy: int, dtype: str
    ) -> Any:
        """Any other convolution the profile's dot product takes (K x K, strided, padded; x86_int8.conv_kernel)
        and its requantize as one tensorized kernel."""
        assert self.dot is not None
        bb, x_shape = self.builder_, tuple(int(d) for d in xq.ty.shape)
        if winograd_eligible(self.dot, attrs, w.shape) and str(xq.ty.dtype) in _INT_RANGE:  # AVX2 3x3 stride 1
            # reads the pixel-major tensor a conv_oc_kernel or winograd_kernel wrote (else the NCHW input
            # transposed), writes one, as conv_oc_kernel below
            shape = conv_shape(self.dot, x_shape, w.shape, attrs)
            inner = self._pixel_major(xq)
            nhwc_in = inner if inner is not None else bb.emit(relax.op.permute_dims(xq, NCHW_TO_NHWC))
            consts = _kernel_constants(pack_winograd_weights(w), w, zx, b_q, mult)
            kernel = winograd_kernel(shape, str(xq.ty.dtype), zx, zy, dtype)
            gv = bb.add_func(kernel, "int8_conv_winograd_avx2")
            nhwc = relax.TensorType((shape.n, *shape.out_hw, shape.o), dtype)
            y = bb.emit(relax.call_tir(gv, [nhwc_in, *consts], nhwc))
            return relax.op.permute_dims(y, NHWC_TO_NCHW)
        if oc_eligible(self.dot, attrs, w.shape):  # lanes over output channels
            dot = OC_KINDS[self.dot]
            shape = oc_shape(x_shape, w.shape, attrs, dot)
            inner = self._pixel_major(xq)
            if inner is not None and str(xq.ty.dtype) in _INT_RANGE:  # another conv_oc_kernel's output
                kernel = pack_pixel_major_kernel(shape, str(xq.ty.dtype), zx, dot)
                gv = bb.add_func(kernel, "int8_pack_pixel_major")
                packed = bb.emit(relax.call_tir(gv, [inner], relax.TensorType(shape.packed_shape, dot.act_dtype)))
                z = zx + operand_shift(dot.act_dtype, str(xq.ty.dtype))
            else:
                packed, z = pack_conv_activations(bb, xq, zx, self.dot, shape)
            consts = _kernel_constants(pack_oc_weights(w, dot), w, z, b_q, mult)
            # the 8-bit output pixel-major ([N, OH, OW, O], one store per pixel and L channels), seen by the graph
            # through a transposition: a conv_oc_kernel reading it packs the pixel-major tensor (above), residual
            # adds run on it (_residual_add), other consumers fuse the transposition into their own kernel. (No
            # float32 variant for a float32-exact consumer, as the other kernels have: none follows one in ResNet)
            name = f"int8_conv_{dot.name.replace('-', '_')}"
            nhwc = relax.TensorType((shape.n, *shape.out_hw, shape.o), dtype)
            gv = bb.add_func(conv_oc_kernel(shape, zy, dtype, pixel_major=True, kind=dot), name)
            y = bb.emit(relax.call_tir(gv, [packed, *consts], nhwc))
            return relax.op.permute_dims(y, NHWC_TO_NCHW)
        dot = for_row(self.dot, conv_shape(self.dot, x_shape, w.shape, attrs).out_hw[1])
        shape = conv_shape(dot, x_shape, w.shape, attrs)
        packed, z = self._quantized_input(xq, zx, dot, shape) or pack_conv_activations(bb, xq, zx, dot, shape)
        consts = _kernel_constants(pack_conv_weights(w, dot), w, z, b_q, mult)

        def call(kernel: Any, out_dtype: str) -> Any:
            gv = bb.add_func(kernel, f"int8_conv_{dot.name.replace('-', '_')}")
            return bb.emit(
                relax.call_tir(gv, [packed, *consts], relax.TensorType((shape.n, shape.o, *shape.out_hw), out_dtype))
            )

        y = call(conv_kernel(dot, shape, zy, dtype), dtype)
        self.kernel_outputs[y] = lambda center: call(conv_kernel(dot, shape, zy, dtype, center=center), "float32")
        return y

    def _quantized_input(self, xq: Any, zx: int, dot: DotKind, shape: ConvShape) -> tuple[Any, int] | None:
        """xq = quantize(float32 tensor) with scalar constants (a graph input): its quantize and packing as one
        kernel (x86_int8.quantize_pack_kernel); None for anything else."""
        q = self._bound(xq, _Q)
        if q is None or str(q.args[0].ty.dtype) != "float32" or str(q.ty.dtype) not in _INT_RANGE:
            return None
        scale, zero = self._const(q.args[1]), self._const(q.args[2])
        if scale is None or zero is None or scale.size != 1 or zero.size != 1 or int(zero.reshape(())) != zx:
            return None
        if any(not isinstance(d, tvm.tirx.IntImm) for d in q.args[0].ty.shape):
            return None
        kernel = quantize_pack_kernel(dot, shape, float(scale.reshape(())), zx, str(q.ty.dtype))
        gv = self.builder_.add_func(kernel, "int8_quantize_pack")
        packed = self.builder_.emit(
            relax.call_tir(gv, [q.args[0]], relax.TensorType(shape.packed_shape, dot.act_dtype))
        )
        return packed, zx + operand_shift(dot.act_dtype, str(q.ty.dtype))

    def _kernel_call(
        self, packed: Any, consts: list[Any], shape: tuple[int, ...], zy: int, dtype: str, center: int | None = None
    ) -> Any:
        assert self.dot is not None
        n, c, o, h, w = shape
        kernel = pointwise_kernel(self.dot, n, c, o, h, w, zy, dtype, center=center)
        gv = self.builder_.add_func(kernel, f"int8_conv1x1_{self.dot.name.replace('-', '_')}")
        out = relax.TensorType((n, o, h * w), dtype if center is None else "float32")
        return self.builder_.emit(relax.call_tir(gv, [packed, *consts], out))

    def _float_input(self, xq: Any, z: int) -> Any:
        """float32(xq) - z, the input of a float32-exact convolution. When xq comes from a pointwise kernel,
        that kernel writes it directly (one kernel instead of two; the integer output goes if nothing else
        reads it, by dead-code elimination)."""
        reshaped = self._bound(xq, _RESHAPE)
        bound = self.lookup_binding(xq) if isinstance(xq, relax.Var) else None
        make = self.kernel_outputs.get(reshaped.args[0] if reshaped is not None else bound)
        if make is None:
            return relax.op.subtract(relax.op.astype(xq, "float32"), relax.const(float(z), "float32"))
        return make(z) if reshaped is None else relax.op.reshape(make(z), reshaped.args[1])

    def _bias_int32(self, expr: Any) -> tuple[np.ndarray, np.ndarray] | None:
        """(int32 values, scale) of a bias that is dequantize(int32 constant), possibly reshaped."""
        reshaped = self._bound(expr, _RESHAPE)
        dq = self._dq(reshaped.args[0] if reshaped is not None else expr)
        if dq is None:
            return None
        values, scale, zp = (self._const(a) for a in dq.args)
        if values is None or scale is None or values.dtype != np.int32 or (zp is not None and np.any(zp != 0)):
            return None
        return values.reshape(-1), scale


def _fits_int8(wq: np.ndarray, zw: np.ndarray, axis: int) -> bool:
    shifted = wq.astype(np.int32) - _zero_points(zw, wq.ndim, axis)
    return bool(shifted.min() >= -128 and shifted.max() <= 127)


def _zero_points(zw: np.ndarray, ndim: int, axis: int) -> np.ndarray:
    z = zw.astype(np.int32)
    if z.size > 1:
        shape = [1] * ndim
        shape[axis % ndim] = -1
        z = z.reshape(shape)
    return z


def _shift_weights(wq: np.ndarray, zw: np.ndarray, axis: int) -> np.ndarray:
    """Integer weights with the zero point taken out (exact; checked to fit int8 beforehand)."""
    shifted: np.ndarray = (wq.astype(np.int32) - _zero_points(zw, wq.ndim, axis)).astype(np.int8)
    return shifted


def _exact_in_float32(k: int) -> bool:
    """A sum of `k` products (x - zx) * w, |x - zx| <= 255 and |w| <= 128, stays below 2**24 (exact in float32)."""
    return k * 255 * 128 < 2**24


def rewrite_int8(
    mod: Any, layer_names: list[str] | None = None, float_exact: bool = False, dot: DotKind | None = None
) -> tuple[Any, RewriteReport]:
    """Rewrite `mod["main"]`; returns the new module and what became integer or stayed float.

    `float_exact`: convolutions whose accumulator provably stays below 2**24 compute (x - zx) * w in float32:
    exact, twice as fast as int32 multiplies on x86 without a tensorized 8-bit dot product, and the padding
    stays inside the convolution (no pad fused into the producer's epilogue; see docs/int8.md, Tuning).
    `dot`: requantized 1x1 convolutions become one tensorized x86 kernel with that 8-bit dot product.
    """
    rw = _Rewriter(mod.clone(), layer_names or [], float_exact, dot)  # the caller's module stays as it is
    func = rw.visit_expr(mod["main"])
    mod = rw.builder_.get()  # the module plus the kernels the rewrite added
    mod["main"] = func
    return relax.transform.DeadCodeElimination()(mod), rw.report


@relax.expr_functor.mutator
class _Signed(relax.PyExprMutator):  # type: ignore[misc]
    def __init__(self, mod: Any) -> None:
        super().__init__(mod)
        self.changed = 0

    def visit_call_(self, call: Any) -> Any:  # noqa: N802 (TVM's visitor naming)
        new = self.visit_expr_post_order(call)
        if new.op not in (_Q, _DQ):
            return new
        quantize = new.op == _Q
        data, scale, zp = new.args
        z = _value(zp)
        if quantize:  # an activation quantized to uint8 (a constant is a weight: int8_rewrite shifts those)
            if str(new.ty.dtype) != "uint8" or isinstance(data, tvm.ir.expr.Constant) or z is None:
                return new
        elif str(call.args[0].ty.dtype) != "uint8" or str(data.ty.dtype) != "int8" or z is None:
            return new  # a dequantize reads the int8 tensor a rewritten quantize now makes
        signed = relax.const((z.astype(np.int16) - 128).astype(np.int8))
        self.changed += 1
        axis = int(new.attrs.axis)
        if quantize:
            return relax.op.quantize(data, scale, signed, axis, "int8")
        return relax.op.dequantize(data, scale, signed, axis, str(new.attrs.out_dtype))


def signed_activations(mod: Any) -> Any:
    """Every uint8 activation (value q, zero point z) as int8 (q - 128, z - 128): the same real numbers, the
    same integers 128 lower (quantize is clip(round(x / s) + z); dequantize (q - z) * s). CUDA's INT8 tensor
    cores and dp4a multiply int8 by int8, so int8_rewrite would otherwise shift each uint8 input to int8 in a
    kernel of its own before the convolution or classifier that reads it (fused with its pad, where it has one);
    here the producers' requantize writes int8 directly. The x86 dot products want uint8 and keep it."""
    rw = _Signed(mod.clone())
    func = rw.visit_expr(mod["main"])
    if not rw.changed or str(func.ret_ty) != str(mod["main"].ret_ty):
        return mod  # nothing to do, or a uint8 output that the caller reads as such
    mod = rw.builder_.get()
    mod["main"] = func
    return mod


@stage("int8-rewrite")
def int8_rewrite_stage(ctx: BuildContext) -> None:
    """Turn the imported QDQ graph's fake-quant conv/matmul into integer compute."""
    # CPUs: 1x1 convolutions on the profile's 8-bit dot product (x86_int8.py); the other convolutions in
    # float32-exact accumulation (TVM's int8 convolution multiplies int32, at half the rate of float32 FMAs).
    # GPUs: int8 operands, which nvcc turns into dp4a
    exact = ctx.profile.device == "cpu"
    names = quantizable_layers(ctx.model.proto)
    if not exact:
        ctx.ir = signed_activations(ctx.ir)
    ctx.ir, report = rewrite_int8(ctx.ir, names, float_exact=exact, dot=dot_kind(ctx.profile))
    ctx.float_left = report.float_left

"""NHWC activations for the CUDA profiles: the `nhwc-layout` stage.

With NHWC activations and OHWI weights the implicit GEMM's K axis is (ky, kx, c), contiguous in c, so the
tensor-core schedule (cuda/tensorcore.py) gathers im2col rows as vectors from global memory and stores
its output tile channel-contiguous. TVM's `ConvertLayout` converts the convolutions and carries the
layout through the ops that have a layout rule; it wraps every op without one (`nn.pad`, `clip`,
`quantize`, `dequantize` in TVM 0.27) in a transpose back to NCHW and another one forward. An INT8 graph
has such ops between every pair of convolutions (requantize's clip, the zero-point pad, the Q/DQ around
pooling and residual adds), so ConvertLayout alone would put two transposes between each pair of layers.

`sink_permutes` then moves each remaining transpose down through the layout-agnostic ops after it
(elementwise ops with scalar or per-channel constant operands, per-tensor Q/DQ, `pad` with its widths
permuted, pooling with its layout attribute changed) until it meets its inverse, where both vanish.
Layout changes no value: the INT8 graph computes the same bytes (tests/host/test_gpu_build.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax

from ..config import Knobs
from ..stage import BuildContext, stage

_PERMUTE = tvm.ir.Op.get("relax.permute_dims")
_CONV = tvm.ir.Op.get("relax.nn.conv2d")
_UNARY = {tvm.ir.Op.get(f"relax.{n}") for n in ("astype", "round", "clip", "negative", "abs", "nn.relu")}
_BINARY = {tvm.ir.Op.get(f"relax.{n}") for n in ("add", "subtract", "multiply", "divide", "maximum", "minimum")}
_QDQ = {tvm.ir.Op.get("relax.quantize"), tvm.ir.Op.get("relax.dequantize")}
_PAD = tvm.ir.Op.get("relax.nn.pad")
_POOL = {tvm.ir.Op.get("relax.nn.max_pool2d"), tvm.ir.Op.get("relax.nn.avg_pool2d")}
_REDUCE = {tvm.ir.Op.get(f"relax.{n}") for n in ("mean", "sum", "max", "min")}
TO_NCHW = (0, 3, 1, 2)  # permute_dims axes that turn NHWC into NCHW


def _calls(mod: Any, keep: Any) -> int:
    """How many calls in the module's Relax functions satisfy `keep`."""
    count = 0

    def visit(e: Any) -> None:
        nonlocal count
        if isinstance(e, relax.Call) and keep(e):
            count += 1

    for f in mod.functions.values():
        if isinstance(f, relax.Function):
            relax.analysis.post_order_visit(f, visit)
    return count


def _axes(call: Any) -> tuple[int, ...] | None:
    axes = call.attrs.axes
    return None if axes is None else tuple(int(a) for a in axes)


def _small_constant(expr: Any) -> np.ndarray | None:
    if isinstance(expr, tvm.ir.expr.Constant):  # relax.const(...)
        return np.asarray(expr.value.numpy())
    return None


@relax.expr_functor.mutator
class _SinkPermutes(relax.PyExprMutator):  # type: ignore[misc]
    """`f(permute_dims(u, P))` -> `permute_dims(f'(u), P)` for layout-agnostic f; inverse pairs cancel."""

    def _permuted(self, expr: Any) -> tuple[Any, tuple[int, ...]] | None:
        if not isinstance(expr, relax.Var):
            return None
        bound = self.lookup_binding(expr)
        if isinstance(bound, relax.Call) and bound.op == _PERMUTE and _axes(bound) is not None:
            return bound.args[0], _axes(bound)  # type: ignore[return-value]
        return None

    def _sunk(self, inner: Any, perm: tuple[int, ...]) -> Any:
        return relax.op.permute_dims(self.builder_.emit(inner), list(perm))

    def visit_call_(self, call: Any) -> Any:  # noqa: C901 (one case per op family)
        call = super().visit_call_(call)
        if not isinstance(call.op, tvm.ir.Op) or not call.args:
            return call
        first = self._permuted(call.args[0])
        if first is None:
            return call
        u, perm = first
        rank = len(perm)
        inverse = tuple(int(i) for i in np.argsort(perm))
        if call.op == _PERMUTE:
            axes = _axes(call)
            if axes is None:
                return call
            composed = tuple(perm[a] for a in axes)
            return u if composed == tuple(range(rank)) else relax.op.permute_dims(u, list(composed))
        if call.op in _UNARY:
            return self._sunk(relax.Call(call.op, [u, *call.args[1:]], call.attrs), perm)
        if call.op in _QDQ:
            scale, zero = (_small_constant(a) for a in call.args[1:3])
            if scale is None or zero is None or scale.size != 1 or zero.size != 1:
                return call  # per-channel Q/DQ would need its axis remapped: none sits between convolutions
            return self._sunk(relax.Call(call.op, [u, *call.args[1:]], call.attrs), perm)
        if call.op in _BINARY:
            other = call.args[1]
            moved = self._permuted(other)
            if moved is not None and moved[1] == perm:
                other = moved[0]
            else:
                value = _small_constant(other)
                if value is None or value.ndim not in (0, rank):
                    return call
                if value.ndim == rank:
                    other = relax.const(np.ascontiguousarray(value.transpose(inverse)), str(value.dtype))
            return self._sunk(relax.Call(call.op, [u, other], call.attrs), perm)
        if call.op == _PAD:
            widths = [int(w) for w in call.attrs.pad_width]
            if len(widths) != 2 * rank:
                return call
            moved_widths = [0] * (2 * rank)
            for i, j in enumerate(perm):  # axis i of the permuted tensor is axis j of u
                moved_widths[2 * j : 2 * j + 2] = widths[2 * i : 2 * i + 2]
            a = call.attrs
            return self._sunk(relax.op.nn.pad(u, moved_widths, str(a.pad_mode), float(a.pad_value)), perm)
        if call.op in _REDUCE and call.attrs.axis is not None:
            reduced = [int(a) % rank for a in call.attrs.axis]
            reduce = getattr(relax.op, call.op.name.rsplit(".", 1)[-1])
            moved_axes = [perm[a] for a in reduced]
            if bool(call.attrs.keepdims):  # same rank: the transpose moves below it
                return self._sunk(reduce(u, moved_axes, keepdims=True), perm)
            kept = [perm[i] for i in range(rank) if i not in reduced]
            if kept != sorted(kept):  # the result would need a transpose of its own
                return call
            return reduce(u, moved_axes, keepdims=False)
        if call.op in _POOL and perm == TO_NCHW and str(call.attrs.layout) == "NCHW":
            a = call.attrs
            pool = relax.op.nn.max_pool2d if call.op.name.endswith("max_pool2d") else relax.op.nn.avg_pool2d
            args = [list(a.pool_size), list(a.strides), list(a.padding), list(a.dilation), bool(a.ceil_mode)]
            return self._sunk(pool(u, *args, bool(a.count_include_pad), "NHWC", "NHWC"), perm)
        return call


def _each_function(mod: Any, mutator: Any) -> Any:
    """`mod` with each Relax function rewritten by a new `mutator(mod)`."""
    for name, func in mod.functions.items():
        if isinstance(func, relax.Function):
            mod[name] = mutator(mod).visit_expr(func)
    return mod


def sink_permutes(mod: Any) -> Any:
    mod = _each_function(mod, _SinkPermutes)
    return relax.transform.DeadCodeElimination()(mod)


@relax.expr_functor.mutator
class _WidenChannels(relax.PyExprMutator):  # type: ignore[misc]
    """An NHWC convolution with fewer than 4 input channels (the RGB stem) gets its input padded to 4
    channels and zero weights for the new ones: the same sums, but every im2col element of the gather
    is one 4-channel pixel (one 32-bit INT8 / 64-bit FP16 load) instead of 3 separate bytes with
    index arithmetic of their own. The stem was the slowest kernel of ResNet-18 on the H200 (INT8
    batch 64: 0.255 of 1.951 ms; FP16: 0.697 of 2.025 ms; docs/gpu.md "NHWC")."""

    def visit_call_(self, call: Any) -> Any:
        call = super().visit_call_(call)
        if call.op != _CONV or int(call.attrs.groups) != 1 or str(call.attrs.data_layout) != "NHWC":
            return call
        weight = _small_constant(call.args[1])
        if weight is None or str(call.attrs.kernel_layout) != "OHWI" or weight.shape[3] >= 4:
            return call
        extra = 4 - weight.shape[3]
        data = call.args[0]
        padded = relax.op.nn.pad(data, [0, 0, 0, 0, 0, 0, 0, extra], "constant", 0.0)
        w = np.concatenate([weight, np.zeros((*weight.shape[:3], extra), weight.dtype)], axis=3)
        return relax.Call(call.op, [self.builder_.emit(padded), relax.const(w, str(w.dtype))], call.attrs)


def widen_channels(mod: Any) -> Any:
    return _each_function(mod, _WidenChannels)


def _space_to_depth_weight(w: np.ndarray, kh2: int, kw2: int) -> np.ndarray:
    """OHWI weights of a stride-2 convolution as those of the stride-1 convolution over the 2x2
    space-to-depth input: zero taps up to an even kernel, then tap (2i + dy, 2j + dx, c) at (i, j, (dy, dx, c))."""
    o, kh, kw, c = w.shape
    padded = np.pad(w, ((0, 0), (0, 2 * kh2 - kh), (0, 2 * kw2 - kw), (0, 0)))
    return np.ascontiguousarray(
        padded.reshape(o, kh2, 2, kw2, 2, c).transpose(0, 1, 3, 2, 4, 5).reshape(o, kh2, kw2, 4 * c)
    )


@relax.expr_functor.mutator
class _SpaceToDepth(relax.PyExprMutator):  # type: ignore[misc]
    """A stride-2 NHWC convolution over at most STEM_CHANNELS input channels (the RGB stem, widened to 4)
    becomes a stride-1 convolution over the input's 2x2 space-to-depth rearrangement: 4x the channels, a
    kernel of ceil(k/2) x ceil(k/2) (ResNet's 7x7 stem: 4x4 over 16 channels, the added taps' weights zero).
    The same products in the same sums, so INT8 gives the same bytes; the rearrangement is a reshape and a
    transpose that FuseOps fuses into the kernel producing the input (its quantize or cast). What it buys: each
    im2col element of the gather is 16 contiguous channels (one 16-byte INT8 / two FP16 loads) instead of
    one 4-channel pixel, and K = 256 is a whole number of 64-deep stages instead of 196 padded to 224.
    (MLPerf's ResNet-50 submissions do the same for the same reason.)"""

    STEM_CHANNELS = 4

    def visit_call_(self, call: Any) -> Any:  # noqa: N802 (TVM's visitor naming)
        call = super().visit_call_(call)
        a = call.attrs
        if call.op != _CONV or int(a.groups) != 1 or (str(a.data_layout), str(a.kernel_layout)) != ("NHWC", "OHWI"):
            return call
        if str(a.out_layout) != "NHWC" or [int(s) for s in a.strides] != [2, 2] or any(int(d) != 1 for d in a.dilation):
            return call
        weight = _small_constant(call.args[1])
        shape = call.args[0].ty.shape
        if weight is None or weight.shape[3] > self.STEM_CHANNELS or shape is None:
            return call
        if not all(isinstance(v, tvm.tirx.IntImm) for v in shape):
            return call
        n, h, w, c = (int(v) for v in shape)
        top, left, bottom, right = (int(p) for p in a.padding)
        _, kh, kw, _ = weight.shape
        kh2, kw2 = (kh + 1) // 2, (kw + 1) // 2
        oh, ow = (h + top + bottom - kh) // 2 + 1, (w + left + right - kw) // 2 + 1
        # rows/columns the stride-1 convolution reads past the padded input meet zero weights only
        extra_h, extra_w = 2 * (oh + kh2 - 1) - (h + top + bottom), 2 * (ow + kw2 - 1) - (w + left + right)
        if extra_h < 0 or extra_w < 0:
            return call
        data = call.args[0]
        if top or left or bottom + extra_h or right + extra_w:
            widths = [0, 0, top, bottom + extra_h, left, right + extra_w, 0, 0]
            data = self.builder_.emit(relax.op.nn.pad(data, widths, "constant", 0.0))
        h2, w2 = (h + top + bottom + extra_h) // 2, (w + left + right + extra_w) // 2
        data = self.builder_.emit(relax.op.reshape(data, [n, h2, 2, w2, 2, c]))
        data = self.builder_.emit(relax.op.permute_dims(data, [0, 1, 3, 2, 4, 5]))
        data = self.builder_.emit(relax.op.reshape(data, [n, h2, w2, 4 * c]))
        w2d = _space_to_depth_weight(weight, kh2, kw2)
        return relax.op.nn.conv2d(
            data,
            relax.const(w2d, str(w2d.dtype)),
            strides=[1, 1],
            padding=[0, 0, 0, 0],
            data_layout="NHWC",
            kernel_layout="OHWI",
            out_layout="NHWC",
            out_dtype=a.out_dtype,
        )


def space_to_depth(mod: Any) -> Any:
    return _each_function(mod, _SpaceToDepth)


def to_nhwc(mod: Any, knobs: Knobs = Knobs()) -> Any:
    """Every convolution (and the ops between them) in NHWC/OHWI. A graph with depthwise or grouped
    convolutions keeps NCHW: they get no tensor cores, and mixing layouts would put a transpose between
    every pair of layers (MobileNet). The RGB stem then reads 4-channel pixels (widen_channels) and, where it has
    stride 2, their 2x2 space-to-depth rearrangement (_SpaceToDepth, Knobs.space_to_depth)."""
    if _calls(mod, lambda c: c.op == _CONV and int(c.attrs.groups) != 1):
        return mod
    mod = relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "OHWI"]})(mod)
    mod = relax.transform.FoldConstant()(mod)  # the weights' and per-channel constants' transposes
    mod = widen_channels(sink_permutes(mod))
    return space_to_depth(mod) if knobs.space_to_depth else mod


def transposes(mod: Any) -> int:
    """permute_dims calls left in the module's Relax functions (constants folded)."""
    return _calls(mod, lambda c: c.op == _PERMUTE)


@stage("nhwc-layout")
def nhwc_layout(ctx: BuildContext) -> None:
    """fp16 and int8 (tensor cores); fp32 has no tensor-core path here (no TF32 WMMA in 0.27), and its
    kernels stay as measured."""
    if ctx.cuda.tensor_cores and ctx.precision in ("fp16", "int8"):
        ctx.ir = to_nhwc(ctx.ir, ctx.cuda.knobs)

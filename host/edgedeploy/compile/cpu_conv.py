"""The `cpu-direct-conv` stage: FP32 convolutions of x86 CPU profiles on a hand-scheduled kernel.

TVM 0.27 has no CPU schedule for conv2d (no topi x86 schedules, dlight covers GEMV and reductions), so an
untuned convolution is a scalar loop nest (ResNet-18: 8.4 s per image) and a MetaSchedule database has to be
searched per model and CPU. This stage gives every K x K, strided or padded convolution (ungrouped, NCHW,
output channels in blocks of 8) the INT8 kernels' loop nest in float32 (compile/int8/x86_int8.py,
`float_conv_kernel`): the input padded once and split into stride phases, 8 output channels x L pixels of one
row in registers, an FMA per tap and input channel against a broadcast weight. 1x1 stride-1 convolutions
(MobileNet's pointwise layers) and depthwise ones are left to TVM and the tuning databases.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax

from .int8.x86_int8 import (
    DotKind,
    conv_eligible,
    conv_shape,
    float_conv_kernel,
    float_kind,
    for_row,
    pack_conv_activations,
    pack_conv_weights,
)
from .stage import BuildContext, stage

_CONV = tvm.ir.Op.get("relax.nn.conv2d")


@relax.expr_functor.mutator
class _DirectConv(relax.PyExprMutator):  # type: ignore[misc]
    def __init__(self, mod: Any, kind: DotKind) -> None:
        super().__init__(mod)
        self.kind = kind
        self.count = 0

    def visit_call_(self, call: Any) -> Any:  # noqa: N802 (TVM's visitor naming)
        call = self.visit_expr_post_order(call)
        if call.op != _CONV or not isinstance(call.args[1], tvm.ir.expr.Constant):
            return call
        a, x = call.attrs, call.args[0]
        w = np.asarray(call.args[1].value.numpy())
        layouts = (a.data_layout, a.kernel_layout, a.out_layout) == ("NCHW", "OIHW", "NCHW")
        pointwise = w.shape[2:] == (1, 1) and all(int(s) == 1 for s in a.strides) and not any(int(p) for p in a.padding)
        if not layouts or pointwise or w.dtype != np.float32 or str(x.ty.dtype) != "float32":
            return call
        if not conv_eligible(self.kind, a, w.shape):
            return call
        kind = for_row(self.kind, conv_shape(self.kind, tuple(int(d) for d in x.ty.shape), w.shape, a).out_hw[1])
        shape = conv_shape(kind, tuple(int(d) for d in x.ty.shape), w.shape, a)
        packed, _ = pack_conv_activations(self.builder_, x, 0, kind, shape)
        gv = self.builder_.add_func(float_conv_kernel(kind, shape), f"conv_{kind.name.replace('-', '_')}")
        self.count += 1
        out = relax.TensorType((shape.n, shape.o, *shape.out_hw), "float32")
        return relax.call_tir(gv, [packed, relax.const(pack_conv_weights(w, kind))], out)


def direct_convolutions(mod: Any, kind: DotKind) -> tuple[Any, int]:
    """`mod` with its eligible FP32 convolutions on `float_conv_kernel`; and how many there were."""
    rw = _DirectConv(mod.clone(), kind)
    func = rw.visit_expr(mod["main"])
    mod = rw.builder_.get()
    mod["main"] = func
    return relax.transform.DeadCodeElimination()(mod), rw.count


@stage("cpu-direct-conv")
def cpu_direct_conv(ctx: BuildContext) -> None:
    """FP32 K x K convolutions of x86 profiles on the hand-scheduled kernel (a no-op elsewhere)."""
    kind = float_kind(ctx.profile)
    if kind is not None:
        ctx.ir, _ = direct_convolutions(ctx.ir, kind)

"""Relax pass for CUDA builds: an INT8 convolution pads its own input with the zero point.

int8_rewrite pads a convolution's integer input explicitly with its zero point (`nn.pad` with `pad_value=z`,
then `conv2d` with no padding), because `conv2d` can only pad with 0. TVM's FuseOps never fuses a producer
into a convolution, so on the GPU every such pad was a kernel of its own that wrote the padded tensor and
read it back: ResNet-18 INT8 at batch 64 spent 0.10 ms of its 1.18 in pad kernels on the H200
(docs/gpu.md "What bounds the GEMM kernels"), where FP16, whose convolutions pad themselves, spends none.

`pad_into_conv` replaces each `conv2d(pad(x, z))` whose pad has no other use by one TE function (pad with z,
then TOPI's convolution, as LegalizeOps writes it), so the convolution's PrimFunc holds the pad block the
way an FP16 convolution with padding does: FuseOps fuses the epilogue onto it as usual, and the
tensor-core schedule inlines the pad into its global loads (the window's out-of-image taps read z). The
16-lane z vector this makes is one that TVM 0.27's code generator writes wrongly; cuda_source fixes it.

Tensor-core (NHWC) convolutions only from MIN_BATCH images on. Measured on the H200
(docs/gpu.md "What bounds the GEMM kernels"): at batch 64 the pad kernels (0.141 ms of ResNet-18's 1.17)
go; at batch 1 the layer3/4 convolutions with the pad in their gather took 2-3x longer with the same tiles
(layer4 0.005 -> 0.017 ms), ResNet-18 0.73x. Batches in between are unmeasured; 16 is a guess between the two.

Depthwise convolutions (MobileNet's, NCHW or NHWC) at every batch: cuda_window gives them one thread per
output looping over its window, where the pad is a bounds check, as in an FP16 depthwise convolution. Left
before them, the pad was either a kernel of its own or, where FuseOps fused it into the producing 1x1
convolution's epilogue (the stride-2 layers' asymmetric pads), a kernel the tensor-core rule declines: the
GEMM wrote a padded, larger tensor, so it ran without tensor cores (MobileNetV1-0.25 INT8 batch 64 on the
H200: 0.88 of 2.03 ms in one such kernel, docs/gpu.md "signed activations").
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax, topi

_PAD = tvm.ir.Op.get("relax.nn.pad")
_CONV = tvm.ir.Op.get("relax.nn.conv2d")
MIN_BATCH = 16


def _uses(func: Any) -> dict[Any, int]:
    counts: dict[Any, int] = {}

    def visit(e: Any) -> None:
        if isinstance(e, relax.Call):
            for a in e.args:
                if isinstance(a, relax.Var):
                    counts[a] = counts.get(a, 0) + 1
        elif isinstance(e, relax.Tuple):
            for a in e.fields:
                if isinstance(a, relax.Var):
                    counts[a] = counts.get(a, 0) + 1

    relax.analysis.post_order_visit(func.body, visit)
    return counts


def _padded_conv(x: Any, w: Any, before: list[int], after: list[int], value: int, attrs: Any) -> Any:
    padded = topi.nn.pad(x, before, after, pad_value=value, name="pad")
    return topi.nn.conv(
        padded,
        w,
        attrs.strides,
        [0, 0, 0, 0],
        attrs.dilation,
        int(attrs.groups),
        str(attrs.data_layout),
        str(attrs.kernel_layout),
        str(attrs.out_dtype),
    )


@relax.expr_functor.mutator
class _PadIntoConv(relax.PyExprMutator):  # type: ignore[misc]
    def __init__(self, mod: Any, uses: dict[Any, int]) -> None:
        super().__init__(mod)
        self.uses = uses
        self.fused = 0

    def visit_call_(self, call: Any) -> Any:  # noqa: N802 (TVM's visitor naming)
        call = self.visit_expr_post_order(call)
        if call.op != _CONV or not isinstance(call.args[0], relax.Var) or self.uses.get(call.args[0], 0) != 1:
            return call
        pad = self.lookup_binding(call.args[0])
        a = call.attrs
        if not (isinstance(pad, relax.Call) and pad.op == _PAD and str(pad.attrs.pad_mode) == "constant"):
            return call
        if any(int(p) for p in a.padding) or str(a.out_layout) != str(a.data_layout):
            return call
        if str(pad.args[0].ty.dtype) != "int8" or str(a.out_dtype) != "int32":
            return call
        layout = str(a.data_layout)
        if layout not in ("NHWC", "NCHW"):
            return call
        shape = pad.args[0].ty.shape
        batch, channels = shape[0], shape[layout.index("C")]
        if not isinstance(batch, tvm.tirx.IntImm) or not isinstance(channels, tvm.tirx.IntImm):
            return call
        depthwise = int(a.groups) > 1 and int(a.groups) == int(channels)
        if not depthwise and (layout != "NHWC" or int(batch) < MIN_BATCH):
            return call
        widths = [int(v) for v in pad.attrs.pad_width]
        before, after = widths[0::2], widths[1::2]
        if any(before[i] or after[i] for i in (layout.index("N"), layout.index("C"))):  # only H and W
            return call
        self.fused += 1
        return self.builder_.call_te(
            _padded_conv,
            pad.args[0],
            call.args[1],
            before,
            after,
            int(pad.attrs.pad_value),
            a,
            primfunc_name_hint="conv2d",
        )


@tvm.transform.module_pass(opt_level=0, name="PadIntoConv")  # type: ignore[untyped-decorator]
def pad_into_conv(mod: Any, _ctx: Any) -> Any:
    """The module with every INT8 `conv2d(pad(x, z))` (the pad used only there; NHWC from MIN_BATCH, or
    depthwise) one padding convolution."""
    mod = relax.transform.CanonicalizeBindings()(mod)  # the graph passes a pad's output on as `lv5 = lv7`
    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            rw = _PadIntoConv(mod, _uses(func))
            new = rw.visit_expr(func)
            if rw.fused:
                mod = rw.builder_.get()
                mod[gv] = new
    return relax.transform.DeadCodeElimination()(mod)

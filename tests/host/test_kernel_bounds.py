"""The static bounds check of GPU kernels (compile/kernel_bounds.py): it finds an access past a tensor's
end, accepts one that a guard keeps inside, and proves the kernels of a pad-inside-the-convolution pair
(the gathers whose borders a wrong guard would overrun) inside their tensors, without a GPU."""

from __future__ import annotations

from typing import Any

import tvm
from tvm import te, tirx
from tvm.s_tir import dlight as dl

from edgedeploy.compile.cuda.tensorcore import legalize_passes
from edgedeploy.compile.kernel_bounds import check_function, check_module
from tests.host.cuda import TARGET
from tests.host.models import pointwise_then_depthwise


def _shifted(guarded: bool) -> Any:
    """B[i, j] = A[i, j + 1] over a 4x8 tensor, scheduled one thread per output: the last column reads
    one element past A unless `guarded` (then it reads 0 there)."""
    a = te.placeholder((4, 8), name="A", dtype="float32")

    def value(i: Any, j: Any) -> Any:
        return tirx.if_then_else(j < 7, a[i, j + 1], 0.0) if guarded else a[i, j + 1]

    b = te.compute((4, 8), value, name="B")
    target = tvm.target.Target(TARGET)
    mod = tvm.IRModule({"main": te.create_prim_func([a, b]).with_attr("target", target)})
    with target:
        return dl.ApplyDefaultSchedule(dl.gpu.Fallback())(mod)["main"]


def test_an_access_past_the_end_is_reported_with_its_bounds() -> None:
    target = tvm.target.Target(TARGET)
    [found] = check_function("shift", _shifted(guarded=False), target)
    assert (found.kernel, found.tensor, found.access, found.low, found.high, found.size) == (
        "shift", "A", "load", 1, 32, 32,
    )  # fmt: skip
    assert "outside its 32 elements" in str(found)
    assert check_function("shift", _shifted(guarded=True), target) == []


def test_padding_convolutions_are_proven_inside_their_tensors() -> None:
    """MobileNet's pair after pad_into_conv: the depthwise convolution's window reads past the image's
    border only where its guard substitutes the zero point; the 1x1 convolution on tensor cores pads M."""
    target = tvm.target.Target(TARGET)
    with target:
        mod = tvm.transform.Sequential(legalize_passes(target))(pointwise_then_depthwise(3))
    kernels, found = check_module(mod, target)
    assert kernels == 2 and found == [], [str(f) for f in found]

"""Injective CUDA kernels (compile/cuda_injective.py): the INT8 zero-point pad and its casts get 4 contiguous
elements per thread instead of dlight Fallback's one (whose int64 index arithmetic made the pads 0.64 ms
of NHWC INT8 ResNet-18's 2.27 ms at batch 64 on the H200)."""

from __future__ import annotations

import re

import pytest

tvm = pytest.importorskip("tvm")
from tvm import relax  # noqa: E402

from edgedeploy.compile.cuda_injective import vector_lanes  # noqa: E402
from edgedeploy.compile.cuda_tensorcore import legalize_passes  # noqa: E402
from tests.host.test_cuda_window import TARGET  # noqa: E402


def _scheduled(dtype: str, channels: int) -> str:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 56, 56, channels), "uint8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = relax.op.astype(relax.op.subtract(relax.op.astype(x, "int16"), relax.const(128, "int16")), dtype)
            p = bb.emit(relax.op.nn.pad(a, [0, 0, 1, 1, 1, 1, 0, 0], pad_value=-128.0))
            out = bb.emit_output(p)
        bb.emit_func_output(out)
    target = tvm.target.Target(TARGET)
    with target:
        mod = tvm.transform.Sequential(legalize_passes(target))(bb.get())
    return "\n".join(f.script() for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc))


@pytest.mark.parametrize(("dtype", "channels", "lanes"), [("int8", 64, 4), ("float32", 64, 4), ("int8", 6, 2)])
def test_pad_and_casts_get_contiguous_vectors_per_thread(dtype: str, channels: int, lanes: int) -> None:
    script = _scheduled(dtype, channels)
    assert re.search(rf"T\.vectorized\(T\.int64\({lanes}\)\)", script), script


def test_lanes_divide_the_innermost_axis() -> None:
    assert vector_lanes(64, 1) == 4
    assert vector_lanes(3, 1) == 1  # e.g. an RGB image's channels: Fallback keeps it
    assert vector_lanes(6, 2) == 2
    assert vector_lanes(1000, 8) == 2  # at most 16 bytes

"""Injective CUDA kernels (compile/cuda/injective.py): the INT8 zero-point pads and the uint8 -> int8 shift move
16 bytes per thread (four 32-bit words) instead of dlight Fallback's one element, whose int64 index arithmetic
made the pads 0.64 ms of NHWC INT8 ResNet-18's 2.27 ms at batch 64 on the H200; other dtypes get 4 elements.

Checked on the CUDA source TVM writes (no GPU, no nvcc needed): the TIR said `T.vectorized(4)` before this
was tested, but the bounds check over a fused index made TVM write a loop of single bytes."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
import tvm
from tvm import relax

from edgedeploy.compile.cuda.injective import byte_words, vector_lanes
from tests.host.cuda import (
    TARGET,
    cuda_source,
)

SHIFT = "shift"  # uint8 -> int8 (x - 128), as int8_rewrite emits before an INT8 convolution


def _graph(shape: tuple[int, ...], dtype: str, shift: bool, pad: list[int] | None, pad_value: float = -128.0) -> Any:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "uint8" if shift else dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            y: Any = x
            if shift:
                y = relax.op.astype(relax.op.subtract(relax.op.astype(x, "int16"), relax.const(128, "int16")), dtype)
            if pad is not None:
                y = relax.op.nn.pad(y, pad, pad_value=pad_value)
            out = bb.emit_output(bb.emit(y))
        bb.emit_func_output(out)
    return bb.get()


NHWC_PAD = [0, 0, 1, 1, 1, 1, 0, 0]


@pytest.mark.compile
@pytest.mark.parametrize(("shift", "pad"), [(True, NHWC_PAD), (False, NHWC_PAD), (True, None)])
def test_byte_kernels_move_16_bytes_per_load_and_store(shift: bool, pad: list[int] | None) -> None:
    src = cuda_source(_graph((8, 56, 56, 64), "int8", shift, pad))
    assert "signed char" not in src.split("__global__")[-1], src  # no byte access left in the kernel
    assert re.search(r"= \*\(int4\*\)\(", src), src  # one 16-byte load...
    assert re.search(r"^\s*\*\(int4\*\)\(", src, re.M), src  # ...and one 16-byte store per thread
    if shift:
        assert "^" in src  # the shift is an XOR of the words


@pytest.mark.compile
def test_float_pad_gets_4_element_vectors() -> None:
    src = cuda_source(_graph((8, 56, 56, 64), "float32", False, NHWC_PAD, 0.0))
    assert re.search(r"= \*\(float4\*\)\(", src), src
    assert re.search(r"^\s*\*\(float4\*\)\(", src, re.M), src


def _fused_kernel(mod: Any) -> Any:
    passes = [
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
    ]
    mod = tvm.transform.Sequential(passes)(mod)
    (func,) = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    return func


def _run_on_cpu(func: Any, x: np.ndarray, out_shape: tuple[int, ...], out_dtype: str) -> np.ndarray:
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target="llvm")
    out = tvm.runtime.tensor(np.zeros(out_shape, out_dtype))
    lib["main"](tvm.runtime.tensor(x), out)
    return out.numpy()


@pytest.mark.compile
@pytest.mark.parametrize(
    ("shift", "pad", "pad_value", "dtype"),
    [
        (True, NHWC_PAD, -128.0, "int8"),
        (True, NHWC_PAD, -3.0, "int8"),
        (False, NHWC_PAD, 7.0, "uint8"),
        (True, None, 0.0, "int8"),
    ],
)
def test_byte_words_computes_the_same_bytes(shift: bool, pad: list[int] | None, pad_value: float, dtype: str) -> None:
    """The word version of each kernel against the byte version, both compiled for this CPU, on every byte
    value: the same output bit for bit (border and interior)."""
    shape = (2, 5, 6, 64)
    func = _fused_kernel(_graph(shape, dtype, shift, pad, pad_value))
    words = byte_words(func)
    assert words is not None
    x = np.random.default_rng(0).integers(0, 256, shape).astype("uint8" if shift else dtype)
    x.reshape(-1)[:256] = np.arange(256).astype(x.dtype)
    out_shape = (2, 7, 8, 64) if pad else shape
    expected = _run_on_cpu(func, x, out_shape, dtype)
    got = _run_on_cpu(words, x, out_shape, dtype)
    np.testing.assert_array_equal(got, expected)
    if pad:
        assert (expected[:, 0] == np.array(pad_value).astype(dtype)).all()  # the border is the pad value
    if shift:
        assert (expected[:, 1:-1, 1:-1] if pad else expected).ravel()[0] == np.int8(-128)  # 0 - 128


@pytest.mark.parametrize(
    ("shape", "dtype", "shift", "pad"),
    [
        ((2, 5, 6, 6), "int8", True, NHWC_PAD),  # 6 channels: not whole words
        ((2, 5, 6, 64), "int8", True, [0, 0, 1, 1, 1, 1, 4, 4]),  # the channel axis padded: bytes move
        ((2, 5, 6, 64), "float16", False, NHWC_PAD),  # not bytes
    ],
)
def test_byte_words_leaves_other_kernels(shape: tuple[int, ...], dtype: str, shift: bool, pad: list[int]) -> None:
    assert byte_words(_fused_kernel(_graph(shape, dtype, shift, pad))) is None


def test_lanes_divide_the_innermost_axis() -> None:
    assert vector_lanes(64, 1) == 4
    assert vector_lanes(3, 1) == 1  # e.g. an RGB image's channels: Fallback keeps it
    assert vector_lanes(6, 2) == 2
    assert vector_lanes(1000, 8) == 2  # at most 16 bytes


def _quantize_pad_odd() -> Any:
    """MobileNet's INT8 input kernel in small: quantize NCHW float, then pad H and W by (0, 1) to an odd width."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 3, 20, 20), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            q = relax.op.quantize(x, relax.const(0.0078), relax.const(0, "int8"), axis=1, out_dtype="int8")
            out = bb.emit_output(bb.emit(relax.op.nn.pad(q, [0, 0, 0, 0, 0, 1, 0, 1], pad_value=0.0)))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("ilp", [1, 4])
def test_odd_widths_get_elements_per_thread_where_asked(ilp: int) -> None:
    """Knobs.injective_ilp: an injective kernel whose innermost extent (21) admits no vector is dlight's
    Fallback (1: the rule declines it), or n elements per thread, THREADS apart, the n steps unrolled."""
    from edgedeploy.compile.config import Knobs
    from edgedeploy.compile.cuda.injective import THREADS, VectorizedInjective

    func = _fused_kernel(_quantize_pad_odd())
    sch = VectorizedInjective(Knobs(injective_ilp=ilp)).apply(func, tvm.target.Target(TARGET), False)
    if ilp == 1:
        assert sch is None
        return
    script = sch.mod.script()
    outputs = 2 * 3 * 21 * 21
    assert f'T.thread_binding(T.int64({-(-outputs // (ilp * THREADS))}), thread="blockIdx.x")' in script, script
    assert f'T.thread_binding(T.int64({THREADS}), thread="threadIdx.x")' in script, script
    assert f"T.unroll(T.int64({ilp}))" in script, script

"""An INT8 convolution pads its own input with the zero point on CUDA (compile/cuda/conv_pad.py), and the
16-lane byte vectors that makes compile (compile/cuda/source.py).

The exactness check runs the same graph with and without the pass on the CPU (LLVM): the pass only moves
the pad into the convolution's PrimFunc, so the bytes must be the same. nvcc compiling such a kernel for
sm_75 and sm_72, with IMMA in its SASS, is test_gpu_build's `test_convolutions_run_on_tensor_cores`."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
import tvm
from tvm import relax

from edgedeploy.compile.cuda.conv_pad import MIN_BATCH, pad_into_conv
from edgedeploy.compile.cuda.source import pack_byte_vectors
from edgedeploy.compile.cuda.tensorcore import TensorCoreGemm, legalize_passes
from tests.host.cuda import TARGET
from tests.host.models import ZP, pointwise_then_depthwise


def _padded_conv_model(second_use: bool = False, batch: int = MIN_BATCH) -> Any:
    """pad(x, ZP) then a 3x3 NHWC int8 convolution with no padding and a requantizing epilogue, as
    int8_rewrite and nhwc.py emit for a ResNet layer; `second_use`: the padded tensor is also an output."""
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, (64, 3, 3, 64)).astype("int8")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((batch, 8, 8, 64), "int8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            p = bb.emit(relax.op.nn.pad(x, [0, 0, 1, 1, 1, 1, 0, 0], pad_value=float(ZP)))
            conv = relax.op.nn.conv2d(
                p, relax.const(w), data_layout="NHWC", kernel_layout="OHWI", out_layout="NHWC", out_dtype="int32"
            )
            acc = bb.emit(relax.op.add(bb.emit(conv), relax.const(-ZP * w.reshape(64, -1).sum(1).astype("int32"))))
            y = relax.op.clip(
                relax.op.round(relax.op.multiply(relax.op.astype(acc, "float32"), relax.const(1e-3))), -128, 127
            )
            out = bb.emit(relax.op.astype(y, "int8"))
            result = bb.emit_output(relax.Tuple([out, p]) if second_use else out)
        bb.emit_func_output(result)
    return bb.get()


def _prim_funcs(mod: Any) -> dict[str, Any]:
    return {gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}


def test_the_pad_becomes_part_of_the_convolution() -> None:
    target = tvm.target.Target(TARGET)
    with target:
        fused = tvm.transform.Sequential(legalize_passes(target))(_padded_conv_model())
    funcs = _prim_funcs(fused)
    assert len(funcs) == 1, list(funcs)  # one kernel: pad, convolution and epilogue
    [script] = [str(f.script()) for f in funcs.values()]
    assert "T.int8(-128)" in script and "mma_sync" in script  # the pad value, on tensor cores
    # a pad with another use stays a tensor of its own
    with target:
        kept = tvm.transform.Sequential(legalize_passes(target))(_padded_conv_model(second_use=True))
    assert len(_prim_funcs(kept)) == 2
    # and so does the pad of a small batch (slower inside the convolution at batch 1, measured)
    with target:
        small = tvm.transform.Sequential(legalize_passes(target))(_padded_conv_model(batch=1))
    assert len(_prim_funcs(small)) == 2


def _run_on_cpu(mod: Any, x: np.ndarray) -> np.ndarray:
    ex = tvm.compile(relax.transform.LegalizeOps()(mod), target="llvm")
    return np.asarray(relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy())


@pytest.mark.compile
def test_padding_inside_the_convolution_is_exact() -> None:
    """Same bytes with the pad in the convolution as with the pad before it, borders included (x holds the
    whole int8 range, so a border read as 0 instead of ZP would change them)."""
    mod = _padded_conv_model()
    x = np.random.default_rng(1).integers(-128, 128, (MIN_BATCH, 8, 8, 64)).astype("int8")
    moved = pad_into_conv(mod)
    assert "relax.nn.pad" not in moved.script() and "call_tir" in moved.script()
    np.testing.assert_array_equal(_run_on_cpu(moved, x), _run_on_cpu(mod, x))


def test_byte_vectors_are_packed_into_words() -> None:
    lanes = ", ".join(["(signed char)-128"] * 16)
    code = f"x = make_int4({lanes}); y = make_int4(a, b, c, d); z = make_int2({', '.join(['v[(i + 1)]'] * 8)});"
    fixed = pack_byte_vectors(code)
    assert "y = make_int4(a, b, c, d);" in fixed  # 32-bit lanes: as they were
    x_call = re.search(r"x = make_int4\((.*?)\); y", fixed)
    assert x_call and x_call.group(1).count("__edgedeploy_pack4(") == 4
    assert re.search(r"z = make_int2\(__edgedeploy_pack4\(v\[\(i \+ 1\)\],", fixed)
    assert (
        fixed.count("static __device__") == 1 and pack_byte_vectors("make_int4(a, b, c, d)") == "make_int4(a, b, c, d)"
    )


@pytest.mark.compile
def test_the_padded_convolution_keeps_16_byte_loads() -> None:
    """The tensor-core schedule inlines the pad into its global loads and keeps them 16 bytes wide: the
    out-of-image vector is 16 copies of ZP, which the source fix packs into four words."""
    from tests.host.cuda import cuda_source

    rule = TensorCoreGemm()
    src = cuda_source(_padded_conv_model(), rule)
    assert rule.seen and re.search(r"= \*\(int4\*\)\(x_ptr", src), src[:3000]
    assert "make_int4(__edgedeploy_pack4((signed char)-128" in src


@pytest.mark.parametrize("batch", [1, 64])
def test_a_depthwise_convolution_pads_itself_and_its_producer_keeps_tensor_cores(batch: int) -> None:
    target = tvm.target.Target(TARGET)
    with target:
        fused = tvm.transform.Sequential(legalize_passes(target))(pointwise_then_depthwise(batch))
    funcs = {name: str(f.script()) for name, f in _prim_funcs(fused).items()}
    assert len(funcs) == 2 and not any("pad" in name for name in funcs), list(funcs)  # no pad kernel, none fused
    [pointwise] = [s for s in funcs.values() if "mma_sync" in s]  # the 1x1 convolution on tensor cores
    [depthwise] = [s for s in funcs.values() if s is not pointwise]
    assert "T.int8(-128)" in depthwise and "T.int8(-128)" not in pointwise
    # without the pass FuseOps puts the pad into the 1x1 convolution's epilogue (a GEMM writing a larger,
    # padded tensor: the tensor-core rule declined it, and MobileNet's such layers ran without tensor cores)
    unscheduled = legalize_passes(target)[1:-1]  # LegalizeOps .. FuseTIR, without pad_into_conv
    assert pad_into_conv not in unscheduled
    with target:
        before = tvm.transform.Sequential(unscheduled)(pointwise_then_depthwise(batch))
    names = list(_prim_funcs(before))
    assert any(n.startswith("fused_conv2d") and n.endswith("_pad") for n in names), names


@pytest.mark.compile
def test_a_depthwise_convolution_padding_itself_is_exact() -> None:
    """The same bytes with the pad inside the depthwise convolution, the asymmetric border included."""
    mod = pointwise_then_depthwise(2)
    x = np.random.default_rng(3).integers(-128, 128, (2, 32, 14, 14)).astype("int8")
    moved = pad_into_conv(mod)
    assert "relax.nn.pad" not in moved.script()
    np.testing.assert_array_equal(_run_on_cpu(moved, x), _run_on_cpu(mod, x))

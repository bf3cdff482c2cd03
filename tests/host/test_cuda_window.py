"""CUDA schedules of window reductions (compile/cuda/window.py): pooling gets one thread per output, not one
thread block per output (dlight's reduction rules did that: 12.97 ms of ResNet-18 INT8's 15.9 ms at batch 64)."""

from __future__ import annotations

import re

import pytest
import tvm
from tvm import relax

from edgedeploy.compile.cuda.tensorcore import legalize_passes
from tests.host.cuda import TARGET
from tests.host.models import pool_model


def _blocks(batch: int, classes: int) -> dict[str, tuple[list[int], list[int]]]:
    """(thread-block counts, threads per block) of each kernel of max pool + quantize, and of a softmax over
    `classes`."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((batch, 64, 112, 112), "float32"))
    logits = relax.Var("logits", relax.TensorType((batch, classes), "float32"))
    with bb.function("main", [x, logits]):
        with bb.dataflow():
            p = bb.emit(relax.op.nn.max_pool2d(x, pool_size=(3, 3), strides=(2, 2), padding=(1, 1, 1, 1)))
            q = bb.emit(relax.op.quantize(p, relax.const(0.05), relax.const(0, "int8"), axis=1, out_dtype="int8"))
            s = bb.emit(relax.op.nn.softmax(logits))
            out = bb.emit_output((q, s))
        bb.emit_func_output(out)
    target = tvm.target.Target(TARGET)
    with target:
        mod = tvm.transform.Sequential(legalize_passes(target))(bb.get())

    def extents(script: str, axis: str) -> list[int]:
        return [int(n) for n in re.findall(rf'T.int64\((\d+)\), thread="{axis}"', script)]

    return {
        gv.name_hint: (extents(f.script(), "blockIdx.x"), extents(f.script(), "threadIdx.x"))
        for gv, f in mod.functions.items()
        if isinstance(f, tvm.tirx.PrimFunc)
    }


def test_pooling_gets_a_thread_per_output_and_long_reductions_keep_dlight() -> None:
    blocks = _blocks(batch=8, classes=1000)
    outputs = 8 * 64 * 56 * 56
    grid, threads = blocks["fused_max_pool2d_quantize"]
    # one thread per output (dlight's Fallback: 1024 a block; window_with_epilogue, the default: 256), not
    # `outputs` blocks of 256 threads as dlight's reduction rule gave
    assert grid and threads and -(-outputs // max(threads)) == max(grid), blocks
    # a softmax over 1000 classes is a long reduction: dlight's reduction rule, one block per row
    assert max(blocks["softmax"][0]) == 8, blocks


def _pool_script(shape: tuple[int, ...], layout: str, dtype: str = "int8") -> str:
    target = tvm.target.Target(TARGET)
    with target:
        mod = tvm.transform.Sequential(legalize_passes(target))(pool_model(shape, layout, dtype))
    return "\n".join(f.script() for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc))


@pytest.mark.parametrize(("dtype", "channels", "lanes"), [("int8", 64, 16), ("float16", 64, 8), ("int8", 24, 8)])
def test_nhwc_pooling_takes_16_bytes_of_channels_per_thread_with_the_max_in_registers(
    dtype: str, channels: int, lanes: int
) -> None:
    """ResNet-18's INT8 max pooling (NHWC, 64 channels): each thread reads 16 channels per window tap and keeps
    the running max in a register (before: one byte per thread and the max kept in global memory, 9 read-
    modify-writes per output); fewer lanes where the channels do not divide; NCHW pooling (channels not
    innermost) keeps one output per thread."""
    nhwc = _pool_script((8, 112, 112, channels), "NHWC", dtype)
    assert f"T.vectorized(T.int64({lanes}))" in nhwc and 'scope="local"' in nhwc, nhwc
    blocks = -(-8 * 56 * 56 * channels // lanes // 256)
    assert re.findall(r'T.int64\((\d+)\), thread="blockIdx.x"', nhwc) == [str(blocks)]
    nchw = _pool_script((8, 64, 112, 112), "NCHW")
    assert "T.vectorized" not in nchw and 'scope="local"' not in nchw


@pytest.mark.compile
@pytest.mark.parametrize("knob", [0, 1])
def test_a_depthwise_convolution_and_its_epilogue_are_one_kernel_with_the_knob(knob: int) -> None:
    """Knobs.window_epilogue: the window sum stays in a register and the requantize runs on it (1), or
    dlight's Fallback stores it to global memory for a second kernel (0, the default until measured). Either
    way every access stays inside its tensor (kernel_bounds) and nvcc compiles the source."""
    from edgedeploy.compile.config import Knobs
    from edgedeploy.compile.cuda.tensorcore import TensorCoreGemm
    from edgedeploy.compile.kernel_bounds import check_module
    from tests.host.cuda import cuda_source
    from tests.host.models import pointwise_then_depthwise

    target = tvm.target.Target(TARGET)
    rule = TensorCoreGemm(Knobs(window_epilogue=knob))
    with target:
        mod = tvm.transform.Sequential(legalize_passes(target, rule))(pointwise_then_depthwise(8))
    [depthwise] = [f.script() for f in mod.functions.values() if "group_conv2d" in str(f.script())]
    assert depthwise.count('thread="blockIdx.x"') == (1 if knob else 2)
    assert ('"int32", scope="local"' in depthwise) == bool(knob)  # the window sum in a register
    assert check_module(mod, target)[1] == []
    src = cuda_source(pointwise_then_depthwise(8), TensorCoreGemm(Knobs(window_epilogue=knob)))
    assert src.count('extern "C" __global__') == (2 if knob else 3) * 2  # declaration + definition each

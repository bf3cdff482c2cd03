"""int8_boundaries: no float tensor between the kernels of an INT8 CUDA build where FuseOps had put a
dequantize at the end of its producer (a residual block's downsampling shortcut, the last block before the
average pool), and the same results."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tvm


def _fused(mod: Any, move: bool) -> Any:
    """The module after FuseOps, through the CUDA builds' own passes (cuda_tensorcore.fusion_passes, all but
    the last, FuseTIR), with the dequantizes moved (the knob's default) or not."""

    from edgedeploy.compile.config import Knobs
    from edgedeploy.compile.cuda.tensorcore import fusion_passes

    return tvm.transform.Sequential(fusion_passes(Knobs(int8_boundaries=int(move)))[:-1])(mod)


def _float_between_kernels(mod: Any) -> list[str]:
    """The fused calls in `main` whose result is a float tensor passed on to another call."""
    from tvm import relax

    main = mod["main"]
    floats: dict[Any, str] = {}
    passed = []
    for block in main.body.blocks:
        for b in block.bindings:
            v = b.value
            if isinstance(v, relax.Call) and isinstance(v.op, relax.GlobalVar):
                for a in v.args:
                    if a in floats:
                        passed.append(floats[a])
                if str(getattr(b.var.ty, "dtype", "")) == "float32":
                    floats[b.var] = v.op.name_hint
    return passed


@pytest.fixture(scope="module")
def block_modules(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, np.ndarray]:
    import onnx

    from edgedeploy.compile.cuda.nhwc import to_nhwc
    from tests.host.models import convnet, float_and_int8_modules

    # a basic block with a downsampling shortcut (stem 16 channels, block 32), pooling and a classifier
    model = onnx.load(convnet(tmp_path_factory.mktemp("block") / "block.onnx", width=16, downsample=True))
    calib = np.random.default_rng(5).uniform(0, 1, (6, 3, 32, 32)).astype(np.float32)
    _fp32, int8, report = float_and_int8_modules(model, calib)
    assert len(report.integer) == 5 and report.float_left == []
    return to_nhwc(int8), calib


def test_no_float_tensor_between_int8_kernels(block_modules: tuple[Any, np.ndarray]) -> None:
    from tvm import relax

    mod, _ = block_modules
    before, after = _fused(mod, move=False), _fused(mod, move=True)
    # FuseOps alone: the shortcut's kernel ends with a dequantize (float32 out, for the add), and so does
    # the block's before the average pool
    assert any("down" in n or "dequantize" in n for n in _float_between_kernels(before))
    assert len(_float_between_kernels(before)) >= 2, before["main"].script()
    relax.analysis.well_formed(after)  # (TVM 0.27's raises on an ill-formed module)
    # moved: only the pooled features (the classifier's float input, a float op's result) remain float
    names = [gv.name_hint for gv in after.functions if gv.name_hint.startswith("fused_dequantize")]
    assert len(names) >= 2, names
    assert len(_float_between_kernels(after)) < len(_float_between_kernels(before)), after["main"].script()
    assert not any("conv2d" in n for n in _float_between_kernels(after)), _float_between_kernels(after)


@pytest.mark.compile
def test_moved_dequantize_gives_the_same_results(block_modules: tuple[Any, np.ndarray]) -> None:
    """The same bytes on llvm with and without the move (the dequantize computes the same float either way)."""
    from tvm import relax

    from tests.host.models import run_on_cpu

    mod, calib = block_modules
    outs = []
    for move in (False, True):
        fused = relax.transform.FuseTIR()(_fused(mod, move))
        outs.append(run_on_cpu(fused, calib))
    assert np.array_equal(outs[0], outs[1])


def test_uses_other_than_a_fused_consumer_keep_the_float_result() -> None:
    """A producer whose dequantized result is also returned from main stays as FuseOps made it."""
    from tvm.script import relax as R

    from edgedeploy.compile.cuda.int8_boundaries import dequantize_in_consumers

    @tvm.script.ir_module
    class Two:
        @R.function
        def main(x: R.Tensor((4, 8), "float32")) -> R.Tuple(R.Tensor((4, 8), "float32"), R.Tensor((4, 8), "float32")):
            with R.dataflow():
                q = R.quantize(x, R.const(0.1, "float32"), R.const(0, "int8"), out_dtype="int8")
                d = R.dequantize(q, R.const(0.1, "float32"), R.const(0, "int8"), out_dtype="float32")
                y = R.add(d, x)
                z = R.multiply(y, y)
                R.output(d, z)
            return (d, z)

    fused = _fused(Two, move=False)
    producer = [gv for gv in fused.functions if gv.name_hint.endswith("dequantize")]
    # FuseOps: quantize + dequantize in one kernel, add + multiply in another
    assert producer and any(gv.name_hint == "fused_add_multiply" for gv in fused.functions), fused.script()
    assert dequantize_in_consumers(fused).same_as(fused)

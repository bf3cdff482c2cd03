"""nhwc._SpaceToDepth: a stride-2 convolution over <= 4 channels (the RGB stem) as a stride-1 convolution over
the input's 2x2 space-to-depth rearrangement. Runs on the CPU (llvm): the INT8 graph must give the same bytes
with and without it, the float graph the same values within float32 rounding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest


def _stem_net(path: Path, kernel: int, size: int) -> Path:
    """RGB input, a stride-2 `kernel`x`kernel` convolution with ONNX padding kernel // 2 (ResNet's stem for 7),
    ReLU, a 3x3 convolution, global average pooling, a classifier."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(11)
    inits = [
        numpy_helper.from_array((rng.standard_normal((16, 3, kernel, kernel)) * 0.2).astype(np.float32), "stem.w"),
        numpy_helper.from_array((rng.standard_normal(16) * 0.1).astype(np.float32), "stem.b"),
        numpy_helper.from_array((rng.standard_normal((16, 16, 3, 3)) * 0.1).astype(np.float32), "c1.w"),
        numpy_helper.from_array(rng.standard_normal((16, 10)).astype(np.float32), "fc.w"),
    ]
    p = kernel // 2
    nodes = [
        helper.make_node("Conv", ["x", "stem.w", "stem.b"], ["s"], name="stem", strides=[2, 2], pads=[p] * 4),
        helper.make_node("Relu", ["s"], ["sr"]),
        helper.make_node("Conv", ["sr", "c1.w"], ["c"], name="c1", pads=[1] * 4),
        helper.make_node("Relu", ["c"], ["cr"]),
        helper.make_node("GlobalAveragePool", ["cr"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"]),
        helper.make_node("MatMul", ["flat", "fc.w"], ["y"], name="fc"),
    ]
    graph = helper.make_graph(
        nodes,
        "stem",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


def _stem_weights(mod: object) -> list[tuple[tuple[int, ...], list[int]]]:
    """(weight shape, strides) of every conv2d in main, in order."""
    from tvm import relax

    found: list[tuple[tuple[int, ...], list[int]]] = []

    def visit(e: object) -> None:
        if isinstance(e, relax.Call) and getattr(e.op, "name", "") == "relax.nn.conv2d":
            shape = tuple(int(v) for v in e.args[1].ty.shape)
            found.append((shape, [int(s) for s in e.attrs.strides]))

    relax.analysis.post_order_visit(mod["main"], visit)  # type: ignore[index]
    return found


@pytest.mark.compile
@pytest.mark.parametrize(
    ("kernel", "size"),
    [(7, 32), (7, 33), (3, 30)],  # ResNet's stem; an odd input (one more row and column padded); a 3x3 stem
)
def test_space_to_depth_gives_the_same_results(tmp_path: Path, kernel: int, size: int) -> None:
    import onnx

    from edgedeploy.compile.config import Knobs
    from edgedeploy.compile.cuda.nhwc import to_nhwc
    from tests.host.models import float_and_int8_modules, run_on_cpu

    model = onnx.load(_stem_net(tmp_path / "stem.onnx", kernel, size))
    calib = np.random.default_rng(5).uniform(0, 1, (6, 3, size, size)).astype(np.float32)
    fp32, int8, report = float_and_int8_modules(model, calib)
    assert len(report.integer) == 3 and report.float_left == []

    half = (kernel + 1) // 2
    for mod, exact in ((int8, True), (fp32, False)):
        plain = to_nhwc(mod, Knobs(space_to_depth=0))
        s2d = to_nhwc(mod, Knobs(space_to_depth=1))
        # the stem: (16, k, k, 4) stride 2 (4 channels: widen_channels) -> (16, k/2, k/2, 16) stride 1;
        # the 16-channel convolution after it is left alone
        assert _stem_weights(plain)[0] == ((16, kernel, kernel, 4), [2, 2])
        assert _stem_weights(s2d)[0] == ((16, half, half, 16), [1, 1])
        assert _stem_weights(s2d)[1] == _stem_weights(plain)[1] == ((16, 3, 3, 16), [1, 1])
        before, after = run_on_cpu(plain, calib), run_on_cpu(s2d, calib)
        if exact:
            assert np.array_equal(before, after)
        else:
            np.testing.assert_allclose(after, before, rtol=1e-4, atol=1e-4 * float(np.abs(before).max()))


def test_space_to_depth_weight_layout() -> None:
    """Tap (ky, kx, c) of the stride-2 kernel is tap (ky // 2, kx // 2) at channel (ky % 2, kx % 2, c) of the
    stride-1 one; the taps past the odd kernel's edge are zero."""
    from edgedeploy.compile.cuda.nhwc import _space_to_depth_weight

    w = np.arange(2 * 7 * 7 * 4, dtype=np.int32).reshape(2, 7, 7, 4) + 1
    s = _space_to_depth_weight(w, 4, 4)
    assert s.shape == (2, 4, 4, 16)
    for ky in range(8):
        for kx in range(8):
            for c in range(4):
                want = w[:, ky, kx, c] if ky < 7 and kx < 7 else np.zeros(2, np.int32)
                assert np.array_equal(s[:, ky // 2, kx // 2, (ky % 2) * 8 + (kx % 2) * 4 + c], want)

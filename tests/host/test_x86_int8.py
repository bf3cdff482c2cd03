"""Tensorized INT8 convolutions on x86 (compile/int8/x86_int8.py): exact against numpy, and the same bytes as the
float32-exact graph when they replace its pointwise convolutions in a real MobileNet, or the K x K, strided and
padded convolutions of a residual network."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

from edgedeploy.compile.cards import load_card
from edgedeploy.compile.int8.datasets import load_calibration
from edgedeploy.compile.int8.graph_prep import prepare_float_model
from edgedeploy.compile.int8.quantize import QuantizeOptions, quantizable_layers, quantize_qdq
from edgedeploy.compile.int8.rewrite import rewrite_int8
from edgedeploy.compile.int8.x86_int8 import (
    AVX2,
    AVX2_OC,
    FLOAT_AVX2,
    FLOAT_AVX512,
    VNNI,
    VNNI_256,
    VNNI_OC,
    ConvShape,
    DotKind,
    conv_kernel,
    conv_oc_kernel,
    conv_shape,
    depthwise_kernel,
    dot_kind,
    float_conv_kernel,
    float_kind,
    for_row,
    matvec_kernel,
    max_pool_kernel,
    oc_block,
    pack_activations_numpy,
    pack_channel_weights,
    pack_conv_activations,
    pack_conv_activations_numpy,
    pack_conv_weights,
    pack_depthwise_weights,
    pack_matvec_weights,
    pack_oc_weights,
    pack_pixel_major_kernel,
    pack_weights,
    pack_winograd_weights,
    pointwise_channel_kernel,
    pointwise_kernel,
    quantize_pack_kernel,
    residual_add_kernel,
    winograd_kernel,
)
from edgedeploy.compile.tuning.metaschedule import scheduled_kernels, tunable_tasks
from edgedeploy.profiles import get_profile
from edgedeploy_agent.bundle import TensorSpec, cpu_flags
from tests.helpers import require

# the targets each kind is compiled for: the built-in x86-64-v3 profile's, and an AVX-512 VNNI target such as a
# user's profile would have
TARGETS = {
    AVX2: dict(get_profile("cpu-x86_64").compiler.target),
    VNNI: {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "x86-64-v4", "mattr": ["+avx512vnni"]},
}
TARGETS[VNNI_256] = TARGETS[VNNI]
MNV1_CARD = Path(__file__).resolve().parents[2] / "examples" / "cards" / "mobilenet_v1_0.25_224.toml"


def _runnable(kind: DotKind) -> None:
    missing = f"this CPU has no {kind.cpu_flag}; the {kind.name} kernel cannot run here"
    require(
        f"CPU_{kind.cpu_flag.upper()}", None if kind.cpu_flag in (cpu_flags(Path("/proc/cpuinfo")) or ()) else missing
    )


def test_profiles_choose_their_dot_product() -> None:
    v3 = get_profile("cpu-x86_64")
    assert dot_kind(v3) is AVX2
    features = [*v3.compiler.cpu_features, "avx512f", "avx512bw", "avx512vl", "avx512_vnni"]
    v4 = v3.model_copy(update={"compiler": v3.compiler.model_copy(update={"cpu_features": features})})
    assert dot_kind(v4) is VNNI
    assert dot_kind(get_profile("t4")) is None and dot_kind(get_profile("xavier-agx")) is None
    assert (float_kind(v3), float_kind(v4), float_kind(get_profile("xavier-cpu"))) == (FLOAT_AVX2, FLOAT_AVX512, None)
    # ResNet's 7-pixel rows take the half-width vectors, 14-pixel rows the full ones (as many lanes idle)
    rows = [for_row(k, w) for k in (VNNI, FLOAT_AVX512, AVX2) for w in (7, 14)]
    assert rows == [VNNI_256, VNNI, FLOAT_AVX2, FLOAT_AVX512, AVX2, AVX2]


def _reference(x: np.ndarray, w: np.ndarray, bias: np.ndarray, mult: np.ndarray, zy: int, dtype: str) -> np.ndarray:
    n, c, h, wd = x.shape
    acc = np.einsum("oc,ncp->nop", w.reshape(w.shape[0], c).astype(np.int64), x.reshape(n, c, -1).astype(np.int64))
    y = np.round((acc + bias[None, :, None]).astype(np.float32) * mult[None, :, None]) + zy
    lo, hi = (0, 255) if dtype == "uint8" else (-128, 127)
    return np.clip(y, lo, hi).astype(dtype)


@pytest.mark.compile
@pytest.mark.parametrize("kind", [AVX2, VNNI], ids=lambda k: k.name)
@pytest.mark.parametrize(
    "n,c,o,hw,out",
    [(1, 128, 128, 14, "uint8"), (2, 16, 24, 5, "int8"), (1, 256, 64, 1, "uint8"), (1, 8, 16, 57, "uint8")],
)
def test_pointwise_kernel_is_exact(kind: DotKind, n: int, c: int, o: int, hw: int, out: str) -> None:
    """Full-range uint8 activations and int8 weights, pixel counts that are not a multiple of the lanes, batch 2,
    both output types: the compiled kernel's bytes equal numpy's int64 arithmetic."""
    _runnable(kind)
    rng = np.random.default_rng(n * c + o + hw)
    x = rng.integers(0, 256, (n, c, hw, hw)).astype(np.uint8)
    w = rng.integers(-128, 128, (o, c, 1, 1)).astype(np.int8)
    bias = rng.integers(-5000, 5000, o).astype(np.int32)
    mult = (rng.random(o) * 2e-3).astype(np.float32)
    packed, p = pack_activations_numpy(x, kind), hw * hw
    kernel = pointwise_kernel(kind, n, c, o, hw, hw, 7, out).with_attr("global_symbol", "main")
    lib = tvm.compile(tvm.IRModule({"main": kernel}), target=tvm.target.Target(TARGETS[kind]))
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a, dev) for a in (packed, pack_weights(w, kind), bias, mult)]
    y = tvm.runtime.tensor(np.zeros((n, o, p), out), dev)
    lib(*args, y)
    assert np.array_equal(y.numpy(), _reference(x, w, bias, mult, 7, out))


@pytest.mark.compile
@pytest.mark.parametrize("target", [AVX2, VNNI], ids=lambda k: k.name)
@pytest.mark.parametrize("n,c,o,out", [(1, 256, 1001, "uint8"), (2, 64, 24, "int8"), (1, 2, 33, "int8")])
def test_matvec_kernel_is_exact(target: DotKind, n: int, c: int, o: int, out: str) -> None:
    """The one-pixel kernel (a classifier; lanes over output channels, AVX2's vpmaddwd on every x86 profile):
    output channels that are no multiple of the lanes (MobileNet's 1001), batch 2, a single input channel
    block, compiled for either target: its bytes equal numpy's int64 arithmetic."""
    _runnable(target)
    rng = np.random.default_rng(n * c + o)
    x = rng.integers(0, 256, (n, c, 1, 1)).astype(np.uint8)
    w = rng.integers(-128, 128, (o, c, 1, 1)).astype(np.int8)
    bias = rng.integers(-5000, 5000, o).astype(np.int32)
    mult = (rng.random(o) * 2e-3).astype(np.float32)
    kernel = matvec_kernel(n, c, o, 7, out).with_attr("global_symbol", "main")
    lib = tvm.compile(tvm.IRModule({"main": kernel}), target=tvm.target.Target(TARGETS[target]))
    dev = tvm.cpu()
    packed = x.reshape(n, c // 2, 2).astype(np.int16)
    args = [tvm.runtime.tensor(a, dev) for a in (packed, pack_matvec_weights(w), bias, mult)]
    y = tvm.runtime.tensor(np.zeros((n, o), out), dev)
    lib(*args, y)
    assert np.array_equal(y.numpy(), _reference(x, w, bias, mult, 7, out).reshape(n, o))


@pytest.mark.compile
@pytest.mark.parametrize("kind", [AVX2, VNNI], ids=lambda k: k.name)
@pytest.mark.parametrize(
    "n,c,o,hw,out,center",
    [
        (1, 128, 128, 14, "uint8", None),
        (2, 8, 16, 7, "int8", None),
        (1, 256, 256, 7, "uint8", 3),
        (1, 64, 32, 5, "uint8", None),
    ],
)
def test_pointwise_channel_kernel_is_exact(
    kind: DotKind, n: int, c: int, o: int, hw: int, out: str, center: int | None
) -> None:
    """The 1x1 kernel with lanes over output channels (NHWC in, [N, O/L, P, L] out): full-range activations,
    batch 2, both output types, the float32 output a depthwise kernel reads (y - center), register blocks of
    one and two channel blocks and pixel counts of 5 to 14: its bytes equal numpy's int64 arithmetic."""
    _runnable(kind)
    rng = np.random.default_rng(n * c + o + hw)
    p, lanes = hw * hw, kind.lanes
    x = rng.integers(0, 256, (n, c, hw, hw)).astype(np.uint8)
    w = rng.integers(-128, 128, (o, c, 1, 1)).astype(np.int8)
    bias = rng.integers(-5000, 5000, o).astype(np.int32)
    mult = (rng.random(o) * 2e-3).astype(np.float32)
    kernel = pointwise_channel_kernel(kind, n, c, o, p, 7, out, center).with_attr("global_symbol", "main")
    lib = tvm.compile(tvm.IRModule({"main": kernel}), target=tvm.target.Target(TARGETS[kind]))
    dev = tvm.cpu()
    nhwc = x.transpose(0, 2, 3, 1).reshape(n, p, c // kind.depth, kind.depth).astype(kind.act_dtype)
    args = [tvm.runtime.tensor(a, dev) for a in (nhwc, pack_channel_weights(w, kind), bias, mult)]
    y = tvm.runtime.tensor(np.zeros((n, o // lanes, p, lanes), out if center is None else "float32"), dev)
    lib(*args, y)
    want = _reference(x, w, bias, mult, 7, out)
    got = y.numpy().transpose(0, 1, 3, 2).reshape(n, o, p)
    if center is None:
        assert np.array_equal(got, want)
    else:
        assert np.array_equal(got, want.astype(np.float32) - center)


@pytest.mark.compile
@pytest.mark.parametrize("kind", [AVX2, VNNI], ids=lambda k: k.name)
@pytest.mark.parametrize(
    "n,c,hw,stride,pad,out,store",
    [
        (1, 128, 14, 1, (1, 1, 1, 1), "uint8", None),  # MobileNet's 14x14 layers
        (1, 16, 23, 2, (0, 0, 1, 1), "uint8", "operand"),  # TF-SAME stride 2, odd size
        (2, 8, 9, 1, (1, 1, 1, 1), "int8", "operand"),  # 8 channels (8 lanes on VNNI too), batch 2, shifted to uint8
        (1, 48, 7, 2, (1, 1, 1, 1), "int8", None),  # channels no multiple of 16: 8 lanes
    ],
)
def test_depthwise_kernel_is_exact(
    kind: DotKind, n: int, c: int, hw: int, stride: int, pad: tuple[int, ...], out: str, store: str | None
) -> None:
    """The depthwise kernel with channels in the float32 lanes ([N, C/V, H, W, V] minus the zero point in,
    NHWC out): borders read as the zero point, strides 1 and 2, asymmetric padding, batch 2, both output types,
    and the channel-lane 1x1 kernel's operand (int8 shifted to uint8 for VNNI, int16 for AVX2): its bytes
    equal numpy's int64 arithmetic."""
    _runnable(kind)
    rng = np.random.default_rng(n * c + hw + stride)
    zx, zy = 9, 5
    x = rng.integers(0, 256, (n, c, hw, hw)).astype(np.int64)
    w = rng.integers(-128, 128, (c, 1, 3, 3)).astype(np.int8)
    bias = rng.integers(-5000, 5000, c).astype(np.int32)
    mult = (rng.random(c) * 2e-2).astype(np.float32)
    attrs = SimpleNamespace(strides=[stride, stride], padding=list(pad), dilation=[1, 1])
    shape = conv_shape(kind, (n, c, hw, hw), w.shape, attrs)
    lanes = kind.lanes if c % kind.lanes == 0 else 8
    top, left, bottom, right = pad
    xp = np.pad(x - zx, ((0, 0), (0, 0), (top, bottom), (left, right)))
    (oh, ow), acc = shape.out_hw, 0
    for i in range(3):
        for j in range(3):
            patch = xp[:, :, i : i + stride * (oh - 1) + 1 : stride, j : j + stride * (ow - 1) + 1 : stride]
            acc = acc + patch * w[None, :, 0, i, j, None, None].astype(np.int64)
    lo, hi = (0, 255) if out == "uint8" else (-128, 127)
    want = np.clip(
        np.round((acc + bias[None, :, None, None]).astype(np.float32) * mult[None, :, None, None]) + zy, lo, hi
    )
    shift = 128 if store and kind.act_dtype == "uint8" and out == "int8" else 0
    dtype = kind.act_dtype if store else out
    kernel = depthwise_kernel(lanes, shape, zy, out, dtype if store else None, shift).with_attr("global_symbol", "main")
    lib = tvm.compile(tvm.IRModule({"main": kernel}), target=tvm.target.Target(TARGETS[kind]))
    blocked = (x - zx).astype(np.float32).reshape(n, c // lanes, lanes, hw, hw).transpose(0, 1, 3, 4, 2)
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(np.ascontiguousarray(a), dev) for a in (blocked, pack_depthwise_weights(w, lanes))]
    args += [tvm.runtime.tensor(bias, dev), tvm.runtime.tensor(mult, dev)]
    y = tvm.runtime.tensor(np.zeros((n, oh, ow, c // lanes, lanes), dtype), dev)
    lib(*args, y)
    got = y.numpy().reshape(n, oh, ow, c).transpose(0, 3, 1, 2).astype(np.int64)
    assert np.array_equal(got, want.astype(np.int64) + shift)


@pytest.mark.compile
@pytest.mark.parametrize("kind", [AVX2, VNNI], ids=lambda k: k.name)
@pytest.mark.parametrize(
    "n,hw,k,stride,pad,q_dtype,zero",
    [
        (1, 30, 3, 2, (0, 0, 1, 1), "uint8", 128),  # MobileNet's stem in small: TF-SAME stride 2
        (2, 17, 7, 2, (3, 3, 3, 3), "int8", -3),  # ResNet's stem in small, batch 2, int8 (shifted for VNNI)
        (1, 9, 3, 1, (1, 1, 1, 1), "uint8", 7),  # stride 1
    ],
)
def test_quantize_pack_kernel_is_relax_quantize_and_pack(
    kind: DotKind, n: int, hw: int, k: int, stride: int, pad: tuple[int, ...], q_dtype: str, zero: int
) -> None:
    """The graph input's quantize and packing in one kernel: the same bytes as Relax's quantize followed by
    pack_conv_activations (the ops it replaces), on values far outside the range (clipped) and on halfway cases
    of the rounding."""
    _runnable(kind)
    scale = 0.0078431377
    rng = np.random.default_rng(hw + k)
    x = (rng.standard_normal((n, 3, hw, hw)) * 1.5).astype(np.float32)
    x.flat[:8] = np.array([0.5, 1.5, -0.5, 2.5, 127.5, -1000, 1000, -2.5], np.float32) * np.float32(scale)
    attrs = SimpleNamespace(strides=[stride, stride], padding=list(pad), dilation=[1, 1])
    shape = conv_shape(kind, x.shape, (8, 3, k, k), attrs)
    target = tvm.target.Target(TARGETS[kind])
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(x.shape, "float32"))
    with bb.function("main", [xv]):
        q = bb.emit(
            relax.op.quantize(xv, relax.const(np.float32(scale)), relax.const(np.array(zero, q_dtype)), 1, q_dtype)
        )
        packed, _ = pack_conv_activations(bb, q, zero, kind, shape)
        bb.emit_func_output(packed)
    with target:
        ex = tvm.compile(bb.get(), target=target)
    want = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    kernel = quantize_pack_kernel(kind, shape, scale, zero, q_dtype).with_attr("global_symbol", "main")
    lib = tvm.compile(tvm.IRModule({"main": kernel}), target=target)
    y = tvm.runtime.tensor(np.zeros(shape.packed_shape, kind.act_dtype))
    lib(tvm.runtime.tensor(x), y)
    assert np.array_equal(y.numpy(), want)


def _conv_reference(x: np.ndarray, w: np.ndarray, zx: int, stride: int, pad: tuple[int, ...]) -> np.ndarray:
    """int64 sum over the taps of x padded with its zero point (top, left, bottom, right) times w."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    top, left, bottom, right = pad
    xp = np.full((n, c, h + top + bottom, wd + left + right), zx, np.int64)
    xp[:, :, top : top + h, left : left + wd] = x
    oh, ow = (xp.shape[2] - kh) // stride + 1, (xp.shape[3] - kw) // stride + 1
    acc = np.zeros((n, o, oh, ow), np.int64)
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i : i + stride * (oh - 1) + 1 : stride, j : j + stride * (ow - 1) + 1 : stride]
            acc += np.einsum("oc,nchw->nohw", w[:, :, i, j].astype(np.int64), patch)
    return acc


@pytest.mark.compile
@pytest.mark.parametrize("kind", [AVX2, VNNI, VNNI_256], ids=lambda k: k.name)
@pytest.mark.parametrize(
    "n,c,o,h,w,k,stride,pad,out",
    [
        (1, 16, 8, 9, 9, 3, 1, (1, 1, 1, 1), "uint8"),  # ResNet's 3x3 blocks, 9 pixels a row: a partial lane block
        (2, 5, 16, 11, 7, 3, 2, (1, 1, 1, 1), "int8"),  # stride 2, channels no multiple of K, batch 2
        (1, 3, 8, 20, 20, 7, 2, (3, 3, 3, 3), "uint8"),  # a ResNet stem: 7x7, stride 2, 3 channels
        (1, 12, 16, 10, 10, 1, 2, (0, 0, 0, 0), "uint8"),  # a downsampling shortcut: 1x1, stride 2
        (1, 8, 8, 7, 12, 3, 2, (0, 0, 1, 1), "uint8"),  # TF-SAME: asymmetric padding
        (1, 8, 32, 7, 7, 3, 1, (1, 1, 1, 1), "int8"),  # 7-pixel rows: ymm blocks of 16 channels (register_block)
    ],
)
def test_conv_kernel_is_exact(
    kind: DotKind, n: int, c: int, o: int, h: int, w: int, k: int, stride: int, pad: tuple[int, ...], out: str
) -> None:
    """K x K convolutions on the same dot products: full-range activations padded with a zero point, int8
    weights; the compiled kernel's bytes equal numpy's int64 arithmetic."""
    _runnable(kind)
    rng = np.random.default_rng(c + o + h + k)
    x = rng.integers(0, 256, (n, c, h, w)).astype(np.uint8)
    zx = int(rng.integers(0, 256))
    wq = rng.integers(-128, 128, (o, c, k, k)).astype(np.int8)
    bias = rng.integers(-5000, 5000, o).astype(np.int32)
    mult = (rng.random(o) * 2e-4).astype(np.float32)
    shape = ConvShape(n, c, o, h, w, k, k, stride, pad, kind.lanes, kind.depth)
    packed = pack_conv_activations_numpy(x.astype(kind.act_dtype), zx, kind, shape)
    kernel = conv_kernel(kind, shape, 7, out).with_attr("global_symbol", "main")
    lib = tvm.compile(tvm.IRModule({"main": kernel}), target=tvm.target.Target(TARGETS[kind]))
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a, dev) for a in (packed, pack_conv_weights(wq, kind), bias, mult)]
    y = tvm.runtime.tensor(np.zeros((n, o, *shape.out_hw), out), dev)
    lib(*args, y)
    acc = _conv_reference(x, wq, zx, stride, pad)
    want = np.round((acc + bias[None, :, None, None]).astype(np.float32) * mult[None, :, None, None]) + 7
    lo, hi = (0, 255) if out == "uint8" else (-128, 127)
    assert np.array_equal(y.numpy(), np.clip(want, lo, hi).astype(out))


OC_CASES = [  # n, c, o, h, w, k, stride, pad, out, center
    (1, 64, 32, 7, 7, 3, 1, (1, 1, 1, 1), "uint8", None),  # ResNet's layer4 shape: 7-pixel rows
    (2, 12, 64, 14, 14, 3, 2, (1, 1, 1, 1), "int8", None),  # stride 2, batch 2, two register blocks
    (1, 16, 32, 10, 10, 1, 2, (0, 0, 0, 0), "uint8", None),  # a downsampling shortcut: 1x1, stride 2
    (1, 8, 32, 9, 11, 3, 1, (0, 1, 2, 1), "uint8", None),  # asymmetric padding, 11-pixel rows: 1 a block
    (1, 5, 32, 9, 9, 3, 1, (1, 1, 1, 1), "int8", 3),  # channels no multiple of K; float32 output - center
    (1, 6, 32, 8, 8, 3, 1, (1, 1, 1, 1), "uint8", None),  # rows of 8: AVX2's 2 x 4 block
    (1, 8, 32, 6, 6, 3, 1, (1, 1, 1, 1), "int8", None),  # rows of 6: AVX2's 4 x 2 block
    (1, 4, 8, 9, 9, 3, 1, (1, 1, 1, 1), "int8", None),  # 8 output channels: one AVX2 block of 8 (VNNI: none)
]


@pytest.mark.compile
@pytest.mark.parametrize(
    "kind,n,c,o,h,w,k,stride,pad,out,center",
    [  # each kind with the cases whose output channels make whole register blocks of it
        (kind, *case)
        for kind in (VNNI_OC, AVX2_OC)
        for case in OC_CASES
        if case[2] % (oc_block(kind, case[2], 1)[0] * kind.lanes) == 0
    ],
    ids=lambda v: v.name if isinstance(v, DotKind) else None,
)
@pytest.mark.parametrize("pixel_major", [False, True], ids=["nchw", "nhwc"])
def test_conv_oc_kernel_is_exact(
    kind: DotKind,
    n: int,
    c: int,
    o: int,
    h: int,
    w: int,
    k: int,
    stride: int,
    pad: tuple[int, ...],
    out: str,
    center: int | None,
    pixel_major: bool,
) -> None:
    """conv_oc_kernel (lanes over output channels, the K input channels of a pixel broadcast: VNNI's 16 x 4 uint8 x
    int8, AVX2's 8 x 2 int16 x int16) on conv_kernel's packed activations, its output NCHW or pixel-major: its
    bytes equal numpy's int64 arithmetic, with full-range activations and weights (no int16 saturation)."""
    base_kind = VNNI if kind == VNNI_OC else AVX2
    _runnable(base_kind)
    rng = np.random.default_rng(c + o + h + k + stride)
    x = rng.integers(0, 256, (n, c, h, w)).astype(np.uint8)
    zx = int(rng.integers(0, 256))
    wq = rng.integers(-128, 128, (o, c, k, k)).astype(np.int8)
    wq[0] = -128  # the extremes: vpmaddubsw would saturate 255 * -128 * 2
    bias = rng.integers(-5000, 5000, o).astype(np.int32)
    mult = (rng.random(o) * 2e-4).astype(np.float32)
    base = ConvShape(n, c, o, h, w, k, k, stride, pad, kind.lanes, kind.depth)
    shape = dataclasses.replace(base, lanes=oc_block(kind, o, base.out_hw[1])[1])
    packed = pack_conv_activations_numpy(x.astype(kind.act_dtype), zx, base_kind, shape)
    kernel = conv_oc_kernel(shape, 7, out, center=center, pixel_major=pixel_major, kind=kind)
    lib = tvm.compile(tvm.IRModule({"main": kernel.with_attr("global_symbol", "main")}), target=TARGETS[base_kind])
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a, dev) for a in (packed, pack_oc_weights(wq, kind), bias, mult)]
    dims = (n, *shape.out_hw, o) if pixel_major else (n, o, *shape.out_hw)
    y = tvm.runtime.tensor(np.zeros(dims, out if center is None else np.float32), dev)
    lib(*args, y)
    got = y.numpy().transpose(0, 3, 1, 2) if pixel_major else y.numpy()
    acc = _conv_reference(x, wq, zx, stride, pad)
    want = np.round((acc + bias[None, :, None, None]).astype(np.float32) * mult[None, :, None, None]) + 7
    lo, hi = (0, 255) if out == "uint8" else (-128, 127)
    want = np.clip(want, lo, hi)
    if center is None:
        assert np.array_equal(got, want.astype(out))
    else:
        assert np.array_equal(got, want.astype(np.float32) - center)


@pytest.mark.compile
@pytest.mark.parametrize(
    "n,c,o,h,w,pad,dtype,extreme",
    [
        (1, 64, 32, 7, 7, (1, 1, 1, 1), "uint8", False),  # ResNet's layer4 rows: odd, a partial 2x2 tile
        (2, 12, 16, 14, 14, (1, 1, 1, 1), "int8", False),  # batch 2, int8 activations
        (1, 8, 8, 9, 11, (0, 1, 2, 1), "uint8", False),  # asymmetric padding, one block of 8 channels
        (1, 6, 24, 8, 8, (1, 1, 1, 1), "int8", False),  # 3 blocks of 8 output channels (1 a register block)
        (1, 64, 64, 6, 10, (1, 1, 1, 1), "uint8", False),  # weights of 8 KB a tile position: the 8 x 1 block
        (1, 512, 16, 6, 6, (1, 1, 1, 1), "uint8", True),  # the channel bound: inputs 255, weights +-128 / 127
        (1, 512, 16, 6, 6, (1, 1, 1, 1), "int8", True),  # the same, int8 inputs at -128
    ],
)
def test_winograd_kernel_is_exact(
    n: int, c: int, o: int, h: int, w: int, pad: tuple[int, ...], dtype: str, extreme: bool
) -> None:
    """The AVX2 Winograd F(2x2, 3x3) kernel on a pixel-major 8-bit input: its bytes equal numpy's int64 arithmetic
    of the direct 3x3 convolution (zero point padding), also where every transform and partial sum is at its
    largest (the inputs at the type's end, the weights of an output channel all -128 or all 127, 512 channels)."""
    _runnable(AVX2)
    rng = np.random.default_rng(c + o + h + w)
    lo, hi = (0, 256) if dtype == "uint8" else (-128, 128)
    x = rng.integers(lo, hi, (n, c, h, w)).astype(dtype)
    zx = int(rng.integers(lo, hi))
    wq = rng.integers(-128, 128, (o, c, 3, 3)).astype(np.int8)
    if extreme:
        x[:] = hi - 1 if dtype == "uint8" else lo
        x[..., ::3, ::2] = lo if dtype == "uint8" else hi - 1  # alternating, so that tile transforms reach 4 * 255
        zx = lo
        wq[0], wq[1], wq[2, :, 1] = -128, 127, -128
    bias = rng.integers(-5000, 5000, o).astype(np.int32)
    mult = (rng.random(o) * (2e-4 if not extreme else 2e-8)).astype(np.float32)
    shape = ConvShape(n, c, o, h, w, 3, 3, 1, pad, AVX2.lanes, AVX2.depth)
    kernel = winograd_kernel(shape, dtype, zx, 7, "int8").with_attr("global_symbol", "main")
    lib = tvm.compile(tvm.IRModule({"main": kernel}), target=tvm.target.Target(TARGETS[AVX2]))
    dev = tvm.cpu()
    xin = tvm.runtime.tensor(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), dev)
    args = [xin, *(tvm.runtime.tensor(a, dev) for a in (pack_winograd_weights(wq), bias, mult))]
    y = tvm.runtime.tensor(np.zeros((n, *shape.out_hw, o), np.int8), dev)
    lib(*args, y)
    acc = _conv_reference(x, wq, zx, 1, pad)
    want = np.round((acc + bias[None, :, None, None]).astype(np.float32) * mult[None, :, None, None]) + 7
    assert np.array_equal(y.numpy().transpose(0, 3, 1, 2), np.clip(want, -128, 127).astype(np.int8))


@pytest.mark.compile
@pytest.mark.parametrize("kind", [VNNI_OC, AVX2_OC], ids=lambda k: k.name)
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize(
    "c,h,w,k,stride,pad",
    [(8, 9, 9, 3, 1, (1, 1, 1, 1)), (12, 10, 7, 3, 2, (1, 1, 1, 1)), (4, 10, 10, 1, 2, (0, 0, 0, 0))],
)
def test_pack_pixel_major_kernel_gives_the_packing(
    kind: DotKind, dtype: str, c: int, h: int, w: int, k: int, stride: int, pad: tuple[int, ...]
) -> None:
    """The packing of a pixel-major tensor (conv_oc_kernel's output) equals pack_conv_activations' of the same
    tensor in NCHW: zero point border, stride phases; for VNNI int8 shifted to uint8, for AVX2 widened to int16."""
    base_kind = VNNI if kind == VNNI_OC else AVX2
    rng = np.random.default_rng(c + h + stride)
    lo, hi = (0, 256) if dtype == "uint8" else (-128, 128)
    x = rng.integers(lo, hi, (2, c, h, w)).astype(dtype)
    zx = int(rng.integers(lo, hi))
    base = ConvShape(2, c, 32, h, w, k, k, stride, pad, kind.lanes, kind.depth)
    shape = dataclasses.replace(base, lanes=oc_block(kind, 32, base.out_hw[1])[1])
    kernel = pack_pixel_major_kernel(shape, dtype, zx, kind).with_attr("global_symbol", "main")
    lib = tvm.compile(tvm.IRModule({"main": kernel}), target=tvm.target.Target(TARGETS[AVX2]))
    y = tvm.runtime.tensor(np.zeros(shape.packed_shape, kind.act_dtype))
    lib(tvm.runtime.tensor(np.ascontiguousarray(x.transpose(0, 2, 3, 1))), y)
    shift = 128 if dtype == "int8" and kind == VNNI_OC else 0
    operand = (x.astype(np.int16) + shift).astype(kind.act_dtype)
    want = pack_conv_activations_numpy(operand, zx + shift, base_kind, shape)
    assert np.array_equal(y.numpy(), want)


@pytest.mark.compile
@pytest.mark.parametrize("kind", [FLOAT_AVX2, FLOAT_AVX512], ids=lambda k: k.name)
@pytest.mark.parametrize(
    "n,c,o,h,w,k,stride,pad",
    [
        (2, 5, 16, 11, 7, 3, 2, (1, 1, 1, 1)),
        (1, 3, 8, 20, 20, 7, 2, (3, 3, 3, 3)),
        (1, 64, 8, 9, 9, 3, 1, (1, 1, 1, 1)),
    ],
)
def test_float_conv_kernel_matches_float64(
    kind: DotKind, n: int, c: int, o: int, h: int, w: int, k: int, stride: int, pad: tuple[int, ...]
) -> None:
    """The same loop nest in float32: within float32 rounding of a float64 convolution, relative to the
    output's scale (a tap, channel or row out of place is off by the scale itself)."""
    _runnable(kind)
    rng = np.random.default_rng(c + o + k)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wf = rng.standard_normal((o, c, k, k)).astype(np.float32)
    shape = ConvShape(n, c, o, h, w, k, k, stride, pad, kind.lanes, kind.depth)
    lib = tvm.compile(
        tvm.IRModule({"main": float_conv_kernel(kind, shape).with_attr("global_symbol", "main")}),
        target=tvm.target.Target(TARGETS[AVX2 if kind is FLOAT_AVX2 else VNNI]),
    )
    dev = tvm.cpu()
    args = [
        tvm.runtime.tensor(a, dev)
        for a in (pack_conv_activations_numpy(x, 0, kind, shape), pack_conv_weights(wf, kind))
    ]
    y = tvm.runtime.tensor(np.zeros((n, o, *shape.out_hw), np.float32), dev)
    lib(*args, y)
    want = np.zeros((n, o, *shape.out_hw))
    top, left, bottom, right = pad
    xp = np.pad(x.astype(np.float64), [(0, 0), (0, 0), (top, bottom), (left, right)])
    oh, ow = shape.out_hw
    for i in range(k):
        for j in range(k):
            patch = xp[:, :, i : i + stride * (oh - 1) + 1 : stride, j : j + stride * (ow - 1) + 1 : stride]
            want += np.einsum("oc,nchw->nohw", wf[:, :, i, j].astype(np.float64), patch)
    assert np.abs(y.numpy() - want).max() <= 1e-5 * np.abs(want).max()


@pytest.fixture(scope="module")
def mobilenet_qdq(data_dir: Path) -> tuple[onnx.ModelProto, np.ndarray]:
    model = prepare_float_model(onnx.load(data_dir / "models" / "mobilenet_v1_0.25_224.onnx"))  # as build does
    spec = TensorSpec(name=model.graph.input[0].name, shape=[1, 3, 224, 224], layout="NCHW")
    calib = load_calibration(data_dir / "imagenet-sample", load_card(MNV1_CARD).preprocess, spec, 8)
    return quantize_qdq(model, calib, QuantizeOptions(samples=8)).model, calib


@pytest.mark.compile
@pytest.mark.parametrize("kind", [AVX2, VNNI], ids=lambda k: k.name)
def test_mobilenet_pointwise_layers_on_the_dot_product(
    mobilenet_qdq: tuple[onnx.ModelProto, np.ndarray], kind: DotKind
) -> None:
    """All 13 pointwise convolutions of MobileNetV1 become the tensorized kernel, the classifier the matrix-vector
    kernel; the compiled model gives the same bytes as the float32-exact graph on real images; tuning skips
    those kernels and the manifest's 'kernels from a database' does not count them."""
    _runnable(kind)
    qdq, images = mobilenet_qdq
    name = qdq.graph.input[0].name
    imported = relax.transform.DecomposeOpsForInference()(
        from_onnx(qdq, shape_dict={name: [1, 3, 224, 224]}, keep_params_in_input=False)
    )
    target = tvm.target.Target(TARGETS[kind])
    outputs = []
    for dot in (None, kind):
        mod, report = rewrite_int8(imported, quantizable_layers(qdq), float_exact=True, dot=dot)
        assert report.float_left == []
        kernels = [gv.name_hint for gv in mod.get_global_vars() if gv.name_hint.startswith("int8_conv1x1")]
        calls = mod["main"].script().count("int8_conv1x1")
        assert (len(kernels) > 0, calls) == ((True, 13) if dot else (False, 0))
        assert mod["main"].script().count("int8_matvec") == (1 if dot else 0)  # the 256 -> 1001 classifier
        # the depthwise-separable chain with channels in the lanes: every depthwise layer and every 1x1 one
        chain = [mod["main"].script().count(k) for k in ("int8_depthwise", "int8_conv1x1_oc")]
        assert chain == ([13, 13] if dot else [0, 0])
        assert mod["main"].script().count("int8_quantize_pack") == (1 if dot else 0)  # the input, for the stem
        with target:
            if dot:
                fused = relax.get_pipeline("zero")(mod)
                assert not any(t.task_name.startswith("int8_conv1x1") for t in tunable_tasks(fused, target))
                done, _ = scheduled_kernels(fused)
                assert not any(k.startswith("int8_conv1x1") for k in done)
            ex = tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target))
        vm = relax.VirtualMachine(ex, tvm.cpu())
        outputs.append(np.concatenate([vm["main"](tvm.runtime.tensor(x[None])).numpy() for x in images[:4]]))
    assert np.array_equal(outputs[0], outputs[1])


def _residual_block() -> onnx.ModelProto:
    """conv-relu, conv-relu, conv, + the first relu's output (a residual add), relu, conv: 16 channels, 8x8."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    inits = []
    for i in range(4):
        inits.append(numpy_helper.from_array(rng.normal(0, 0.3, (16, 16, 1, 1)).astype(np.float32), f"w{i}"))
        inits.append(numpy_helper.from_array(rng.normal(0, 0.1, (16,)).astype(np.float32), f"b{i}"))
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], name="conv0"),
        helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
        helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2"),
        helper.make_node("Add", ["c2", "r0"], ["s"], name="residual"),
        helper.make_node("Relu", ["s"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["y"], name="conv3"),
    ]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 16, 8, 8]) for n in ("x", "y")]
    graph = helper.make_graph(nodes, "residual", [io[0]], [io[1]], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.compile
def test_residual_add_keeps_8_bit_tensors_between_layers() -> None:
    """A residual add between integer layers: every tensor passed between kernels is 8-bit (or the next 1x1
    kernel's packed int16), from the input's quantize to the last layer; the output matches the exact INT8
    reference of the same QDQ model to within one output quantization step (not onnxruntime's INT8 run: on
    AVX2-only CPUs its kernels saturate int16 pair sums and land 4 steps away)."""
    from onnx import numpy_helper

    from edgedeploy.compile.int8.qdq_reference import reference_outputs

    rng = np.random.default_rng(4)
    calib = rng.normal(0, 1, (32, 16, 8, 8)).astype(np.float32)
    qdq = quantize_qdq(_residual_block(), calib, QuantizeOptions(samples=32)).model
    imported = relax.transform.DecomposeOpsForInference()(
        from_onnx(qdq, shape_dict={"x": [1, 16, 8, 8]}, keep_params_in_input=False)
    )
    mod, report = rewrite_int8(imported, quantizable_layers(qdq), float_exact=True, dot=AVX2)
    assert report.integer == ["conv0", "conv1", "conv2", "conv3"] and report.float_left == []
    target = tvm.target.Target(TARGETS[AVX2])
    with target:
        fused = relax.get_pipeline("zero")(mod)
        ex = tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target))
    calls = [b.value for b in fused["main"].body.blocks[0].bindings]
    between = [str(c.ty.dtype) for c in calls[:-1]]  # the last call dequantizes the model's float output
    assert between and all(d in ("uint8", "int8", "int16") for d in between), between
    assert any("add" in c.args[0].name_hint for c in calls)  # the residual add is one of these kernels
    vm = relax.VirtualMachine(ex, tvm.cpu())
    x = rng.normal(0, 1, (1, 16, 8, 8)).astype(np.float32)
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    want = reference_outputs(qdq, x)[0]
    out_dq = next(n for n in qdq.graph.node if n.output[0] == "y")
    step = float(next(numpy_helper.to_array(i) for i in qdq.graph.initializer if i.name == out_dq.input[1]))
    assert np.abs(got - want).max() <= step * 1.001


@pytest.mark.compile
@pytest.mark.parametrize("kind", [AVX2, VNNI], ids=lambda k: k.name)
@pytest.mark.parametrize(
    "a, b, y",
    [
        (("uint8", 0.27962536, 116), ("uint8", 0.14428876, 133), ("uint8", 0.14472289, 0)),
        (("uint8", 0.037805967, 0), ("int8", 0.10048359, -3), ("int8", 0.0570848, 7)),
        # halfway cases (0.084 = 4 x 0.021): a kernel that rounds once more or once less than Relax's separate
        # dequantize, add and quantize shows here (a reciprocal multiply: 146 of the 65536 pairs; the kernel's
        # FMA-contracted sum before llvm.arithmetic.fence: 224). The case this replaced (0.5, 0.25 -> 0.75) has
        # no halfway case at all, and passed either way
        (("uint8", 0.021, 0), ("int8", 0.0357, 0), ("uint8", 0.084, 128)),
    ],
)
def test_residual_add_kernel_gives_the_legalized_bytes(
    kind: DotKind, a: tuple[str, float, int], b: tuple[str, float, int], y: tuple[str, float, int]
) -> None:
    """residual_add_kernel against what Relax legalizes quantize(dequantize(a) + dequantize(b)) into, on every
    pair of 8-bit inputs (and a shape whose size is no multiple of the vector): the same bytes."""
    from tvm.script import relax as R

    _runnable(kind)
    target = tvm.target.Target(TARGETS[kind])
    for shape in ((1, 64, 32, 32), (1, 3, 5, 7)):
        grid = np.stack(np.meshgrid(np.arange(256), np.arange(256), indexing="ij")).reshape(2, -1)
        size = int(np.prod(shape))
        pairs = np.resize(grid, (2, size))
        shift = [-128 if t[0] == "int8" else 0 for t in (a, b)]
        xa, xb = ((p + d).astype(t[0]).reshape(shape) for p, d, t in zip(pairs, shift, (a, b), strict=True))

        bb = relax.BlockBuilder()
        va, vb = relax.Var("a", R.Tensor(shape, a[0])), relax.Var("b", R.Tensor(shape, b[0]))
        with bb.function("main", [va, vb]):
            dq = [
                relax.op.dequantize(v, relax.const(t[1], "float32"), relax.const(t[2], t[0]))
                for v, t in ((va, a), (vb, b))
            ]
            s = relax.op.add(*dq)
            q = relax.op.quantize(s, relax.const(y[1], "float32"), relax.const(y[2], y[0]), out_dtype=y[0])
            bb.emit_func_output(bb.emit(q))
        with target:
            ex = tvm.compile(bb.get(), target=target, relax_pipeline=relax.get_default_pipeline(target))
        want = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(xa), tvm.runtime.tensor(xb)).numpy()
        kernel = residual_add_kernel(shape, a, b, y).with_attr("global_symbol", "main")
        lib = tvm.compile(tvm.IRModule({"main": kernel}), target=target)
        got = tvm.runtime.tensor(np.zeros(shape, y[0]))
        lib["main"](tvm.runtime.tensor(xa), tvm.runtime.tensor(xb), got)
        assert np.array_equal(got.numpy(), want)


@pytest.mark.compile
@pytest.mark.parametrize("kind", [AVX2, VNNI], ids=lambda k: k.name)
@pytest.mark.parametrize(
    "shape, dtype, size, stride, pad",
    [
        ((1, 8, 28, 28), "uint8", 3, 2, (1, 1, 1, 1)),  # ResNet's stem pool, in small
        ((2, 3, 9, 11), "int8", 3, 2, (1, 1, 1, 1)),  # odd sizes, batch 2, signed (pads with -128)
        ((1, 4, 8, 8), "uint8", 2, 2, (0, 0, 0, 0)),
        ((1, 4, 7, 10), "int8", 3, 1, (0, 1, 2, 1)),  # stride 1, asymmetric padding
    ],
)
def test_max_pool_kernel_gives_relax_bytes(
    kind: DotKind, shape: tuple[int, int, int, int], dtype: str, size: int, stride: int, pad: tuple[int, ...]
) -> None:
    """max_pool_kernel against Relax's legalized max_pool2d on the same 8-bit input: the same bytes."""
    _runnable(kind)
    target = tvm.target.Target(TARGETS[kind])
    lo, hi = (0, 256) if dtype == "uint8" else (-128, 128)
    x = np.random.default_rng(sum(shape)).integers(lo, hi, shape).astype(dtype)
    bb = relax.BlockBuilder()
    vx = relax.Var("x", relax.TensorType(shape, dtype))
    with bb.function("main", [vx]):
        bb.emit_func_output(bb.emit(relax.op.nn.max_pool2d(vx, size, stride, pad)))
    with target:
        ex = tvm.compile(bb.get(), target=target, relax_pipeline=relax.get_default_pipeline(target))
    want = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    kernel = max_pool_kernel(shape, dtype, (size, size), (stride, stride), pad).with_attr("global_symbol", "main")
    lib = tvm.compile(tvm.IRModule({"main": kernel}), target=target)
    got = tvm.runtime.tensor(np.zeros(want.shape, dtype))
    lib["main"](tvm.runtime.tensor(x), got)
    assert np.array_equal(got.numpy(), want)


def _resnet_stages() -> onnx.ModelProto:
    """A ResNet in small: a 7x7 stride-2 stem (3 -> 16 channels), a depthwise 3x3 (float32-exact: it reads the
    stem kernel's float32 output), a basic block at 64 channels (3x3 convolutions of K = 576 products, past
    float32-exact), a downsampling block (3x3 stride 2 and a 1x1 stride-2 shortcut), a 1x1 convolution."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def conv(x: str, y: str, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, relu: bool = True) -> str:
        w = rng.normal(0, (2 / (cin // groups * k * k)) ** 0.5, (cout, cin // groups, k, k)).astype(np.float32)
        inits.extend(
            [
                numpy_helper.from_array(w, f"{y}.w"),
                numpy_helper.from_array(rng.normal(0, 0.1, cout).astype(np.float32), f"{y}.b"),
            ]
        )
        attrs = {"strides": [stride, stride], "pads": [k // 2] * 4, "group": groups}
        nodes.append(helper.make_node("Conv", [x, f"{y}.w", f"{y}.b"], [f"{y}.c" if relu else y], name=y, **attrs))
        if relu:
            nodes.append(helper.make_node("Relu", [f"{y}.c"], [y], name=f"{y}.relu"))
        return y

    def add_relu(a: str, b: str, y: str) -> str:
        nodes.append(helper.make_node("Add", [a, b], [f"{y}.s"], name=f"{y}.add"))
        nodes.append(helper.make_node("Relu", [f"{y}.s"], [y], name=f"{y}.relu"))
        return y

    x = conv("x", "stem", 3, 16, 7, stride=2)
    x = conv(x, "dw", 16, 16, 3, groups=16)
    x = conv(x, "widen", 16, 64, 1)
    b = conv(conv(x, "b1.conv1", 64, 64, 3), "b1.conv2", 64, 64, 3, relu=False)
    x = add_relu(b, x, "b1")
    b = conv(conv(x, "b2.conv1", 64, 32, 3, stride=2), "b2.conv2", 32, 32, 3, relu=False)
    x = add_relu(b, conv(x, "b2.down", 64, 32, 1, stride=2, relu=False), "b2")
    conv(x, "y", 32, 16, 1, relu=False)
    io = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 30, 30]),
        helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16, 8, 8]),
    ]
    graph = helper.make_graph(nodes, "resnet_stages", [io[0]], [io[1]], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.compile
@pytest.mark.parametrize("kind", [AVX2, VNNI], ids=lambda k: k.name)
def test_residual_network_convolutions_on_the_dot_product(kind: DotKind) -> None:
    """Every convolution but the depthwise one becomes a tensorized kernel (6 K x K, strided or padded ones, on
    VNNI 5 of them conv_oc_kernel's, and 2 pointwise ones; the stem's kernel writes the depthwise layer's float32
    input); the compiled model's outputs
    are the same bytes as without the kernels (float32-exact and int32 convolutions) and within one output step
    of the exact INT8 reference."""
    from onnx import numpy_helper

    from edgedeploy.compile.int8.qdq_reference import reference_outputs

    _runnable(kind)
    rng = np.random.default_rng(6)
    calib = rng.normal(0, 1, (16, 3, 30, 30)).astype(np.float32)
    qdq = quantize_qdq(_resnet_stages(), calib, QuantizeOptions(samples=16)).model
    x = rng.normal(0, 1, (2, 1, 3, 30, 30)).astype(np.float32)

    def check(script: str, dot: DotKind | None) -> None:
        assert (script.count("int8_conv_"), script.count("int8_conv1x1")) == ((6, 2) if dot else (0, 0))
        assert ('out_ty=R.Tensor((1, 16, 15, 15), dtype="float32")' in script) == (dot is not None)
        # the 5 with output channels in blocks of 32 (VNNI) or 8 (AVX2) have the lanes over output channels (not
        # the stem: 3 input channels); on AVX2 the 3 of them with stride 1 are Winograd's
        oc, winograd = (5, 0) if dot is VNNI else (2, 3)
        if dot is not None:
            assert script.count(f"int8_conv_{dot.name.replace('-', '_')}_oc") == oc
            assert script.count("int8_conv_winograd_avx2") == winograd
        # which write pixel-major tensors: the convolutions that read one pack them with pack_pixel_major_kernel
        # (Winograd's reads it as it is)
        assert script.count("int8_pack_pixel_major") == ((4 if dot is VNNI else 2) if dot else 0)

    outputs = _outputs_both_ways(qdq, [1, 3, 30, 30], kind, check, x)
    assert np.array_equal(outputs[0], outputs[1])
    want = np.concatenate([reference_outputs(qdq, xi)[0] for xi in x])
    out_dq = next(n for n in qdq.graph.node if n.output[0] == "y")
    step = float(next(numpy_helper.to_array(i) for i in qdq.graph.initializer if i.name == out_dq.input[1]))
    assert np.abs(outputs[1] - want).max() <= step * 1.001


def _outputs_both_ways(
    qdq: onnx.ModelProto, shape: list[int], kind: DotKind, check: Callable[[str, DotKind | None], None], x: np.ndarray
) -> list[np.ndarray]:
    """The QDQ model rewritten without the kernels (float32-exact and int32 forms) and with `kind`'s, each main's
    script checked by `check(script, dot)`, compiled and run on every input of `x`: the two outputs."""
    imported = relax.transform.DecomposeOpsForInference()(
        from_onnx(qdq, shape_dict={qdq.graph.input[0].name: shape}, keep_params_in_input=False)
    )
    target = tvm.target.Target(TARGETS[kind])
    outputs = []
    for dot in (None, kind):
        mod, report = rewrite_int8(imported, quantizable_layers(qdq), float_exact=True, dot=dot)
        assert report.float_left == []
        check(mod["main"].script(), dot)
        with target:
            ex = tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target))
        vm = relax.VirtualMachine(ex, tvm.cpu())
        outputs.append(np.concatenate([vm["main"](tvm.runtime.tensor(xi)).numpy() for xi in x]))
    return outputs


def _classifier() -> onnx.ModelProto:
    """A ResNet's tail: global average pool, flatten, Gemm (transB = 1) 64 -> 10 with a bias."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(8)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.2, (10, 64)).astype(np.float32), "fc.w"),
        numpy_helper.from_array(rng.normal(0, 0.1, 10).astype(np.float32), "fc.b"),
    ]
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc.w", "fc.b"], ["y"], name="fc", transB=1),
    ]
    io = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64, 4, 4]),
        helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10]),
    ]
    graph = helper.make_graph(nodes, "classifier", [io[0]], [io[1]], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.compile
@pytest.mark.parametrize("kind", [AVX2, VNNI], ids=lambda k: k.name)
def test_classifier_matmul_on_the_matvec_kernel(kind: DotKind) -> None:
    """A Gemm classifier (an int8 matmul after the rewrite, as ResNet-18's) takes matvec_kernel on x86 profiles:
    the same output bytes as TVM's own int8 matmul and requantize."""
    _runnable(kind)
    rng = np.random.default_rng(9)
    calib = rng.normal(0, 1, (16, 64, 4, 4)).astype(np.float32)
    qdq = quantize_qdq(_classifier(), calib, QuantizeOptions(samples=16)).model
    x = rng.normal(0, 1, (4, 1, 64, 4, 4)).astype(np.float32)

    def check(script: str, dot: DotKind | None) -> None:
        assert script.count("int8_matvec") == (1 if dot else 0)

    outputs = _outputs_both_ways(qdq, [1, 64, 4, 4], kind, check, x)
    assert np.array_equal(outputs[0], outputs[1])


@pytest.mark.compile
def test_fp32_convolutions_on_the_direct_kernel_match_onnxruntime() -> None:
    """The cpu-direct-conv stage on the same small ResNet in FP32: the 6 K x K, strided or padded convolutions
    take float_conv_kernel (not the depthwise or the two 1x1 stride-1 ones); outputs within float32 rounding of
    onnxruntime's, relative to the output's scale."""
    import onnxruntime as ort

    from edgedeploy.compile.cpu_conv import direct_convolutions

    _runnable(FLOAT_AVX2)
    model = _resnet_stages()
    imported = relax.transform.DecomposeOpsForInference()(
        from_onnx(model, shape_dict={"x": [1, 3, 30, 30]}, keep_params_in_input=False)
    )
    mod, count = direct_convolutions(imported, FLOAT_AVX2)
    assert count == 6 and mod["main"].script().count("nn.conv2d") == 3
    target = tvm.target.Target(TARGETS[AVX2])
    with target:
        ex = tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target))
    x = np.random.default_rng(7).normal(0, 1, (1, 3, 30, 30)).astype(np.float32)
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.compile
@pytest.mark.parametrize("profile", ["cpu-x86_64", "cpu-x86_64-v4"])
def test_resnet18_int8_bundle_gives_the_exact_reference(data_dir: Path, tmp_path: Path, profile: str) -> None:
    """bench/int8_cpu.py's ResNet-18 INT8 bundle (all 20 convolutions on the profile's kernels: AVX2, or VNNI with
    19 of them conv_oc_kernel's; nothing float) against compile/int8/qdq_reference.py on real photos: within one
    step of the output quantization, the same top-1."""
    import sys

    from onnx import numpy_helper

    from edgedeploy.api import build
    from edgedeploy.build_store import host_file
    from edgedeploy.compile.cards import ModelCard
    from edgedeploy.compile.int8.build import Int8Config
    from edgedeploy.compile.int8.qdq_reference import reference_outputs
    from edgedeploy_agent.bundle import Preprocess, extract_bundle
    from edgedeploy_agent.runtime.tvm import TvmRuntime

    _runnable(AVX2 if profile == "cpu-x86_64" else VNNI)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from resnet18_onnx import export

    model = tmp_path / "resnet18.onnx"
    export(model, seed=0, tiled=True)
    pre = Preprocess(color="rgb", resize="center_crop", mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375])
    card = ModelCard(name="resnet18", preprocess=pre)
    cfg = Int8Config(calibration=data_dir / "imagenet-sample", options=QuantizeOptions(samples=8))
    res = build(model, profile, tmp_path / "r.edb", card, int8=cfg)
    assert res.manifest.quantization.float_in_runtime == []
    m = extract_bundle(res.bundle, tmp_path / "rel")
    qdq = onnx.load(host_file(m, "qdq-onnx", tmp_path / "rel"))
    x = load_calibration(data_dir / "imagenet-sample", pre, m.inputs[0], 4, "evaluation")
    rt = TvmRuntime(tmp_path / "rel", m)
    got = np.concatenate([np.asarray(rt.run([x[i : i + 1]])[0]) for i in range(len(x))])
    want = reference_outputs(qdq, x)[0]
    out_dq = next(n for n in qdq.graph.node if n.output[0] == qdq.graph.output[0].name)
    step = float(next(numpy_helper.to_array(i) for i in qdq.graph.initializer if i.name == out_dq.input[1]))
    assert np.abs(got - want).max() <= step * 1.001
    assert np.array_equal(got.argmax(axis=1), want.argmax(axis=1))

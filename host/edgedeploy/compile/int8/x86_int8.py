"""Pointwise (1x1) INT8 convolutions on x86 with real 8-bit dot products: hand-scheduled, tensorized TIR.

Without these, TVM's int8 convolution widens both operands to int32 (`vpmulld`), slower than float32 FMAs,
and MetaSchedule finds no tensorized schedule for NCHW convolutions (see docs/int8.md). A 1x1 convolution is
a matrix product `acc[o, p] = sum_c W[o, c] * X[c, p]` over the pixels p, so one vector instruction can do
`L` pixels x `K` channels at once if the activations are packed `[C/K, P/L, L, K]` (K channels of one pixel
next to each other) and the K weights of an output channel are broadcast:

| kind | device CPUs (flag in /proc/cpuinfo) | instruction | L x K | operands |
|---|---|---|---|---|
| avx512-vnni | avx512_vnni (Ice Lake, Sapphire Rapids, Zen 4) | vpdpbusd zmm | 16 x 4 | uint8 x int8 |
| avx2 | avx2 (every x86-64-v3 CPU) | vpmaddwd ymm + vpaddd | 8 x 2 | int16 x int16 |

Both are exact: the avx2 kind widens uint8/int8 to int16 first (pair sums stay in int32), which avoids the
int16 saturation of `vpmaddubsw`. The requantize (bias, float32 multiplier, round half to even, zero point,
clip, the arithmetic of onnxruntime's QLinearConv) runs on the accumulators while they are in registers.
The packing is plain Relax ops: the widening cast fuses into the producer's kernel, the reshape/pad/permute
become one small kernel of their own (Relax does not fuse them into a convolution's group).
A profile gets the kind its `cpu_features` promise (the agent refuses devices without them); for VNNI its
LLVM target should enable the instruction too (`mattr = ["+avx512vnni"]`).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...profiles import DeviceProfile


@dataclass(frozen=True)
class DotKind:
    name: str
    cpu_flag: str  # /proc/cpuinfo flag the instruction needs
    lanes: int  # L: pixels per vector (int32 accumulators)
    depth: int  # K: channels summed per lane and instruction
    act_dtype: str  # packed activations
    weight_dtype: str
    intrinsic: str  # registered TensorIntrin name


VNNI = DotKind("avx512-vnni", "avx512_vnni", 16, 4, "uint8", "int8", "edgedeploy_vnni_16x4_u8vec_s8bcast")
AVX2 = DotKind("avx2", "avx2", 8, 2, "int16", "int16", "edgedeploy_avx2_8x2_s16vec_s16bcast")
ACCUMULATOR_ROWS = 8  # output channels per register block: 8 accumulators of L lanes
# float32 convolutions on the same loop nest (conv kernels only, K = 1: an FMA of L pixels by one weight)
FLOAT_AVX2 = DotKind("fp32-avx2", "avx2", 8, 1, "float32", "float32", "")
FLOAT_AVX512 = DotKind("fp32-avx512", "avx512f", 16, 1, "float32", "float32", "")
# vpdpbusd on ymm (AVX512-VL, which every VNNI profile has): for convolutions whose output rows are narrow
VNNI_256 = DotKind("avx512-vnni-256", "avx512_vnni", 8, 4, "uint8", "int8", "edgedeploy_vnni_8x4_u8vec_s8bcast")
_NARROW = {VNNI: VNNI_256, FLOAT_AVX512: FLOAT_AVX2}


def for_row(kind: DotKind, width: int) -> DotKind:
    """`kind`, or its half-width sibling when that leaves fewer lanes idle on an output row of `width` pixels
    (ResNet's 7-pixel rows: 1 of 8 lanes idle against 9 of 16; Zen 4 runs a zmm instruction as two ymm ones)."""
    narrow = _NARROW.get(kind)
    if narrow is None or -(-width // narrow.lanes) * narrow.lanes >= -(-width // kind.lanes) * kind.lanes:
        return kind
    return narrow


def register_block(kind: DotKind, channels: int, row_blocks: int) -> tuple[int, int]:
    """The K x K kernels' register block: (output channels, L-pixel blocks of one output row) it accumulates.
    ACCUMULATOR_ROWS x 1 by default. ymm vpdpbusd: 16 channels where they split so; Zen 4 issues two a cycle,
    each waiting on its accumulator's previous one, and 8 accumulators left ResNet-18's 56- and 7-pixel-row
    layers latency-bound (16: 5-7 % faster; on zmm no gain). AVX2 (16 registers: 16 accumulators spill): 4
    channels x 2 pixel blocks where the row has an even number of blocks, each broadcast weight used twice
    (ResNet-18's 28- and 14-pixel rows: 7-16 % faster)."""
    if kind == VNNI_256 and channels % (2 * ACCUMULATOR_ROWS) == 0:
        return 2 * ACCUMULATOR_ROWS, 1
    if kind == AVX2 and row_blocks % 2 == 0 and channels % (ACCUMULATOR_ROWS // 2) == 0:
        return ACCUMULATOR_ROWS // 2, 2
    return ACCUMULATOR_ROWS, 1


def dot_kind(profile: DeviceProfile) -> DotKind | None:
    """The best 8-bit dot product the profile's CPUs are guaranteed to have (its cpu_features), if any."""
    if profile.arch != "x86_64" or profile.device != "cpu":
        return None
    features = set(profile.compiler.cpu_features)
    return next((k for k in (VNNI, AVX2) if k.cpu_flag in features), None)


def float_kind(profile: DeviceProfile) -> DotKind | None:
    """The widest float32 vector the profile's CPUs are guaranteed to have (its cpu_features), if any."""
    if profile.arch != "x86_64" or profile.device != "cpu":
        return None
    features = set(profile.compiler.cpu_features)
    return next((k for k in (FLOAT_AVX512, FLOAT_AVX2) if k.cpu_flag in features), None)


@functools.cache
def register_intrinsics() -> None:
    """Register the tensor intrinsics with TVM (once per process)."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    def desc_for(kind: DotKind) -> Any:
        lanes, depth, a_t, b_t = kind.lanes, kind.depth, kind.act_dtype, kind.weight_dtype

        @T.prim_func(s_tir=True)
        def desc(
            A: T.Buffer((lanes, depth), a_t, offset_factor=1),
            B: T.Buffer((depth,), b_t, offset_factor=1),
            C: T.Buffer((lanes,), "int32", offset_factor=1),
        ) -> None:
            with T.sblock("root"):
                T.reads(C[0:lanes], A[0:lanes, 0:depth], B[0:depth])
                T.writes(C[0:lanes])
                for i, k in T.grid(lanes, depth):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + T.cast(A[vi, vk], "int32") * T.cast(B[vk], "int32")

        return desc

    def vnni_for(kind: DotKind) -> Any:
        """vpdpbusd on L lanes (zmm for 16, ymm for 8): L x 4 uint8 activations, 4 int8 weights broadcast."""
        lanes, width = kind.lanes, kind.lanes * 32
        intrinsic, acc_t, a_t = f"llvm.x86.avx512.vpdpbusd.{width}", f"int32x{lanes}", f"uint8x{lanes * 4}"
        b_t = f"int8x{lanes * 4}"

        @T.prim_func(s_tir=True)
        def vnni(
            A: T.Buffer((lanes, 4), "uint8", offset_factor=1),
            B: T.Buffer((4,), "int8", offset_factor=1),
            C: T.Buffer((lanes,), "int32", offset_factor=1),
        ) -> None:
            with T.sblock("root"):
                T.reads(C[0:lanes], A[0:lanes, 0:4], B[0:4])
                T.writes(C[0:lanes])
                # LLVM 20 declares the byte operands as <64 x i8> (older LLVMs: <16 x i32>); no local variables
                # here: each would become a heap workspace allocation per tile inside the parallel loop
                C[T.ramp(T.int32(0), 1, lanes)] = T.call_llvm_pure_intrin(
                    T.llvm_lookup_intrinsic_id(intrinsic),
                    C.vload([0], acc_t),
                    A.vload([0, 0], a_t),
                    T.reinterpret(T.broadcast(T.reinterpret(B.vload([0], "int8x4"), dtype="int32"), lanes), dtype=b_t),
                    dtype=acc_t,
                )

        return vnni

    @T.prim_func(s_tir=True)
    def avx2(
        A: T.Buffer((8, 2), "int16", offset_factor=1),
        B: T.Buffer((2,), "int16", offset_factor=1),
        C: T.Buffer((8,), "int32", offset_factor=1),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:8], A[0:8, 0:2], B[0:2])
            T.writes(C[0:8])
            C[T.ramp(T.int32(0), 1, 8)] = C.vload([0], "int32x8") + T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id("llvm.x86.avx2.pmadd.wd"),
                A.vload([0, 0], "int16x16"),
                T.reinterpret(T.broadcast(T.reinterpret(B.vload([0], "int16x2"), dtype="int32"), 8), dtype="int16x16"),
                dtype="int32x8",
            )

    for kind, impl in ((VNNI, vnni_for(VNNI)), (AVX2, avx2), (VNNI_256, vnni_for(VNNI_256))):
        if TensorIntrin.get(kind.intrinsic, allow_missing=True) is None:
            TensorIntrin.register(kind.intrinsic, desc_for(kind), impl)


def pointwise_eligible(kind: DotKind, attrs: Any, weight_shape: tuple[int, ...]) -> bool:
    """A 1x1, stride-1, unpadded, ungrouped NCHW convolution whose input channels split into K-blocks and
    output channels into blocks of ACCUMULATOR_ROWS."""
    o, c, kh, kw = weight_shape
    return (
        (kh, kw) == (1, 1)
        and o % ACCUMULATOR_ROWS == 0
        and int(attrs.groups) == 1
        and all(int(s) == 1 for s in attrs.strides)
        and all(int(d) == 1 for d in attrs.dilation)
        and not any(int(p) for p in attrs.padding)
        and c % kind.depth == 0
    )


def pack_activations(bb: Any, x: Any, zx: int, kind: DotKind) -> tuple[Any, int]:
    """[N, C, H, W] int8/uint8 -> [N, C/K, ceil(HW/L), L, K] in the kind's operand type; returns it and the
    zero point in that type (uint8 operands: int8 activations are shifted by +128, exact)."""
    from tvm import relax

    n, c, h, w = (int(d) for d in x.ty.shape)
    p, lanes, depth = h * w, kind.lanes, kind.depth
    blocks = -(-p // lanes)
    x, zx = _operand_type(bb, x, zx, kind)
    x = bb.emit(relax.op.reshape(x, [n, c // depth, depth, p]))
    if blocks * lanes != p:
        x = bb.emit(relax.op.nn.pad(x, [0, 0, 0, 0, 0, 0, 0, blocks * lanes - p], pad_value=0.0))
    x = bb.emit(relax.op.reshape(x, [n, c // depth, depth, blocks, lanes]))
    return bb.emit(relax.op.permute_dims(x, [0, 1, 3, 4, 2])), zx


def pack_activations_numpy(x: np.ndarray, kind: DotKind) -> np.ndarray:
    """What pack_activations computes, in numpy (for tests and benchmarks of the kernel alone)."""
    n, c, h, w = x.shape
    p, lanes, depth = h * w, kind.lanes, kind.depth
    blocks = -(-p // lanes)
    packed = np.zeros((n, c // depth, depth, blocks * lanes), kind.act_dtype)
    packed[..., :p] = x.reshape(n, c // depth, depth, p)
    return np.ascontiguousarray(packed.reshape(n, c // depth, depth, blocks, lanes).transpose(0, 1, 3, 4, 2))


def pack_weights(w: np.ndarray, kind: DotKind) -> np.ndarray:
    """[O, C, 1, 1] int8 -> [O, C/K, K] in the kind's weight type."""
    o, c = w.shape[:2]
    return w.reshape(o, c // kind.depth, kind.depth).astype(kind.weight_dtype)


def scheduled(sch: Any, name: str) -> Any:
    """A kernel's scheduled PrimFunc, ready for a Relax call_tir: marked scheduled (no default schedule over it),
    named in kernel listings (`edgedeploy.schedule`), and kOpaque (op_pattern 8) so that FuseOps never merges it
    with a neighbour and loses the schedule."""
    func = sch.mod["main"].without_attr("global_symbol")
    func = func.with_attr("tirx.is_scheduled", True).with_attr("edgedeploy.schedule", name)
    return func.with_attr("op_pattern", 8)


def clip_range(dtype: str) -> tuple[float, float]:
    """The values an 8-bit integer type holds, as the float32 bounds a requantize clips to."""
    return (0.0, 255.0) if dtype == "uint8" else (-128.0, 127.0)


def requantized(acc: Any, bias: Any, mult: Any, f: Any, zy: int, out_dtype: str, center: int | None = None) -> Any:
    """Every integer kernel's epilogue for output channel `f`: clip(round((acc + bias[f]) * mult[f]) + zy) in
    out_dtype (uint8 or int8), QLinearConv's arithmetic; with `center`, that value minus `center` in float32 (what
    a float32-exact convolution reads, see int8/rewrite.py)."""
    from tvm import te, tirx

    lo, hi = clip_range(out_dtype)
    y = te.max(te.min(tirx.round((acc + bias[f]).astype("float32") * mult[f]) + float(zy), hi), lo)
    return y.astype(out_dtype) if center is None else y - float(center)


def _output(
    kind: DotKind, extent: int, shape: tuple[Any, ...], tile_shape: tuple[Any, ...], value: Any, name: str
) -> tuple[Any, bool]:
    """The output stage `name` = value(*index), and whether it goes through a tile: where the lanes run along an
    `extent` that is no multiple of L on AVX-512, value fills a local tile of whole L-blocks (`tile_shape`),
    stored under the predicate (_tile_at). Computed under the predicate, the accumulators' v // L, v % L did not
    simplify and were read with gathers (pointwise 128->128 at 14x14: 2.8 us per pixel block against 1.3 at
    16x16, 1.9 with the tile; ResNet-18's 28- and 14-pixel rows). AVX2 has neither the gathers nor masked stores:
    the tile made it slower there."""
    from tvm import te

    if extent % kind.lanes == 0 or kind.cpu_flag != VNNI.cpu_flag:
        return te.compute(shape, value, name=name), False
    tile = te.compute(tile_shape, value, name="tile")
    return te.compute(shape, lambda *i: tile(*i), name=name), True


def _tile_at(sch: Any, loop: Any) -> None:
    """_output's tile computed per block of `loop`, in registers, vectorized."""
    tile = sch.get_sblock("tile")
    sch.compute_at(tile, loop)
    sch.set_scope(tile, 0, "local")
    sch.vectorize(sch.get_loops(tile)[-1])


def pointwise_kernel(
    kind: DotKind, n: int, c: int, o: int, h: int, w: int, zy: int, out_dtype: str, center: int | None = None
) -> Any:
    """The scheduled PrimFunc `(X packed, W packed, bias int32[O], mult float32[O]) -> Y[N, O, H * W]` with
    Y = clip(round((acc + bias) * mult) + zy) in out_dtype (uint8 or int8); with `center`, Y is that value
    minus `center` in float32 (what a float32-exact convolution reads, see int8/rewrite.py)."""
    from tvm import te
    from tvm.s_tir import Schedule

    register_intrinsics()
    lanes, depth, p = kind.lanes, kind.depth, h * w
    blocks, cb = -(-p // lanes), c // depth
    x = te.placeholder((n, cb, blocks, lanes, depth), kind.act_dtype, name="x")
    wt = te.placeholder((o, cb, depth), kind.weight_dtype, name="w")
    bias = te.placeholder((o,), "int32", name="bias")
    mult = te.placeholder((o,), "float32", name="mult")
    rc, rk = te.reduce_axis((0, cb), "rc"), te.reduce_axis((0, depth), "rk")
    acc = te.compute(
        (n, o, blocks, lanes),
        lambda b, f, q, i: te.sum(x[b, rc, q, i, rk].astype("int32") * wt[f, rc, rk].astype("int32"), axis=[rc, rk]),
        name="acc",
    )

    def requantize(b: Any, f: Any, q: Any) -> Any:
        return requantized(acc[b, f, q // lanes, q % lanes], bias, mult, f, zy, out_dtype, center)

    # flat pixels (the caller reshapes to [N, O, H, W], free in Relax): keeps q // L affine for compute_at
    out, tiled = _output(kind, p, (n, o, p), (n, o, blocks * lanes), requantize, "requantize")
    sch = Schedule(te.create_prim_func([x, wt, bias, mult, out]))
    # output loops: (n, o/8, pixel blocks) in parallel, then 8 channels x L pixels from the accumulators
    b, f, q = sch.get_loops(sch.get_sblock("requantize"))
    fo, fi = sch.split(f, [None, ACCUMULATOR_ROWS])
    po, pi = sch.split(q, [None, lanes])
    sch.reorder(b, fo, po, fi, pi)
    if tiled:
        _tile_at(sch, po)
    block = sch.get_sblock("acc")
    sch.compute_at(block, po)
    fa, ia, r, k = sch.get_loops(block)[-4:]
    sch.reorder(r, fa, ia, k)
    sch.parallel(sch.fuse(b, fo, po))
    sch.vectorize(pi)
    sch.decompose_reduction(block, r)
    sch.tensorize(ia, kind.intrinsic)
    sch.unroll(fa)
    return scheduled(sch, f"conv1x1-{kind.name}")


# K x K convolutions (any kernel size, stride and padding): a sum over the taps of 1x1 convolutions on shifted
# inputs, so the same intrinsic and the same 8 x L accumulator block apply. The activations are padded once
# with their zero point and split into stride x stride phases, [C/K, s, s, Hq, Wq, K] (only the phases the taps
# read: ConvShape.phases): output pixel (y, x) reads tap (i, j) at phase (i % s, j % s), position
# (y + i // s, x + j // s), so L consecutive output pixels of a row read L consecutive packed pixels, one vector
# load, for every stride. Lanes run along an output row
# (ceil(OW / L) blocks per row; the lanes past OW read padding and are not stored).


@dataclass(frozen=True)
class ConvShape:
    """A K x K convolution's sizes and what its packed activations look like for one dot kind."""

    n: int
    c: int
    o: int
    h: int
    w: int
    kh: int
    kw: int
    stride: int
    pad: tuple[int, int, int, int]  # top, left, bottom, right
    lanes: int
    depth: int

    @property
    def out_hw(self) -> tuple[int, int]:
        top, left, bottom, right = self.pad
        return (self.h + top + bottom - self.kh) // self.stride + 1, (
            self.w + left + right - self.kw
        ) // self.stride + 1

    @property
    def channel_blocks(self) -> int:
        return -(-self.c // self.depth)

    @property
    def row_blocks(self) -> int:
        return -(-self.out_hw[1] // self.lanes)

    @property
    def phase_hw(self) -> tuple[int, int]:
        """Hq, Wq: every tap of every computed lane is inside, and so is the whole (padded-before) input."""
        s, (oh, _), (top, left) = self.stride, self.out_hw, self.pad[:2]
        hq = max(oh + (self.kh - 1) // s, -(-(top + self.h) // s))
        wq = max(self.row_blocks * self.lanes + (self.kw - 1) // s, -(-(left + self.w) // s))
        return hq, wq

    @property
    def phases(self) -> tuple[int, int]:
        """The stride phases the taps read: tap (i, j) reads (i % s, j % s), so min(s, KH) x min(s, KW) (a 1x1
        stride-2 shortcut reads one of four; packing the other three cost ResNet-18 ~0.25 ms)."""
        return min(self.stride, self.kh), min(self.stride, self.kw)

    @property
    def packed_shape(self) -> tuple[int, ...]:
        return (self.n, self.channel_blocks, *self.phases, *self.phase_hw, self.depth)


def conv_shape(kind: DotKind, x_shape: tuple[int, ...], weight_shape: tuple[int, ...], attrs: Any) -> ConvShape:
    n, c, h, w = x_shape
    o, _, kh, kw = weight_shape
    top, left, bottom, right = (int(p) for p in attrs.padding)
    stride = int(attrs.strides[0])
    return ConvShape(n, c, o, h, w, kh, kw, stride, (top, left, bottom, right), kind.lanes, kind.depth)


def conv_eligible(kind: DotKind, attrs: Any, weight_shape: tuple[int, ...]) -> bool:
    """An ungrouped NCHW convolution with square strides, no dilation and output channels in blocks of
    ACCUMULATOR_ROWS (input channels that are no multiple of K are padded with zero weights)."""
    strides = [int(s) for s in attrs.strides]
    return (
        weight_shape[0] % ACCUMULATOR_ROWS == 0
        and int(attrs.groups) == 1
        and strides[0] == strides[1]
        and all(int(d) == 1 for d in attrs.dilation)
        and len(attrs.padding) == 4
    )


def pack_conv_activations(bb: Any, x: Any, zx: int, kind: DotKind, shape: ConvShape) -> tuple[Any, int]:
    """[N, C, H, W] int8/uint8 -> shape.packed_shape in the kind's operand type, padded with the zero point;
    returns it and the zero point in that type."""
    from tvm import relax

    x, zx = _operand_type(bb, x, zx, kind)
    s, (hq, wq), (top, left) = shape.stride, shape.phase_hw, shape.pad[:2]
    cpad = shape.channel_blocks * shape.depth - shape.c
    width = [0, 0, 0, cpad, top, s * hq - top - shape.h, left, s * wq - left - shape.w]
    x = bb.emit(relax.op.nn.pad(x, width, pad_value=float(zx)))  # padded channels meet zero weights
    x = bb.emit(relax.op.reshape(x, [shape.n, shape.channel_blocks, shape.depth, hq, s, wq, s]))
    if shape.phases != (s, s):
        x = bb.emit(relax.op.strided_slice(x, axes=[4, 6], begin=[0, 0], end=list(shape.phases)))
    return bb.emit(relax.op.permute_dims(x, [0, 1, 4, 6, 3, 5, 2])), zx


def operand_shift(operand_dtype: str, dtype: str) -> int:
    """What 8-bit activations of `dtype` gain in a kernel's `operand_dtype`: +128 for int8 into uint8 operands
    (vpdpbusd's unsigned side; the same real numbers, the zero point 128 higher too), else 0."""
    return 128 if operand_dtype == "uint8" and dtype == "int8" else 0


def _operand_type(bb: Any, x: Any, zx: int, kind: DotKind) -> tuple[Any, int]:
    """x in the kind's operand type, and its zero point there (operand_shift)."""
    from tvm import relax

    shift = operand_shift(kind.act_dtype, str(x.ty.dtype))
    if shift:
        wide = relax.op.add(relax.op.astype(x, "int16"), relax.const(shift, "int16"))
        return bb.emit(relax.op.astype(wide, "uint8")), zx + shift
    if str(x.ty.dtype) != kind.act_dtype:
        return bb.emit(relax.op.astype(x, kind.act_dtype)), zx
    return x, zx


def pack_conv_activations_numpy(x: np.ndarray, zx: int, kind: DotKind, shape: ConvShape) -> np.ndarray:
    """What pack_conv_activations computes, in numpy (x already in the kind's operand type, zx likewise)."""
    s, (hq, wq), (top, left) = shape.stride, shape.phase_hw, shape.pad[:2]
    c = shape.channel_blocks * shape.depth
    padded = np.full((shape.n, c, s * hq, s * wq), zx, kind.act_dtype)
    padded[:, : shape.c, top : top + shape.h, left : left + shape.w] = x
    ph, pw = shape.phases
    blocks = padded.reshape(shape.n, shape.channel_blocks, shape.depth, hq, s, wq, s)[:, :, :, :, :ph, :, :pw]
    return np.ascontiguousarray(blocks.transpose(0, 1, 4, 6, 3, 5, 2))


def pack_conv_weights(w: np.ndarray, kind: DotKind) -> np.ndarray:
    """[O, C, KH, KW] int8 (float32 for a float kind) -> [O, C/K, KH, KW, K] in the kind's weight type (padded
    channels get 0)."""
    o, c, kh, kw = w.shape
    cb = -(-c // kind.depth)
    padded = np.zeros((o, cb * kind.depth, kh, kw), w.dtype)
    padded[:, :c] = w
    return np.ascontiguousarray(padded.reshape(o, cb, kind.depth, kh, kw).transpose(0, 1, 3, 4, 2)).astype(
        kind.weight_dtype
    )


def conv_kernel(kind: DotKind, shape: ConvShape, zy: int, out_dtype: str, center: int | None = None) -> Any:
    """The scheduled PrimFunc `(X packed, W packed, bias int32[O], mult float32[O]) -> Y[N, O, OH, OW]` with
    Y = clip(round((acc + bias) * mult) + zy) in out_dtype, acc summed over the packed (zero point padded)
    activations; the pointwise kernel's accumulator block, with the taps and phases as reduction loops. With
    `center`, Y is that value minus `center` in float32, as pointwise_kernel's."""
    from tvm import te

    bias = te.placeholder((shape.o,), "int32", name="bias")
    mult = te.placeholder((shape.o,), "float32", name="mult")

    def requantize(acc: Any, f: Any) -> Any:
        return requantized(acc, bias, mult, f, zy, out_dtype, center)

    return _direct_conv(kind, shape, [bias, mult], requantize, f"conv-{kind.name}")


def float_conv_kernel(kind: DotKind, shape: ConvShape) -> Any:
    """The same loop nest in float32 (`kind` a FLOAT kind, K = 1): `(X packed, W packed) -> Y[N, O, OH, OW]`,
    L lanes of one output row against a broadcast weight, an FMA per tap and input channel."""
    return _direct_conv(kind, shape, [], lambda acc, f: acc, f"conv-{kind.name}")


def _direct_conv(kind: DotKind, shape: ConvShape, extra: list[Any], epilogue: Any, schedule: str) -> Any:
    """A K x K convolution over packed activations as a scheduled PrimFunc `(X, W, *extra) -> Y[N, O, OH, OW]`,
    Y = epilogue(acc, output channel); integer kinds tensorize the lanes x K block with their intrinsic."""
    from tvm import te
    from tvm.s_tir import Schedule

    lanes, depth, s = kind.lanes, kind.depth, shape.stride
    (oh, ow), cb, n, o = shape.out_hw, shape.channel_blocks, shape.n, shape.o
    acc_dtype = "float32" if kind.act_dtype == "float32" else "int32"
    x = te.placeholder(shape.packed_shape, kind.act_dtype, name="x")
    wt = te.placeholder((o, cb, shape.kh, shape.kw, depth), kind.weight_dtype, name="w")
    # reduction axes of extent 1 are left out: compute_at would not make loops for them
    outer = [
        te.reduce_axis((0, e), name) if e > 1 else None for e, name in ((cb, "rc"), (shape.kh, "ri"), (shape.kw, "rj"))
    ]
    outer.append(te.reduce_axis((0, depth), "rk") if depth > 1 else None)
    rc, ri, rj, rk = (a if a is not None else 0 for a in outer)

    def tap(b: Any, f: Any, y: Any, q: Any, i: Any) -> Any:
        pixel = x[b, rc, ri % s, rj % s, y + ri // s, q * lanes + i + rj // s, rk]
        axes = [a for a in outer if a is not None]
        return te.sum(pixel.astype(acc_dtype) * wt[f, rc, ri, rj, rk].astype(acc_dtype), axis=axes)

    acc = te.compute((n, o, oh, shape.row_blocks, lanes), tap, name="acc")

    def result(b: Any, f: Any, y: Any, v: Any) -> Any:
        return epilogue(acc[b, f, y, v // lanes, v % lanes], f)

    out, tiled = _output(kind, ow, (n, o, oh, ow), (n, o, oh, shape.row_blocks * lanes), result, "out")
    sch = Schedule(te.create_prim_func([x, wt, *extra, out]))
    b, f, y, v = sch.get_loops(sch.get_sblock("out"))
    rows, blocks = register_block(kind, o, shape.row_blocks)
    fo, fi = sch.split(f, [None, rows])
    if blocks > 1:
        vo, vp, vi = sch.split(v, [None, blocks, lanes])
        sch.reorder(b, fo, y, vo, fi, vp, vi)
    else:
        vo, vi = sch.split(v, [None, lanes])
        sch.reorder(b, fo, y, vo, fi, vi)
    if tiled:
        _tile_at(sch, vo)
    block = sch.get_sblock("acc")
    sch.compute_at(block, vo)
    taps, inner = sum(a is not None for a in outer[:3]), int(depth > 1)
    loops = sch.get_loops(block)
    # the accumulator block's loops: channels, (pixel blocks,) lanes, then the taps and K
    first = len(loops) - taps - inner - 2 - int(blocks > 1)
    spatial = loops[first : len(loops) - taps - inner]
    fa, ia = spatial[0], spatial[-1]
    reduction = loops[len(loops) - taps - inner : len(loops) - inner]
    sch.reorder(*reduction, *spatial, *loops[len(loops) - inner :])
    if blocks > 1:
        sch.unroll(spatial[1])
    sch.parallel(sch.fuse(b, fo, y, vo))
    sch.vectorize(vi)
    if acc_dtype == "float32":
        sch.vectorize(ia)
    sch.decompose_reduction(block, reduction[0] if reduction else fa)
    if acc_dtype != "float32":
        register_intrinsics()
        sch.tensorize(ia, kind.intrinsic)
    sch.unroll(fa)
    return scheduled(sch, schedule)


# The residual add between 8-bit layers, quantize(dequantize(a) + dequantize(b)): Relax legalizes it into one
# kernel that TVM leaves unscheduled on CPUs, each step a full-size float32 buffer allocated per call (ResNet-18:
# 0.1-0.3 ms an add at 28x28x128). The same arithmetic, step for step (what the legalized dequantize, add and
# quantize compute: float32((int32) q - z) * s, the sum, round(x / s) + z, clipped), as one pass over the
# elements in vectors of RESIDUAL_LANES; the same bytes (tests/host/test_x86_int8.py checks every input pair).
# 128 lanes (a few registers each): with 16-64, the 64x56x56 adds ran 6x slower (0.3 ms against 0.05; their
# tensors are 49 pages each, so likely loads waiting on 4K-aliased stores; 128x28x28 ran fast with any width)
RESIDUAL_LANES = 128


def residual_add_kernel(
    shape: tuple[int, ...], a: tuple[str, float, int], b: tuple[str, float, int], y: tuple[str, float, int]
) -> Any:
    """The scheduled PrimFunc `(A, B) -> Y` of `shape`, each operand given as (dtype, scale, zero point):
    Y = clip(round((float32(A - za) * sa + float32(B - zb) * sb) / sy) + zy) in Y's dtype."""
    from tvm import te, tirx
    from tvm.s_tir import Schedule

    def dequantize(t: Any, scale: float, zero: int) -> Any:
        def f(*i: Any) -> Any:
            v = t(*i).astype("int32")
            product = (v - zero if zero else v).astype("float32") * tirx.const(scale, "float32")
            # rounded to float32 on its own, as in Relax's separate dequantize: without the fence LLVM contracts
            # one product and the sum into an FMA (one rounding fewer), and 224 of 65536 input pairs came out one
            # step off in halfway cases (tests/host/test_x86_int8.py)
            return tirx.call_llvm_pure_intrin("float32", "llvm.arithmetic.fence", product)

        return te.compute(shape, f, name=f"dq_{t.name}")

    xa, xb = te.placeholder(shape, a[0], name="a"), te.placeholder(shape, b[0], name="b")
    da, db = dequantize(xa, *a[1:]), dequantize(xb, *b[1:])
    total = te.compute(shape, lambda *i: da(*i) + db(*i), name="sum")
    out_dtype, sy, zy = y
    lo, hi = clip_range(out_dtype)

    def quantize(*i: Any) -> Any:
        r = tirx.round(total(*i) / tirx.const(sy, "float32"))
        return te.max(te.min(r + float(zy) if zy else r, hi), lo).astype(out_dtype)

    out = te.compute(shape, quantize, name="quantized")
    sch = Schedule(te.create_prim_func([xa, xb, out]))
    for name in ("dq_a", "dq_b", "sum"):
        sch.compute_inline(sch.get_sblock(name))
    flat = sch.fuse(*sch.get_loops(sch.get_sblock("quantized")))
    size = int(np.prod(shape))
    lanes = next((n for n in (RESIDUAL_LANES, 64, 32, 16, 8) if size % n == 0), 1)
    if lanes > 1:
        sch.vectorize(sch.split(flat, [None, lanes])[1])
    return scheduled(sch, "residual-add")


def max_pool_kernel(
    shape: tuple[int, int, int, int], dtype: str, kernel: tuple[int, int], stride: tuple[int, int], pad: tuple[int, ...]
) -> Any:
    """An NCHW max pool of 8-bit integers as a scheduled PrimFunc `(X) -> Y`, separable: the max over the
    window's rows for one output row (a vector along the input row), then over its columns. Relax's legalized
    max_pool2d pads the whole input into a buffer of its own each call (ResNet-18's stem output: 832 KB,
    0.25 ms a run in the model). Integers and max: exact in any order; the padding is the type's minimum, as
    there (every window holds an input pixel, so it never wins)."""
    from tvm import te, tirx
    from tvm.s_tir import Schedule

    n, c, h, w = shape
    (kh, kw), (sh, sw), (top, left, bottom, right) = kernel, stride, pad
    oh, ow = (h + top + bottom - kh) // sh + 1, (w + left + right - kw) // sw + 1
    x = te.placeholder(shape, dtype, name="x")
    low = tirx.min_value(dtype)

    def window_max(values: list[Any]) -> Any:
        out = values[0]
        for v in values[1:]:
            out = te.max(out, v)
        return out

    def rows(b: Any, f: Any, y: Any, u: Any) -> Any:
        taps = [(sh * y + i - top, i) for i in range(kh)]
        return window_max([tirx.if_then_else(tirx.all(r >= 0, r < h), x[b, f, r, u], low) for r, _ in taps])

    row_max = te.compute((n, c, oh, w), rows, name="rows")

    def cols(b: Any, f: Any, y: Any, v: Any) -> Any:
        taps = [sw * v + j - left for j in range(kw)]
        return window_max([tirx.if_then_else(tirx.all(u >= 0, u < w), row_max[b, f, y, u], low) for u in taps])

    out = te.compute((n, c, oh, ow), cols, name="out")
    sch = Schedule(te.create_prim_func([x, out]))
    b, f, y, v = sch.get_loops(sch.get_sblock("out"))
    sch.parallel(sch.fuse(b, f))
    sch.compute_at(sch.get_sblock("rows"), y)
    sch.vectorize(sch.get_loops(sch.get_sblock("rows"))[-1])
    sch.vectorize(v)
    return scheduled(sch, "max-pool")


# A 1x1 convolution of a single pixel (a classifier after global pooling, MobileNet's 256 -> 1001) is a matrix-
# vector product: the pointwise kernel's lanes run over pixels and would leave all but one idle. Here the lanes
# run over output channels instead: the weights are the vector operand, packed [O/L, C/K, L, K] (zero rows up to
# a multiple of MATVEC_ROWS x L, so any O fits), and K input channels of the pixel are broadcast. The avx2
# intrinsic (vpmaddwd, int16 x int16) serves every x86 profile: both operands are signed after widening, which
# vpdpbusd's uint8 x int8 would not allow with the weights as the vector.
MATVEC_ROWS = 4  # independent accumulators (L output channels each) per step of the input channels


def matvec_eligible(attrs: Any, weight_shape: tuple[int, ...], x_shape: tuple[int, ...]) -> bool:
    """A 1x1, unpadded, ungrouped NCHW convolution of a 1x1 input whose channels split into AVX2's K-blocks."""
    o, c, kh, kw = weight_shape
    return (
        (kh, kw) == (1, 1)
        and tuple(x_shape[2:]) == (1, 1)
        and int(attrs.groups) == 1
        and all(int(d) == 1 for d in attrs.dilation)
        and not any(int(p) for p in attrs.padding)
        and c % AVX2.depth == 0
    )


def matvec_blocks(o: int) -> int:
    """Output-channel blocks of L lanes the packed weights hold (a multiple of MATVEC_ROWS)."""
    step = MATVEC_ROWS * AVX2.lanes
    return -(-o // step) * MATVEC_ROWS


def pack_matvec_weights(w: np.ndarray) -> np.ndarray:
    """[O, C, 1, 1] int8 -> [O/L, C/K, L, K] int16 with zero rows past O."""
    o, c = w.shape[:2]
    lanes, depth, blocks = AVX2.lanes, AVX2.depth, matvec_blocks(o)
    padded = np.zeros((blocks * lanes, c), np.int16)
    padded[:o] = w.reshape(o, c)
    return np.ascontiguousarray(padded.reshape(blocks, lanes, c // depth, depth).transpose(0, 2, 1, 3))


def matvec_kernel(n: int, c: int, o: int, zy: int, out_dtype: str) -> Any:
    """The scheduled PrimFunc `(X int16[N, C/K, K], W packed, bias int32[O], mult float32[O]) -> Y[N, O]` with
    Y = clip(round((acc + bias) * mult) + zy) in out_dtype, the pointwise kernel's requantize."""
    from tvm import te
    from tvm.s_tir import Schedule

    register_intrinsics()
    kind, rows = AVX2, MATVEC_ROWS
    lanes, depth, blocks, cb = kind.lanes, kind.depth, matvec_blocks(o), c // kind.depth
    x = te.placeholder((n, cb, depth), kind.act_dtype, name="x")
    wt = te.placeholder((blocks, cb, lanes, depth), kind.weight_dtype, name="w")
    bias = te.placeholder((o,), "int32", name="bias")
    mult = te.placeholder((o,), "float32", name="mult")
    rc, rk = te.reduce_axis((0, cb), "rc"), te.reduce_axis((0, depth), "rk")
    acc = te.compute(
        (n, blocks, lanes),
        lambda b, q, i: te.sum(wt[q, rc, i, rk].astype("int32") * x[b, rc, rk].astype("int32"), axis=[rc, rk]),
        name="acc",
    )

    def requantize(b: Any, f: Any) -> Any:
        return requantized(acc[b, f // lanes, f % lanes], bias, mult, f, zy, out_dtype)

    out = te.compute((n, o), requantize, name="requantize")
    sch = Schedule(te.create_prim_func([x, wt, bias, mult, out]))
    b, f = sch.get_loops(sch.get_sblock("requantize"))
    fo, fi = sch.split(f, [None, rows * lanes])
    block = sch.get_sblock("acc")
    sch.compute_at(block, fo)
    if cb > 1:
        qa, ia, r, k = sch.get_loops(block)[-4:]
        sch.reorder(r, qa, ia, k)
    else:  # compute_at makes no loop of extent 1
        qa, ia, k = sch.get_loops(block)[-3:]
        r = qa
    sch.parallel(sch.fuse(b, fo))
    sch.vectorize(fi)
    sch.decompose_reduction(block, r)
    sch.tensorize(ia, kind.intrinsic)
    sch.unroll(qa)
    return scheduled(sch, f"matvec-{kind.name}")


# MobileNet's depthwise-separable chain with channels in the vector lanes. A depthwise convolution has no
# reduction over channels, so its lanes want channels (NCHWc); the pointwise kernel above puts pixels in its
# lanes and would need a transposition between the two. Here the 1x1 kernel runs its lanes over output
# channels instead (the matrix-vector kernel's orientation, with a block of pixels): the weights are the
# vector operand, packed [O/L, C/K, L, K], and K input channels of a pixel are broadcast from an NHWC input,
# so it reads what the depthwise kernel writes ([N, OH, OW, C] in the dot product's operand type) and writes
# what the next depthwise kernel reads ([N, O/L, H, W, L], float32 minus the zero point, or the 8-bit values).
# No packing kernel is left between the two, and neither epilogue has a predicate (no lanes past a row's end).
# On VNNI the broadcast activations are vpdpbusd's unsigned operand and the weight vector its signed one.
VNNI_BY_CHANNEL = DotKind(
    "avx512-vnni-channel", "avx512_vnni", 16, 4, "int8", "uint8", "edgedeploy_vnni_16x4_s8vec_u8bcast"
)
CHANNEL_KINDS = {VNNI: VNNI_BY_CHANNEL, AVX2: AVX2}  # the pixel-lane kind -> its channel-lane intrinsic
# register blocks of the channel-lane 1x1 kernel, (L-channel blocks, pixels), best first: measured one thread on
# Zen 4 over MobileNetV1-0.25's layers (zmm: 2 x 4 beat 2 x 7, 2 x 8, 1 x 14 and 1 x 16 by 5-45 %; ymm: 2 x 4 beat
# 1 x 7 and 1 x 8 by 0-7 %, 16 registers in all)
CHANNEL_BLOCKS = {VNNI: ((2, 4), (2, 7), (1, 7), (1, 4)), AVX2: ((2, 4), (1, 7), (2, 2), (1, 4))}


@functools.cache
def register_channel_intrinsics() -> None:
    """vpdpbusd with the vector operand signed (the weights) and the broadcast one unsigned (activations)."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    register_intrinsics()
    kind = VNNI_BY_CHANNEL
    if TensorIntrin.get(kind.intrinsic, allow_missing=True) is not None:
        return

    @T.prim_func(s_tir=True)
    def desc(
        A: T.Buffer((16, 4), "int8", offset_factor=1),
        B: T.Buffer((4,), "uint8", offset_factor=1),
        C: T.Buffer((16,), "int32", offset_factor=1),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:16, 0:4], B[0:4])
            T.writes(C[0:16])
            for i, k in T.grid(16, 4):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    C[vi] = C[vi] + T.cast(A[vi, vk], "int32") * T.cast(B[vk], "int32")

    @T.prim_func(s_tir=True)
    def impl(
        A: T.Buffer((16, 4), "int8", offset_factor=1),
        B: T.Buffer((4,), "uint8", offset_factor=1),
        C: T.Buffer((16,), "int32", offset_factor=1),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:16, 0:4], B[0:4])
            T.writes(C[0:16])
            C[T.ramp(T.int32(0), 1, 16)] = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.512"),
                C.vload([0], "int32x16"),
                T.reinterpret(T.broadcast(T.reinterpret(B.vload([0], "uint8x4"), dtype="int32"), 16), dtype="uint8x64"),
                A.vload([0, 0], "int8x64"),
                dtype="int32x16",
            )

    TensorIntrin.register(kind.intrinsic, desc, impl)


def channel_block(kind: DotKind, o: int, p: int) -> tuple[int, int]:
    """(L-channel blocks, pixels) of the channel-lane 1x1 kernel's register block: the first of CHANNEL_BLOCKS
    that splits the O/L channel blocks and the `p` pixels evenly (no partial block), else one channel block and
    the most pixels up to 8 that divide `p`."""
    for blocks, pixels in CHANNEL_BLOCKS[kind]:
        if (o // kind.lanes) % blocks == 0 and p % pixels == 0:
            return blocks, pixels
    return 1, next(r for r in range(8, 0, -1) if p % r == 0)


def pack_channel_weights(w: np.ndarray, kind: DotKind) -> np.ndarray:
    """[O, C, 1, 1] int8 -> [O/L, C/K, L, K] in the kind's weight type (the vector operand)."""
    o, c = w.shape[:2]
    lanes, depth = kind.lanes, kind.depth
    packed = w.reshape(o // lanes, lanes, c // depth, depth).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(packed).astype(CHANNEL_KINDS[kind].act_dtype)


def pointwise_channel_kernel(
    kind: DotKind, n: int, c: int, o: int, p: int, zy: int, out_dtype: str, center: int | None = None
) -> Any:
    """The scheduled PrimFunc `(X[N, P, C/K, K], W packed, bias int32[O], mult float32[O]) -> Y[N, O/L, P, L]`
    (`kind` VNNI or AVX2: X in its operand type, uint8 or int16, channels last), Y = clip(round((acc + bias) *
    mult) + zy) in out_dtype, or with `center` that value minus `center` in float32; lanes over output channels."""
    from tvm import te
    from tvm.s_tir import Schedule

    register_channel_intrinsics()
    lanes, depth = kind.lanes, kind.depth
    ob, cb = o // lanes, c // depth
    vec = CHANNEL_KINDS[kind]
    x = te.placeholder((n, p, cb, depth), kind.act_dtype, name="x")
    wt = te.placeholder((ob, cb, lanes, depth), vec.act_dtype, name="w")
    bias = te.placeholder((o,), "int32", name="bias")
    mult = te.placeholder((o,), "float32", name="mult")
    rc, rk = te.reduce_axis((0, cb), "rc"), te.reduce_axis((0, depth), "rk")
    acc = te.compute(
        (n, ob, p, lanes),
        lambda b, f, q, i: te.sum(wt[f, rc, i, rk].astype("int32") * x[b, q, rc, rk].astype("int32"), axis=[rc, rk]),
        name="acc",
    )

    def requantize(b: Any, f: Any, q: Any, i: Any) -> Any:
        return requantized(acc[b, f, q, i], bias, mult, f * lanes + i, zy, out_dtype, center)

    out = te.compute((n, ob, p, lanes), requantize, name="requantize")
    sch = Schedule(te.create_prim_func([x, wt, bias, mult, out]))
    blocks, pixels = channel_block(kind, o, p)
    b, f, q, i = sch.get_loops(sch.get_sblock("requantize"))
    fo, fi = sch.split(f, [None, blocks])
    qo, qi = sch.split(q, [None, pixels])
    sch.reorder(b, fo, qo, fi, qi, i)
    block = sch.get_sblock("acc")
    sch.compute_at(block, qo)
    # compute_at makes no loop of extent 1: (channel blocks,) (pixels,) lanes, (channel steps,) K
    inner = list(sch.get_loops(block)[3:])
    spatial = inner[: len(inner) - 1 - int(cb > 1)]
    r = inner[-2] if cb > 1 else None
    sch.reorder(*([r] if r is not None else []), *spatial, inner[-1])
    sch.parallel(sch.fuse(b, fo, qo))
    sch.vectorize(i)
    sch.decompose_reduction(block, r if r is not None else spatial[0])
    sch.tensorize(spatial[-1], vec.intrinsic)
    for loop in spatial[:-1]:
        sch.unroll(loop)
    return scheduled(sch, f"conv1x1-oc-{kind.name}")


def depthwise_eligible(attrs: Any, weight_shape: tuple[int, ...], x_shape: tuple[int, ...]) -> bool:
    """A depthwise NCHW convolution (one input channel per output channel, channels in blocks of 8), square
    strides, no dilation."""
    o, ci, kh, kw = weight_shape
    strides = [int(s) for s in attrs.strides]
    return (
        ci == 1
        and o == x_shape[1] == int(attrs.groups)
        and o % 8 == 0
        and strides[0] == strides[1]
        and all(int(d) == 1 for d in attrs.dilation)
        and len(attrs.padding) == 4
    )


def depthwise_lanes(kind: DotKind, c: int) -> int:
    """Channels per float32 vector of the depthwise kernel: the dot kind's L (its channel-lane 1x1 kernel writes
    blocks of L), or 8 where the channels do not split so."""
    return kind.lanes if c % kind.lanes == 0 else 8


def pack_depthwise_weights(w: np.ndarray, lanes: int) -> np.ndarray:
    """[C, 1, KH, KW] int8 -> [C/V, KH, KW, V] float32."""
    c, _, kh, kw = w.shape
    return np.ascontiguousarray(w.reshape(c // lanes, lanes, kh, kw).transpose(0, 2, 3, 1)).astype(np.float32)


def depthwise_kernel(
    lanes: int,
    shape: ConvShape,
    zy: int,
    out_dtype: str,
    store_dtype: str | None = None,
    shift: int = 0,
) -> Any:
    """The scheduled PrimFunc `(X[N, C/V, H, W, V] float32, W[C/V, KH, KW, V] float32, bias int32[C], mult
    float32[C]) -> Y[N, OH, OW, C/V, V]`: X is the input minus its zero point (the float32-exact form: every sum
    is an integer below 2**24), the padding reads as 0; Y = clip(round((acc + bias) * mult) + zy) in out_dtype,
    or that value plus `shift` in `store_dtype` (what a channel-lane 1x1 kernel reads: uint8 for VNNI, int16 for
    AVX2). V channels in the float32 lanes, a few output pixels of a row in registers, the taps unrolled."""
    from tvm import te, tirx
    from tvm.s_tir import Schedule

    n, c, h, w, s = shape.n, shape.c, shape.h, shape.w, shape.stride
    (oh, ow), (top, left) = shape.out_hw, shape.pad[:2]
    g = c // lanes
    x = te.placeholder((n, g, h, w, lanes), "float32", name="x")
    wt = te.placeholder((g, shape.kh, shape.kw, lanes), "float32", name="w")
    bias = te.placeholder((c,), "int32", name="bias")
    mult = te.placeholder((c,), "float32", name="mult")
    ri, rj = te.reduce_axis((0, shape.kh), "ri"), te.reduce_axis((0, shape.kw), "rj")

    def tap(b: Any, k: Any, y: Any, u: Any, v: Any) -> Any:
        r, col = y * s + ri - top, u * s + rj - left
        inside = tirx.all(r >= 0, r < h, col >= 0, col < w)
        pixel = tirx.if_then_else(inside, x[b, k, r, col, v], tirx.const(0.0, "float32"))
        return te.sum(pixel * wt[k, ri, rj, v], axis=[ri, rj])

    acc = te.compute((n, g, oh, ow, lanes), tap, name="acc")

    def result(b: Any, y: Any, u: Any, k: Any, v: Any) -> Any:
        a = acc[b, k, y, u, v].astype("int32")
        if store_dtype is None:
            return requantized(a, bias, mult, k * lanes + v, zy, out_dtype)
        return requantized(a, bias, mult, k * lanes + v, zy, out_dtype, center=-shift).astype(store_dtype)

    out = te.compute((n, oh, ow, g, lanes), result, name="out")
    sch = Schedule(te.create_prim_func([x, wt, bias, mult, out]))
    b, y, u, k, v = sch.get_loops(sch.get_sblock("out"))
    pixels = next(r for r in range(8, 0, -1) if ow % r == 0)
    uo, ui = sch.split(u, [None, pixels])
    sch.reorder(b, y, uo, k, ui, v)
    block = sch.get_sblock("acc")
    sch.compute_at(block, k)
    # compute_at makes no loop of extent 1: (pixels,) lanes, (tap rows,) (tap columns)
    inner = list(sch.get_loops(block)[4:])
    spatial = inner[: 1 + int(pixels > 1)]
    taps = inner[len(spatial) :]
    sch.reorder(*taps, *spatial)
    sch.parallel(sch.fuse(b, y))
    sch.vectorize(v)
    sch.vectorize(spatial[-1])
    sch.decompose_reduction(block, taps[0] if taps else spatial[0])
    for loop in [*taps, *spatial[:-1]]:
        sch.unroll(loop)
    return scheduled(sch, f"depthwise-{lanes}")


def quantize_pack_kernel(kind: DotKind, shape: ConvShape, scale: float, zero: int, q_dtype: str) -> Any:
    """The scheduled PrimFunc `(X[N, C, H, W] float32) -> shape.packed_shape` in the kind's operand type: the
    graph input's quantize, clip(round(x / scale) + zero) in q_dtype (Relax's legalized quantize, step for step),
    then pack_conv_activations' layout (the zero point in the padding; int8 shifted to uint8 for uint8 operands).
    Relax's default schedule of the same ops ran five passes over full-size intermediates, none in parallel
    (MobileNet's 224x224 input on AVX2: 0.117 ms); here each input row is quantized once, in vectors, into a local
    row of the operand type, and the phase split reads it from there, rows in parallel."""
    from tvm import te, tirx
    from tvm.s_tir import Schedule

    n, c, h, w, s = shape.n, shape.c, shape.h, shape.w, shape.stride
    (top, left), depth = shape.pad[:2], shape.depth
    lo, hi = clip_range(q_dtype)
    shift = operand_shift(kind.act_dtype, q_dtype)
    x = te.placeholder((n, c, h, w), "float32", name="x")

    def quantize(b: Any, f: Any, y: Any, u: Any) -> Any:
        q = te.max(te.min(tirx.round(x[b, f, y, u] / tirx.const(scale, "float32")) + float(zero), hi), lo)
        return (q + float(shift) if shift else q).astype(kind.act_dtype)  # an integer in range: exact

    q = te.compute((n, c, h, w), quantize, name="q")
    pad = tirx.const(zero + shift, kind.act_dtype)

    def packed(b: Any, g: Any, i: Any, j: Any, y: Any, u: Any, k: Any) -> Any:
        f, r, col = g * depth + k, y * s + i - top, u * s + j - left
        inside = tirx.all(f < c, r >= 0, r < h, col >= 0, col < w)
        return tirx.if_then_else(inside, q[b, te.min(f, c - 1), r, col], pad)

    out = te.compute(shape.packed_shape, packed, name="packed")
    sch = Schedule(te.create_prim_func([x, out]))
    b, g, i, j, y, u, k = sch.get_loops(sch.get_sblock("packed"))
    sch.reorder(b, g, y, i, j, u, k)
    sch.compute_at(sch.get_sblock("q"), i)
    sch.vectorize(sch.get_loops(sch.get_sblock("q"))[-1])
    sch.parallel(sch.fuse(b, g, y))
    return scheduled(sch, "quantize-pack")


# K x K convolutions with the lanes over output channels (VNNI): vpdpbusd takes 16 output channels x 4 input
# channels of weights as its vector and the 4 input channels of one pixel broadcast (one 32-bit word of the packed
# activations, which conv_kernel's packing already keeps together), so no lane is idle wherever the output
# channels come in blocks of 16, however narrow the rows (ResNet-18's 28-, 14- and 7-pixel rows left 1 of 8 lanes
# idle in conv_kernel, whose lanes run along a row). The register block is OC_BLOCKS x 16 output channels by
# OC_PIXELS pixels of one row; the epilogue requantizes 16 channels of a pixel as one vector.
# (its tensor intrinsic is the channel-lane 1x1 kernel's: weights as the vector, the pixel's channels broadcast)
VNNI_OC = DotKind("avx512-vnni-oc", "avx512_vnni", 16, 4, "uint8", "int8", VNNI_BY_CHANNEL.intrinsic)
OC_BLOCKS = 2  # 16-channel accumulators per pixel in the register block
# the same on AVX2: vpmaddwd with 8 output channels x 2 input channels of int16 weights as the vector, the pixel's 2
# int16 channels broadcast (one 32-bit word of conv_kernel's AVX2 packing)
AVX2_OC = DotKind("avx2-oc", "avx2", 8, 2, "int16", "int16", AVX2.intrinsic)
OC_PIXELS = 7  # pixels of a row per register block at most (a divisor of the row's width)


def oc_pixels(width: int) -> int:
    """Pixels of one output row per register block: the largest divisor of `width` up to OC_PIXELS."""
    return next(p for p in range(min(OC_PIXELS, width), 0, -1) if width % p == 0)


def oc_block(kind: DotKind, o: int, width: int) -> tuple[int, int]:
    """conv_oc_kernel's register block: (L-channel accumulators per pixel, pixels of one output row). VNNI_OC:
    OC_BLOCKS x oc_pixels. AVX2_OC (16 ymm registers; the product needs one of its own, vpmaddwd does not
    accumulate): 2 x 4 where the row splits in 4s, 4 x 2 where it splits in 2s (ResNet-18's 256-channel 3x3
    stride 2 with 14-pixel rows: 0.74 ms against 0.88 for 2 x 7), else 2 x oc_pixels (7: 14 accumulators, the
    weight vectors read from memory; ResNet-18's 7-pixel rows at 512 channels: 2 x 7 1.39 ms against 1.65 for
    1 x 7 and 2.5 for 4 x 2). One thread on Zen 4, the kernels alone."""
    if kind == VNNI_OC:
        return OC_BLOCKS, oc_pixels(width)
    lanes = kind.lanes
    if width % 4 == 0:
        return (2 if o % (2 * lanes) == 0 else 1), 4
    if width % 2 == 0 and o % (4 * lanes) == 0:
        return 4, 2
    return (2 if o % (2 * lanes) == 0 else 1), oc_pixels(width)


def oc_shape(x_shape: tuple[int, ...], weight_shape: tuple[int, ...], attrs: Any, kind: DotKind = VNNI_OC) -> ConvShape:
    """conv_shape for conv_oc_kernel: the packed activations' rows cover whole blocks of oc_block's pixels."""
    base = conv_shape(kind, x_shape, weight_shape, attrs)
    return dataclasses.replace(base, lanes=oc_block(kind, base.o, base.out_hw[1])[1])


def oc_eligible(kind: DotKind, attrs: Any, weight_shape: tuple[int, ...]) -> bool:
    """conv_eligible with output channels in blocks of 16 x OC_BLOCKS and input channels in blocks of 4 (VNNI), or
    on AVX2 in blocks of 8 and 2. A stem's 3 channels keep conv_kernel: there each broadcast word is padding in
    part, and the per-pixel epilogue weighs more against 49 taps of one channel block (ResNet-18's stem on VNNI:
    2.1 ms against 1.1)."""
    o, c = weight_shape[:2]
    if kind.cpu_flag == VNNI.cpu_flag:
        return conv_eligible(kind, attrs, weight_shape) and o % (OC_BLOCKS * VNNI_OC.lanes) == 0 and c % 4 == 0
    return kind == AVX2 and conv_eligible(kind, attrs, weight_shape) and o % AVX2_OC.lanes == 0 and c % 2 == 0


OC_KINDS = {VNNI: VNNI_OC, AVX2: AVX2_OC}  # the profile's dot kind -> conv_oc_kernel's


def pack_oc_weights(w: np.ndarray, kind: DotKind = VNNI_OC) -> np.ndarray:
    """[O, C, KH, KW] int8 -> [O/L, C/K, KH, KW, L, K] in the kind's weight type (VNNI_OC: int8, 16 x 4; AVX2_OC:
    int16, 8 x 2; padded input channels get 0)."""
    o, c, kh, kw = w.shape
    lanes, depth = kind.lanes, kind.depth
    cb = -(-c // depth)
    padded = np.zeros((o, cb * depth, kh, kw), np.int8)
    padded[:, :c] = w
    blocked = padded.reshape(o // lanes, lanes, cb, depth, kh, kw).transpose(0, 2, 4, 5, 1, 3)
    return np.ascontiguousarray(blocked).astype(kind.weight_dtype)


def conv_oc_kernel(
    shape: ConvShape,
    zy: int,
    out_dtype: str,
    center: int | None = None,
    pixel_major: bool = False,
    kind: DotKind = VNNI_OC,
    blocks: int | None = None,
) -> Any:
    """conv_kernel's function (same packed activations, for a ConvShape of oc_shape; weights from
    pack_oc_weights) with the lanes over output channels: `(X packed, W packed, bias int32[O], mult float32[O])
    -> Y[N, O, OH, OW]`, Y = clip(round((acc + bias) * mult) + zy) in out_dtype (or minus `center` in float32).
    `kind`: VNNI_OC (vpdpbusd, 16 channels x 4) or AVX2_OC (vpmaddwd, 8 channels x 2 int16); `blocks`: L-channel
    accumulators per pixel in the register block (default: oc_block's).
    `pixel_major`: Y is [N, OH, OW, O] instead, so each pixel's 16 requantized channels are one contiguous store
    rather than 16 bytes OH * OW apart (ResNet-18's 64->64 3x3 at 56x56, whose short reductions make the
    epilogue weigh: 0.56 -> 0.51 ms, the kernel alone)."""
    from tvm import te
    from tvm.s_tir import Schedule

    register_channel_intrinsics()
    s, lanes, depth, pixels = shape.stride, kind.lanes, kind.depth, shape.lanes
    (oh, ow), cb, n, o = shape.out_hw, shape.channel_blocks, shape.n, shape.o
    blocks = oc_block(kind, o, ow)[0] if blocks is None else blocks
    x = te.placeholder(shape.packed_shape, kind.act_dtype, name="x")
    wt = te.placeholder((o // lanes, cb, shape.kh, shape.kw, lanes, depth), kind.weight_dtype, name="w")
    bias = te.placeholder((o,), "int32", name="bias")
    mult = te.placeholder((o,), "float32", name="mult")
    outer = [
        te.reduce_axis((0, e), name) if e > 1 else None for e, name in ((cb, "rc"), (shape.kh, "ri"), (shape.kw, "rj"))
    ]
    rk = te.reduce_axis((0, depth), "rk")
    rc, ri, rj = (a if a is not None else 0 for a in outer)
    axes = [a for a in outer if a is not None]

    def tap(b: Any, fo: Any, y: Any, u: Any, i: Any) -> Any:
        pixel = x[b, rc, ri % s, rj % s, y + ri // s, u + rj // s, rk]
        return te.sum(wt[fo, rc, ri, rj, i, rk].astype("int32") * pixel.astype("int32"), axis=[*axes, rk])

    acc = te.compute((n, o // lanes, oh, ow, lanes), tap, name="acc")

    def result(b: Any, f: Any, y: Any, u: Any) -> Any:
        return requantized(acc[b, f // lanes, y, u, f % lanes], bias, mult, f, zy, out_dtype, center)

    if pixel_major:
        out = te.compute((n, oh, ow, o), lambda b, y, u, f: result(b, f, y, u), name="out")
        sch = Schedule(te.create_prim_func([x, wt, bias, mult, out]))
        b, y, u, f = sch.get_loops(sch.get_sblock("out"))
    else:
        out = te.compute((n, o, oh, ow), result, name="out")
        sch = Schedule(te.create_prim_func([x, wt, bias, mult, out]))
        b, f, y, u = sch.get_loops(sch.get_sblock("out"))
    fo, fb, fl = sch.split(f, [None, blocks, lanes])
    uo, ui = sch.split(u, [None, pixels])
    sch.reorder(b, fo, y, uo, fb, ui, fl)
    block = sch.get_sblock("acc")
    sch.compute_at(block, uo)
    loops = sch.get_loops(block)
    taps = len(axes)
    # the accumulator block's loops: channel blocks, pixels (compute_at makes none of extent 1), lanes, then the
    # taps and K
    count = 1 + int(blocks > 1) + int(pixels > 1)
    spatial = loops[len(loops) - taps - 1 - count : len(loops) - taps - 1]
    reduction = loops[len(loops) - taps - 1 : len(loops) - 1]
    sch.reorder(*reduction, *spatial, loops[-1])
    sch.parallel(sch.fuse(b, fo, y, uo))
    sch.vectorize(fl)
    sch.decompose_reduction(block, reduction[0] if reduction else spatial[0])
    sch.tensorize(spatial[-1], kind.intrinsic)
    for loop in spatial[:-1]:
        sch.unroll(loop)
    return scheduled(sch, f"conv-{kind.name}")


def pack_pixel_major_kernel(shape: ConvShape, dtype: str, zx: int, kind: DotKind = VNNI_OC) -> Any:
    """conv_oc_kernel's packed activations (pack_conv_activations' layout, input channels a multiple of K) from a
    pixel-major [N, H, W, C] 8-bit tensor, as one scheduled PrimFunc `(X) -> packed` in the kind's operand type:
    each pixel's K channels of a block are one 32-bit move; the border is the zero point; for uint8 operands (VNNI)
    int8 activations are shifted to uint8 (+128, the zero point with them), for int16 ones (AVX2) widened. Relax's
    transpose, pad, reshape and transpose of the same took 0.13 ms at 64x56x56 (TVM's default schedule), against
    0.014 from an NCHW tensor."""
    from tvm import te, tirx
    from tvm.s_tir import Schedule

    s, (top, left), depth, operand = shape.stride, shape.pad[:2], kind.depth, kind.act_dtype
    x = te.placeholder((shape.n, shape.h, shape.w, shape.c), dtype, name="x")
    shift = operand_shift(operand, dtype)
    z = zx + shift

    def value(b: Any, cb: Any, ph: Any, pw: Any, yq: Any, xq: Any, k: Any) -> Any:
        r, c = s * yq + ph - top, s * xq + pw - left
        inside = tirx.all(r >= 0, r < shape.h, c >= 0, c < shape.w)
        v = x[b, r, c, cb * depth + k]
        v = (v.astype("int16") + shift).astype(operand) if shift else v.astype(operand)
        return tirx.if_then_else(inside, v, tirx.const(z, operand))

    out = te.compute(shape.packed_shape, value, name="packed")
    sch = Schedule(te.create_prim_func([x, out]))
    sch.vectorize(sch.get_loops(sch.get_sblock("packed"))[-1])
    return scheduled(sch, "pack-pixel-major")


# 3x3 stride-1 convolutions on AVX2 as exact integer Winograd F(2x2, 3x3): vpmaddwd does 16 products an instruction
# whatever they are, and Winograd needs 16 products per 2x2 output pixels and channel pair where the direct
# convolution needs 36 (2.25x fewer). Exact, because every transform is done in integers: the weights as
# U = G2 g G2^T with G2 = 2G (integers, |U| <= 9 * 128, int16), the 4x4 input tile as V = B^T d B (|V| <= 4 * 255,
# int16, d the raw 8-bit input padded with its zero point), their products summed over the input channels in int32
# (|M| <= C * 1152 * 1020), and the output Y = A^T M A, which is 4 times the direct convolution's sum: an exact
# shift right by 2. The output transform sums over the tile's columns first, then its rows: every partial sum is
# a 1-D Winograd result or 2-3 of them, at most 3 * C * 1152 * 1020 in magnitude, below 2**31 for C <= 609
# (WINOGRAD_MAX_CHANNELS). Reads a pixel-major [N, H, W, C] 8-bit tensor, writes one, as conv_oc_kernel.
# ResNet-18 on AVX2, one thread on Zen 4, the kernel alone: 64->64 at 56x56 1.39 -> 0.84 ms, 128->128 at 28x28
# 1.34 -> 0.66 ms (conv_oc_kernel -> this).
WINOGRAD_BT = ((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1))
WINOGRAD_G2 = ((2, 0, 0), (1, 1, 1), (1, -1, 1), (0, 0, 2))
WINOGRAD_AT = ((1, 1, 1, 0), (0, 1, -1, -1))
WINOGRAD_MAX_CHANNELS = 512


def winograd_eligible(kind: DotKind, attrs: Any, weight_shape: tuple[int, ...]) -> bool:
    """An AVX2 profile's ungrouped 3x3, stride-1, undilated NCHW convolution with output channels in blocks of 8,
    an even number of input channels, at most WINOGRAD_MAX_CHANNELS."""
    o, c, kh, kw = weight_shape
    return (
        kind == AVX2
        and (kh, kw) == (3, 3)
        and conv_eligible(kind, attrs, weight_shape)
        and all(int(s) == 1 for s in attrs.strides)
        and o % AVX2_OC.lanes == 0
        and c % 2 == 0
        and c <= WINOGRAD_MAX_CHANNELS
    )


def pack_winograd_weights(w: np.ndarray) -> np.ndarray:
    """[O, C, 3, 3] int8 -> U = G2 g G2^T as [4, 4, O/8, C/2, 8, 2] int16 (AVX2_OC's vector operand per tile
    position)."""
    o, c = w.shape[:2]
    g2 = np.array(WINOGRAD_G2, np.int64)
    u = np.einsum("ai,ocij,bj->aboc", g2, w.astype(np.int64), g2)
    blocked = u.reshape(4, 4, o // 8, 8, c // 2, 2).transpose(0, 1, 2, 4, 3, 5)
    return np.ascontiguousarray(blocked).astype(np.int16)


def winograd_tiles(o: int, c: int, tiles: int) -> tuple[int, int]:
    """The Winograd product's register block: (8-channel accumulators per tile, tiles). 8 x 1 where one tile
    position's weights are at most 8 KB (they stay in L1; ResNet-18's 64 -> 64 at 56x56: 0.78 ms against 0.83 for
    2 x 4); else 2 x 4 where the tiles come in fours, else up to 4 x 1 (ResNet-18's 7x7 tiles of 256 channels:
    4 x 1 0.64 ms, 1 x 7 0.69, 2 x 7 1.02, which spills). One thread on Zen 4, the kernel alone."""
    lanes = AVX2_OC.lanes
    if o * c * 2 <= 8192 and o % (8 * lanes) == 0:
        return 8, 1
    if tiles % 4 == 0:
        return (2 if o % (2 * lanes) == 0 else 1), 4
    return next(b for b in (4, 2, 1) if o % (b * lanes) == 0), 1


def _linear(terms: list[tuple[int, Any]]) -> Any:
    """sum(coef * value) for coefficients in {-1, 0, 1, 2}, without multiplications."""
    out = None
    for coef, value in terms:
        if coef == 0:
            continue
        term = value if coef == 1 else (-value if coef == -1 else value * coef)
        out = term if out is None else out + term
    return out


def winograd_kernel(shape: ConvShape, dtype: str, zx: int, zy: int, out_dtype: str) -> Any:
    """The scheduled PrimFunc `(X[N, H, W, C] 8-bit of `dtype`, U packed, bias int32[O], mult float32[O]) ->
    Y[N, OH, OW, O]`, Y = clip(round((acc + bias) * mult) + zy) in out_dtype, acc the 3x3 stride-1 convolution's
    sum over the input padded with its zero point `zx` (as conv_oc_kernel's with pixel_major); see above."""
    from tvm import te, tirx
    from tvm.s_tir import Schedule

    register_intrinsics()
    n, c, o, h, w = shape.n, shape.c, shape.o, shape.h, shape.w
    (oh, ow), (top, left) = shape.out_hw, shape.pad[:2]
    th, tw = -(-oh // 2), -(-ow // 2)
    nt = th * tw
    x = te.placeholder((n, h, w, c), dtype, name="x")
    u = te.placeholder((4, 4, o // 8, c // 2, 8, 2), "int16", name="u")
    bias = te.placeholder((o,), "int32", name="bias")
    mult = te.placeholder((o,), "float32", name="mult")

    def tile_input(b: Any, t: Any, r: int, s: int, ch: Any) -> Any:
        y, col = (t // tw) * 2 + r - top, (t % tw) * 2 + s - left
        inside = tirx.all(y >= 0, y < h, col >= 0, col < w)
        return tirx.if_then_else(inside, x[b, y, col, ch].astype("int16"), tirx.const(zx, "int16"))

    def transformed(b: Any, a: Any, e: Any, t: Any, ch: Any) -> Any:
        value = None
        for ai in range(4):
            for ei in range(4):
                rows = [
                    (WINOGRAD_BT[ai][r], _linear([(WINOGRAD_BT[ei][s], tile_input(b, t, r, s, ch)) for s in range(4)]))
                    for r in range(4)
                ]
                v = _linear(rows)
                value = v if value is None else tirx.Select(tirx.all(a == ai, e == ei), v, value)
        return value

    v = te.compute((n, 4, 4, nt, c), transformed, name="V")
    rc, rk = te.reduce_axis((0, c // 2), "rc"), te.reduce_axis((0, 2), "rk")
    m = te.compute(
        (n, 4, 4, nt, o),
        lambda b, a, e, t, f: te.sum(
            u[a, e, f // 8, rc, f % 8, rk].astype("int32") * v[b, a, e, t, rc * 2 + rk].astype("int32"), axis=[rc, rk]
        ),
        name="M",
    )

    def result(b: Any, y: Any, col: Any, f: Any) -> Any:
        t, i, j = (y // 2) * tw + col // 2, y % 2, col % 2
        value = None
        for ii in range(2):
            for jj in range(2):
                cols = [
                    (WINOGRAD_AT[ii][a], _linear([(WINOGRAD_AT[jj][e], m[b, a, e, t, f]) for e in range(4)]))
                    for a in range(4)
                ]
                y4 = _linear(cols)
                value = y4 if value is None else tirx.Select(tirx.all(i == ii, j == jj), y4, value)
        return requantized(tirx.shift_right(value, 2), bias, mult, f, zy, out_dtype)

    out = te.compute((n, oh, ow, o), result, name="out")
    sch = Schedule(te.create_prim_func([x, u, bias, mult, out]))
    # input transform: per tile, the 16 positions unrolled, channels in vectors
    b, a, e, t, ch = sch.get_loops(sch.get_sblock("V"))
    vec = next(k for k in (16, 8, 4, 2) if c % k == 0)
    co, ci = sch.split(ch, [None, vec])
    sch.reorder(b, t, co, a, e, ci)
    sch.unroll(a)
    sch.unroll(e)
    sch.vectorize(ci)
    sch.parallel(sch.fuse(b, t))
    # the products: conv_oc_kernel's register block over (channel blocks, tiles), per tile position
    block = sch.get_sblock("M")
    b, a, e, t, f, r, k = sch.get_loops(block)
    blocks, tiles = winograd_tiles(o, c, nt)
    fo, fb, fl = sch.split(f, [None, blocks, 8])
    to, ti = sch.split(t, [None, tiles])
    sch.reorder(b, a, e, fo, to, r, fb, ti, fl, k)
    sch.parallel(sch.fuse(b, a, e, fo, to))
    sch.decompose_reduction(block, r)
    sch.tensorize(fl, AVX2.intrinsic)
    sch.unroll(fb)
    sch.unroll(ti)
    # output transform and requantize: 2x2 pixels of a tile unrolled, 8 channels a vector
    b, y, col, f = sch.get_loops(sch.get_sblock("out"))
    yo, yi = sch.split(y, [None, 2])
    xo, xi = sch.split(col, [None, 2])
    fo, fl = sch.split(f, [None, 8])
    sch.reorder(b, yo, xo, fo, yi, xi, fl)
    sch.unroll(yi)
    sch.unroll(xi)
    sch.vectorize(fl)
    sch.parallel(sch.fuse(b, yo))
    return scheduled(sch, "winograd-avx2")

"""Pooling and depthwise convolutions on CUDA: one thread per output (NHWC pooling: per 16 bytes of channels), the
window summed in registers.

TVM 0.27's dlight `Reduction`/`GeneralReduction` rules take any kernel with a reduction, including a 3x3
max pooling: they give every *output element* a thread block of 256 threads, 9 of which do work, and
reduce across the block in shared memory. Measured on the H200 (docs/gpu.md "Pooling and depthwise convolutions"): the
INT8 ResNet-18's `fused_max_pool2d_quantize` kernel took 12.97 ms of the 15.9 ms batch-64 run (12.8 M
blocks) and 0.17 ms at batch 1, the largest kernel of both.

`WindowReduction` claims kernels whose reductions are all small windows (a constant product of at most
`MAX_WINDOW` iterations: pooling windows, depthwise kernels, a 7x7 global average) and schedules them as
dlight's `Fallback` does: the spatial loops fused across blocks of threads, each thread looping over
its window. GEMM-shaped kernels are claimed before it (cuda_tensorcore.TensorCoreGemm, dlight Matmul),
and long reductions (softmax over classes) go on to dlight's reduction rules.
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.s_tir.dlight.gpu import Fallback
from tvm.s_tir.dlight.gpu.base import GPUScheduleRule
from tvm.target import Target

from ..config import Knobs
from . import source  # noqa: F401 (16-byte int8 vectors of the pad value: registers the CUDA source fix)

MAX_WINDOW = 64


def window_size(func: tirx.PrimFunc) -> int | None:
    """The largest reduction of `func`'s blocks if every one has constant extents, else None (also None
    for a function without reductions: those are not this rule's business)."""
    sch = s_tir.Schedule(func)
    largest = 0
    for block in sch.get_child_blocks(get_root_block(sch)):
        size = 1
        for v in sch.get(block).iter_vars:
            if v.iter_type == tirx.IterVar.CommReduce:
                if not isinstance(v.dom.extent, tirx.IntImm):
                    return None
                size *= int(v.dom.extent)
        largest = max(largest, size if size > 1 else 0)
    return largest or None


class WindowReduction(GPUScheduleRule):  # type: ignore[misc]
    """dlight's Fallback schedule for kernels whose reductions are small windows (see the module doc)."""

    def __init__(self, knobs: Knobs | None = None) -> None:
        self.knobs = knobs or Knobs()

    def apply(self, func: Any, target: Target, tunable: bool) -> Any:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        try:
            size = window_size(func)
        except Exception:  # an unusual block structure: the reduction rules take it, as before
            return None
        if size is None or size > MAX_WINDOW:
            return None
        shapes = [channel_vectors] + ([window_with_epilogue] if self.knobs.window_epilogue else [])
        for schedule in shapes:
            try:
                scheduled = schedule(func)
            except Exception:  # a schedule error: not this shape (a consumer that channel_vectors cannot inline)
                scheduled = None
            if scheduled is not None:
                return scheduled
        return Fallback().apply(func, target, tunable)  # one thread per output, a kernel per block


VECTOR_BYTES = 16  # per thread and load: 16 int8 channels, 8 fp16, 4 fp32 (fewer where the channels do not
# divide). The pad value's 16-byte int8 vector is one that TVM 0.27 writes as make_int4 with 16 arguments, which
# nvcc rejects; cuda_source packs them (before it, 4 int8 lanes: ResNet-18's INT8 pooling 0.041 ms at batch 64
# on the H200 against FP16's 0.038 on twice the bytes, docs/gpu.md "Pooling and depthwise convolutions")


def channel_vectors(func: tirx.PrimFunc, threads: int = 256) -> Any:
    """A pooling window over NHWC (the innermost output axis is the channel, read at the same channel):
    each thread computes VECTOR_BYTES of neighbouring channels of one output pixel with vector loads and a vector
    max or sum. ResNet-18's INT8 max pooling at batch 64 read one byte per load (0.064 ms on the H200).
    None when the kernel is not that shape."""
    sch = s_tir.Schedule(func)
    blocks = sch.get_child_blocks(get_root_block(sch))
    reductions = [b for b in blocks if any(v.iter_type == tirx.IterVar.CommReduce for v in sch.get(b).iter_vars)]
    if len(reductions) != 1:
        return None
    (main,) = reductions
    name = sch.get(main).name_hint
    for b in blocks:
        if sch.get(b).name_hint != name:
            sch.compute_inline(b)  # the padding; anything else (a consumer) raises: not this shape
    stmt = sch.get(main)
    kinds = [v.iter_type for v in stmt.iter_vars]
    n_spatial = kinds.count(tirx.IterVar.DataPar)
    if kinds != [tirx.IterVar.DataPar] * n_spatial + [tirx.IterVar.CommReduce] * (len(kinds) - n_spatial):
        return None
    channel = stmt.iter_vars[n_spatial - 1]
    if not isinstance(channel.dom.extent, tirx.IntImm):
        return None
    widest = max(tvm.DataType(r.source.dtype).bits // 8 for r in (*stmt.reads, *stmt.writes))
    lanes = VECTOR_BYTES // max(1, widest)
    while lanes > 1 and int(channel.dom.extent) % lanes:
        lanes //= 2
    if lanes < 4:
        return None
    for region in (*stmt.reads, *stmt.writes):
        last = region.region[-1]
        if not (last.min.same_as(channel.var) and isinstance(last.extent, tirx.IntImm) and int(last.extent) == 1):
            return None
    writeback = sch.cache_write(main, 0, "local")  # the running max/sum in registers, stored once
    loops = sch.get_loops(main)
    spatial, window = loops[:n_spatial], loops[n_spatial:]
    c_out, c_in = sch.split(spatial[-1], factors=[None, lanes])
    sch.reorder(*spatial[:-1], c_out, *window, c_in)
    bx, tx = sch.split(sch.fuse(*spatial[:-1], c_out), factors=[None, threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    sch.vectorize(c_in)  # the init (window start) is lowered inside the window loops, per vector
    sch.reverse_compute_at(writeback, tx)
    sch.vectorize(sch.get_loops(writeback)[-1])
    return sch


def window_with_epilogue(func: tirx.PrimFunc, threads: int = 256) -> Any:
    """One thread per output of a window reduction followed by an elementwise epilogue (a depthwise
    convolution's requantize, or bias + clip): the pad is inlined into the window's reads, the thread sums the
    window into a register and the epilogue stores the result, in one kernel. dlight's Fallback makes two
    kernels of such a function, the first storing every window sum to a global intermediate. None when the
    kernel is not that shape (no epilogue, more than one reduction, an epilogue that does not map one
    output to one window)."""
    sch = s_tir.Schedule(func)
    blocks = sch.get_child_blocks(get_root_block(sch))
    reductions = [i for i, b in enumerate(blocks) if _is_reduction(sch, b)]
    if len(reductions) != 1 or reductions[0] == len(blocks) - 1:
        return None
    at = reductions[0]
    main, last = blocks[at], blocks[-1]
    for b in (*blocks[:at], *blocks[at + 1 : -1]):
        sch.compute_inline(b)  # the pad before the window, the epilogue's steps into its last one
    if len(sch.get(last).iter_vars) != len(sch.get_loops(last)):
        return None
    bx, tx = sch.split(sch.fuse(*sch.get_loops(last)), factors=[None, threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    sch.compute_at(main, tx)  # this thread's output: its window summed right before the epilogue uses it
    sch.set_scope(main, 0, "local")
    return sch


def _is_reduction(sch: Any, block: Any) -> bool:
    return any(v.iter_type == tirx.IterVar.CommReduce for v in sch.get(block).iter_vars)

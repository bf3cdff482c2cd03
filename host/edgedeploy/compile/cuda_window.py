"""Pooling and depthwise convolutions on CUDA: one thread per output, the window summed in registers.

TVM 0.27's dlight `Reduction`/`GeneralReduction` rules take any kernel with a reduction, including a 3x3
max pooling: they give every *output element* a thread block of 256 threads, 9 of which do work, and
reduce across the block in shared memory. Measured on the H200 (bench/results/tensorcore/run1): the
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

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.s_tir.dlight.gpu import Fallback
from tvm.s_tir.dlight.gpu.base import GPUScheduleRule
from tvm.target import Target

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

    def apply(self, func: Any, target: Target, tunable: bool) -> Any:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        try:
            size = window_size(func)
        except Exception:  # an unusual block structure: the reduction rules take it, as before
            return None
        if size is None or size > MAX_WINDOW:
            return None
        return Fallback().apply(func, target, tunable)

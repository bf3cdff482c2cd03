"""Injective kernels on CUDA (pads, casts, Q/DQ chains, transposes): contiguous vectors per thread.

dlight's `Fallback` gives every output element a thread of its own and recovers the element's
coordinates from the thread index with int64 divisions and remainders, one per axis. For the INT8
graph's byte-sized tensors that is most of the work: on the H200 the zero-point pad before each
convolution of NHWC INT8 ResNet-18 at batch 64 (13.8 M bytes) took 0.09-0.15 ms, 0.64 ms of the
model's 2.27 ms (bench/results/h200/run8-variants/nchw_nhwc.txt). `VectorizedInjective` (just before
Fallback) gives each thread 4 elements (at most 16 bytes) that are contiguous in the innermost axis of
the output (channels, in NHWC), so the index arithmetic runs once per vector and loads and stores are
wider. Not more lanes: a kernel's intermediate values vectorize too, and TVM 0.27's CUDA code generator
has no type for some of them ("Cannot convert type int16x16 to CUDA type", the int16 of the zero-point subtraction).
"""

from __future__ import annotations

from typing import Any

from tvm import DataType, s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.base import try_inline
from tvm.s_tir.dlight.gpu.base import GPUScheduleRule
from tvm.target import Target

THREADS = 256
MAX_LANES = 4
MAX_VECTOR_BYTES = 16


def vector_lanes(inner: int, dtype_bytes: int) -> int:
    """The most lanes (a power of two, at most 4 and 16 bytes) that divide the innermost extent."""
    lanes = max(1, min(MAX_LANES, MAX_VECTOR_BYTES // max(dtype_bytes, 1)))
    while lanes > 1 and inner % lanes:
        lanes //= 2
    return lanes


class VectorizedInjective(GPUScheduleRule):  # type: ignore[misc]
    """One block of spatial loops after inlining, written along its innermost axis: vectors per thread."""

    def apply(self, func: Any, target: Target, _: bool) -> Any:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        try:
            return self._apply(func)
        except Exception:  # an unusual block structure: Fallback takes it, as before
            return None

    def _apply(self, func: Any) -> Any:
        sch = s_tir.Schedule(func)
        infos = normalize_prim_func(sch)
        if infos is None:
            return None
        infos = try_inline(sch, infos)
        if len(infos) != 1 or infos[0].dom_kind().strip("S"):
            return None  # several blocks left, or a reduction: not injective
        block = infos[0].block_rv
        stmt = sch.get(block)
        loops = sch.get_loops(block)
        if not loops or len(stmt.writes) != 1:
            return None
        inner = sch.get(loops[-1]).extent
        last_index = stmt.writes[0].region[-1].min
        if not isinstance(inner, tirx.IntImm) or not last_index.same_as(stmt.iter_vars[-1].var):
            return None  # the innermost loop is not the output's contiguous axis
        lanes = vector_lanes(int(inner), DataType(str(stmt.writes[0].source.dtype)).bits // 8)
        if lanes == 1:
            return None
        bx, tx, vec = sch.split(sch.fuse(*loops), factors=[None, THREADS, lanes])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        sch.vectorize(vec)
        return sch

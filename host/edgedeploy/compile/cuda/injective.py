"""Injective kernels on CUDA (pads, casts, Q/DQ chains, transposes): contiguous vectors per thread.

dlight's `Fallback` gives every output element a thread of its own and recovers the element's
coordinates from the thread index with int64 divisions and remainders, one per axis. For the INT8
graph's byte-sized tensors that is most of the work: on the H200 the zero-point pad before each
convolution of NHWC INT8 ResNet-18 at batch 64 (13.8 M bytes) took 0.09-0.15 ms, 0.64 ms of the
model's 2.27 ms (docs/gpu.md "Injective kernels"). `VectorizedInjective` (just before
Fallback) gives each thread 4 elements (at most 16 bytes) that are contiguous in the innermost axis of
the output (channels, in NHWC), so the index arithmetic runs once per vector and loads and stores are
wider. Not more lanes: a kernel's intermediate values vectorize too, and TVM 0.27's CUDA code generator
has no type for some of them ("Cannot convert type int16x16 to CUDA type", the int16 of the zero-point subtraction).

Byte kernels that leave the innermost axis as it is - the INT8 graph's zero-point pads and its uint8 -> int8
shift - are rewritten first on 32-bit words (`byte_words`): four channels a word, the shift an XOR with
0x80808080, the pad value repeated in each byte; each thread then moves 4 words (16 bytes) with one load
and one store, and no narrow vector type is ever needed.
"""

from __future__ import annotations

from typing import Any

import tvm
import tvm.script
from tvm import DataType, s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.base import try_inline
from tvm.s_tir.dlight.gpu.base import GPUScheduleRule
from tvm.target import Target

from ..config import Knobs

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
    """One block of spatial loops after inlining, written along its innermost axis: vectors per thread.
    Where the innermost extent admits no vector (odd: MobileNet's stem input padded to 225 x 225), dlight's
    Fallback, or with `knobs.injective_ilp` = n > 1 n elements per thread, THREADS apart (each step of a
    warp still coalesced), so that a thread has n loads in flight instead of one."""

    def __init__(self, knobs: Knobs | None = None) -> None:
        self.knobs = knobs or Knobs()

    def apply(self, func: Any, target: Target, _: bool) -> Any:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        try:
            return self._apply(func)
        except Exception:  # an unusual block structure: Fallback takes it, as before
            return None

    def _apply(self, func: Any) -> Any:
        words = byte_words(func)
        found = _single_block(words or func)
        if found is None:
            return None
        sch, block = found
        stmt = sch.get(block)
        loops = sch.get_loops(block)
        if not loops or len(stmt.writes) != 1:
            return None
        inner = sch.get(loops[-1]).extent
        last_index = stmt.writes[0].region[-1].min
        if not isinstance(inner, tirx.IntImm) or not last_index.same_as(stmt.iter_vars[-1].var):
            return None  # the innermost loop is not the output's contiguous axis
        lanes = vector_lanes(int(inner), DataType(str(stmt.writes[0].source.dtype)).bits // 8)
        if lanes == 1 and words is None:
            if self.knobs.injective_ilp <= 1:
                return None  # Fallback's one thread per element is the same
            bx, step, tx = sch.split(sch.fuse(*loops), factors=[None, self.knobs.injective_ilp, THREADS])
            sch.bind(bx, "blockIdx.x")
            sch.bind(tx, "threadIdx.x")
            sch.unroll(step)
            return sch
        # the vector is split off the innermost axis alone, so that a pad's bounds check (on outer axes) is
        # the same for all its lanes: TVM then writes one select of two vectors; over a fused index it
        # could not see that and wrote a loop of single bytes (CUDA source of test_cuda_injective)
        outer, vec = sch.split(loops[-1], factors=[None, lanes])
        bx, tx = sch.split(sch.fuse(*loops[:-1], outer), factors=[None, THREADS])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        sch.vectorize(vec)
        return sch


def _single_block(func: tirx.PrimFunc) -> tuple[Any, Any] | None:
    """(schedule, block) where `func` is one block of spatial loops once its producers are inlined, else None
    (several blocks left, or a reduction: not injective)."""
    sch = s_tir.Schedule(func)
    infos = normalize_prim_func(sch)
    if infos is None:
        return None
    infos = try_inline(sch, infos)
    if len(infos) != 1 or infos[0].dom_kind().strip("S"):
        return None
    return sch, infos[0].block_rv


WORD = 4  # bytes in a 32-bit word
_IF_THEN_ELSE = tvm.ir.Op.get("prim.if_then_else")
_LOAD = tvm.ir.expr.TensorLoad  # the class of tirx.BufferLoad(...) in 0.27 (tirx.BufferLoad is a function)


def byte_words(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """`func` computed on 32-bit words where it is a byte kernel that copies its innermost axis unchanged:
    out[..., c] = cond ? f(x[..., c]) : pad, cond and the outer indices free of c, f the identity or the
    uint8 -> int8 shift (int8(int16(x) - 128), which is x ^ 0x80 bit for bit), pad a constant; the innermost
    extent a multiple of 4. None for anything else (the byte version is scheduled as before)."""
    try:
        return _byte_words(func)
    except Exception:  # a structure this recognizer does not expect: not this kernel
        return None


def _byte_words(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    found = _single_block(func)
    if found is None or len(func.params) != 2:
        return None
    sch, block = found
    stmt = sch.get(block)
    store = stmt.body
    axes = [v.var for v in stmt.iter_vars]
    names = [v.name for v in axes]
    if not isinstance(store, tirx.BufferStore) or len(store.indices) != len(axes):
        return None
    if not all(i.same_as(v) for i, v in zip(store.indices, axes, strict=True)):
        return None
    if len(set(names)) != len(names) or not all(n.isidentifier() for n in names):
        return None
    out = store.buffer
    value, cond, pad_word = store.value, None, 0
    if isinstance(value, tvm.ir.Call) and value.op.same_as(_IF_THEN_ELSE):
        cond, value, pad = value.args
        if not isinstance(pad, tirx.IntImm) or _uses(cond, axes[-1]):
            return None
        pad_word = _packed(int(pad))
    load, shift = _byte_source(value, str(out.dtype))
    if load is None or len(axes) != len(out.shape) or not load.indices[-1].same_as(axes[-1]):
        return None
    if any(_uses(i, axes[-1]) for i in load.indices[:-1]):
        return None
    src = load.source
    if [p.name for p in func.params] != [src.name, out.name]:
        return None  # the text below takes (source, output)
    inner = out.shape[-1]
    if not isinstance(inner, tirx.IntImm) or int(inner) % WORD or int(src.shape[-1]) != int(inner):
        return None

    def shape(b: Any, words: bool = False) -> str:
        dims = [int(d) for d in b.shape]
        if words:
            dims[-1] //= WORD
        return "(" + ", ".join(f"T.int64({d})" for d in dims) + ")"

    loops = [f"a{i}" for i in range(len(axes))]
    word = f"src_words[{', '.join(str(i) for i in load.indices)}]"
    if shift:
        word = f"T.bitwise_xor({word}, T.int32({_packed(0x80)}))"
    if cond is not None:
        word = f"T.if_then_else({cond}, {word}, T.int32({pad_word}))"
    text = f"""
@T.prim_func(private=True, s_tir=True)
def main(src: T.Buffer({shape(src)}, "{src.dtype}"), out: T.Buffer({shape(out)}, "{out.dtype}")):
    src_words = T.decl_buffer({shape(src, True)}, "int32", data=src.data)
    out_words = T.decl_buffer({shape(out, True)}, "int32", data=out.data)
    for {", ".join(loops)} in T.grid({shape(out, True)[1:-1]}):
        with T.sblock("words"):
            {", ".join(names)} = T.axis.remap("{"S" * len(axes)}", [{", ".join(loops)}])
            out_words[{", ".join(names)}] = {word}
"""
    words_func = tvm.script.from_source(text)
    for name, attr in (func.attrs or {}).items():
        words_func = words_func.with_attr(name, attr)
    return words_func


def _packed(byte: int) -> int:
    """A byte repeated in the four bytes of a word, as a signed int32."""
    word = (byte & 0xFF) * 0x01010101
    return word - (1 << 32) if word >= 1 << 31 else word


def _byte_source(value: Any, out_dtype: str) -> tuple[Any, bool]:
    """(the load, whether it is shifted) for the two per-byte functions `byte_words` rewrites, else (None, False)."""
    if isinstance(value, _LOAD) and str(value.source.dtype) == out_dtype and DataType(out_dtype).bits == 8:
        return value, False
    # int8(int16(x) - 128) for uint8 x: the uint8 -> int8 shift
    if (
        out_dtype == "int8"
        and isinstance(value, tirx.Cast)
        and isinstance(value.value, tirx.Sub)
        and isinstance(value.value.b, tirx.IntImm)
        and int(value.value.b) == 128
        and isinstance(value.value.a, tirx.Cast)
        and str(value.value.a.ty) == "int16"
        and isinstance(value.value.a.value, _LOAD)
        and str(value.value.a.value.source.dtype) == "uint8"
    ):
        return value.value.a.value, True
    return None, False


def _uses(expr: Any, var: Any) -> bool:
    return any(v.same_as(var) for v in tirx.analysis.undefined_vars(expr))

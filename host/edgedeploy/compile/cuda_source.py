"""A fix to the CUDA source TVM 0.27 generates, applied before nvcc or NVRTC compiles it.

TVM 0.27's CUDA code generator writes a vector of 8 or 16 one-byte lanes that it builds lane by lane (a
broadcast constant, such as the zero point an INT8 convolution pads with; a gather) as `make_int2` or
`make_int4` with 8 or 16 arguments, one per byte, which nvcc and NVRTC reject ("too many arguments in function
call"). `pack_byte_vectors` packs such arguments four to a 32-bit word, lane 0 in the low byte (the vector's
order in memory), so the kernel keeps its 8- and 16-byte loads. TVM calls it for every CUDA module it builds
(its `tvm_callback_cuda_postproc` hook, registered when this module is imported: cuda_tensorcore imports it).
"""

from __future__ import annotations

import re
from typing import Any

import tvm_ffi

_PACK = "__edgedeploy_pack4"
_HELPER = (
    f"static __device__ __forceinline__ int {_PACK}(int a, int b, int c, int d) {{\n"
    "  return (a & 0xff) | ((b & 0xff) << 8) | ((c & 0xff) << 16) | (int)((unsigned)(d & 0xff) << 24);\n}\n"
)
_VECTOR = re.compile(r"\bmake_(u?int)([24])\(")


def _split_args(src: str, start: int) -> tuple[list[str], int]:
    """The top-level comma-separated arguments of the call whose '(' is at `start`, and the index after ')'."""
    depth, args, begin = 0, [], start + 1
    for i in range(start, len(src)):
        c = src[i]
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                args.append(src[begin:i])
                return args, i + 1
        elif c == "," and depth == 1:
            args.append(src[begin:i])
            begin = i + 1
    raise ValueError("unbalanced parentheses in generated CUDA source")


def pack_byte_vectors(code: str, *_: Any) -> str:
    """`code` with every `make_[u]int2/4` call of one argument per byte packed to one per 32-bit word (the
    hook's further arguments, the target, are not needed)."""
    packed, changed = _packed(code)
    return _HELPER + packed if changed else code


def _packed(code: str) -> tuple[str, bool]:
    out, pos = [], 0
    for m in _VECTOR.finditer(code):
        if m.start() < pos:  # inside a call already rewritten
            continue
        args, end = _split_args(code, m.end() - 1)
        words = int(m.group(2))
        if len(args) != 4 * words:
            continue
        args = [_packed(a)[0] for a in args]
        words_text = ", ".join(f"{_PACK}({', '.join(args[i : i + 4])})" for i in range(0, len(args), 4))
        out.append(code[pos : m.start()] + f"make_{m.group(1)}{words}({words_text})")
        pos = end
    return "".join(out) + code[pos:], bool(out)


tvm_ffi.register_global_func("tvm_callback_cuda_postproc", pack_byte_vectors, override=True)

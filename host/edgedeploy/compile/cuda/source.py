"""Rewrites of the CUDA source TVM 0.27 generates, applied before nvcc or NVRTC compiles it. TVM calls
`postprocess` for every CUDA module it builds (its `tvm_callback_cuda_postproc` hook, registered when this
module is imported: cuda_tensorcore imports it).

A fix: TVM 0.27's CUDA code generator writes a vector of 8 or 16 one-byte lanes that it builds lane by lane (a
broadcast constant, such as the zero point an INT8 convolution pads with; a gather) as `make_int2` or
`make_int4` with 8 or 16 arguments, one per byte, which nvcc and NVRTC reject ("too many arguments in function
call"). `pack_byte_vectors` packs such arguments four to a 32-bit word, lane 0 in the low byte (the vector's
order in memory), so the kernel keeps its 8- and 16-byte loads.

A speed-up (always on: the knob `fp32_rounding` was folded in): every INT8 requantize and quantize ends in
`(signed char)max(min(nearbyintf(x) + zp, hi), lo)`, which nvcc compiles to FRND and F2I: two instructions of
the SM's conversion unit, whose throughput the CUDA C Programming Guide gives as a fraction of the FP32 pipe's
(not measured here on its own), for every byte an INT8 kernel stores (a residual convolution rounds twice).
`round_on_fp32_pipe` writes it as `__edgedeploy_rq`:
x + 1.5 * 2^23 rounded once (to the nearest even integer: the sum's ulp is 1), plus zp, clamped, and the integer
read from the float's mantissa bits: one FADD more, no conversion. The result is the same for every float x
(proof in the helper's comment; tests/host/test_cuda_source.py compiles both forms and compares them over
every float of a wide sweep). ResNet-18 INT8 at batch 64 on the H200: kernels 0.874 -> 0.854 ms, bit-identical
(docs/gpu.md "Schedule knobs").

Another (always on: the knob `byte_simd` was folded in): TVM 0.27 writes a max or min of byte vectors (INT8 NHWC
max pooling: 16 channels a thread) byte by byte; `byte_simd` makes each 32-bit word of it one `__vmaxs4`-style
SIMD call (ResNet-18's INT8 max pooling at batch 64: 0.035 -> 0.024 ms, docs/gpu.md "Schedule knobs").
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


_ROUND = "__edgedeploy_rq"
_ROUND_HELPER = f"""\
// (int)max(min(nearbyintf(x) + zp, hi), lo) for every float x (integral zp, lo, hi; |zp|, |lo|, |hi| <= 2^20),
// on the FP32 pipe: m = 1.5 * 2^23. For |x| < 2^22, x + m lies in [2^23, 2^24), where floats are the integers, so
// __fadd_rn (never fused with x's multiply into an FMA, which would round the exact product) gives
// m + nearbyint(x) (m is even: ties still go to even); + zp is exact; clamped to [m + lo, m + hi], the float's bits
// are 0x4B400000 + the result. A larger |x| (or an infinity) lands beyond the clamp on the same side as before,
// sums being monotonic; a NaN is clamped to hi by fminf, as nearbyintf's NaN is by min.
static __device__ __forceinline__ int {_ROUND}(float x, float zp, float lo, float hi) {{
  const float m = 12582912.0f;
  float t = fmaxf(fminf(__fadd_rn(x, m) + zp, hi + m), lo + m);
  return __float_as_int(t) - 0x4B400000;
}}
"""
_CLAMPED_BYTE = re.compile(r"\((signed|unsigned) char\)max\(min\(")
_BYTE_RANGE = {"signed": (-128, 127), "unsigned": (0, 255)}


def round_on_fp32_pipe(code: str) -> str:
    """`code` with every `(signed|unsigned char)max(min(nearbyintf(X) [+ ZP], HI), LO)` (constant ZP, LO, HI
    within the byte's range) written as `(... char)__edgedeploy_rq(X, ZP, LO, HI)` (module doc)."""
    rewritten, changed = _rounded(code)
    return _ROUND_HELPER + rewritten if changed else code


def _rounded(code: str) -> tuple[str, bool]:
    out, pos = [], 0
    for m in _CLAMPED_BYTE.finditer(code):
        if m.start() < pos:  # inside a match already rewritten (its X was rewritten recursively)
            continue
        max_args, end = _split_args(code, m.end() - len("min(") - 1)
        call = _requantize(max_args, _BYTE_RANGE[m.group(1)])
        if call is None:
            continue
        out.append(code[pos : m.start()] + f"({m.group(1)} char){call}")
        pos = end
    return "".join(out) + code[pos:], bool(out)


def _requantize(max_args: list[str], byte_range: tuple[int, int]) -> str | None:
    """`__edgedeploy_rq(...)` for the arguments of `max(min(nearbyintf(X) [+ ZP], HI), LO)`, or None when they
    are not that (no rounding, a bound that is not a constant integer inside the byte's range)."""
    if len(max_args) != 2 or not max_args[0].strip().startswith("min("):
        return None
    inner = max_args[0].strip()
    min_args, end = _split_args(inner, len("min"))
    lo, hi = _constant(max_args[1]), _constant(min_args[1]) if len(min_args) == 2 else None
    if end != len(inner) or lo is None or hi is None or not byte_range[0] <= lo <= hi <= byte_range[1]:
        return None
    rounded = _unparenthesized(min_args[0].strip())
    if not rounded.startswith("nearbyintf("):
        return None
    (x,), end = _split_args(rounded, len("nearbyintf"))
    rest = rounded[end:].strip()
    zp = 0.0 if not rest else _constant(rest[1:]) if rest[0] == "+" else None
    if zp is None or abs(zp) > 2**20:
        return None
    return f"{_ROUND}({_rounded(x)[0]}, {zp!r}f, {lo!r}f, {hi!r}f)"


def _unparenthesized(expr: str) -> str:
    """`expr` without parentheses around all of it."""
    while expr.startswith("(") and _split_args(expr, 0)[1] == len(expr):
        expr = expr[1:-1].strip()
    return expr


def _constant(text: str) -> float | None:
    """The integral value of a float literal as TVM writes it (`-0x1p+7f/*-1.280000e+02*/`, `8.000000e+00f`)."""
    literal = _unparenthesized(re.sub(r"/\*.*?\*/", "", text).strip()).removesuffix("f")
    try:
        value = float.fromhex(literal) if "0x" in literal else float(literal)
    except ValueError:
        return None
    return value if value.is_integer() else None


def _word_of_byte_lanes() -> re.Pattern[str]:
    """4 statements, one per byte of the 32-bit word `D`, as TVM 0.27 writes a byte-vector max or min:
    `reinterpret_cast<signed char*>(&(D))[i] = (signed char)(max((reinterpret_cast<const signed char*>(&(A))[i]),
    (reinterpret_cast<const signed char*>(&(B))[i])));` for i = 0..3 (D, A, B: lanes of int4/int2/int words)."""
    named: set[str] = set()

    def group(name: str, pattern: str) -> str:  # the first use captures, later ones must match the same text
        if name in named:
            return f"(?P={name})"
        named.add(name)
        return f"(?P<{name}>{pattern})"

    def byte(word: str, i: int, const: str = "") -> str:
        sign, lane = group("sign", "signed|unsigned"), group(word, r"[\w.]+")
        return rf"reinterpret_cast<{const}{sign} char\*>\(&\({lane}\)\)\[{i}\]"

    lanes = [
        rf"{byte('d', i)} = \({group('sign', '')} char\)\({group('op', 'max|min')}"
        rf"\(\({byte('a', i, 'const ')}\), \({byte('b', i, 'const ')}\)\)\);"
        for i in range(4)
    ]
    return re.compile(r"\s*".join(lanes))


_WORD_OF_LANES = _word_of_byte_lanes()


def byte_simd(code: str) -> str:
    """`code` with every 32-bit word of a byte-vector max or min that TVM 0.27 writes as 4 single-byte
    operations (extract, sign-extend, compare, insert: INT8 max pooling's 16-byte vectors) written as one
    `__vmaxs4`/`__vmaxu4`/`__vmins4`/`__vminu4`: the same bytes, 6 ALU instructions a word on sm_90 (nvcc 13's
    SASS of `__vmaxs4`). ResNet-18's INT8 max pooling: a 3-iteration loop of 328 SASS instructions before, 320
    instructions for all 9 taps after."""

    def word(m: re.Match[str]) -> str:
        fn = f"__v{m['op']}{'s' if m['sign'] == 'signed' else 'u'}4"
        return f"{m['d']} = {fn}({m['a']}, {m['b']});"

    return _WORD_OF_LANES.sub(word, code)


def postprocess(code: str, *_: Any) -> str:
    """The fix and both speed-ups; the hook's further arguments, the target, are not needed."""
    return byte_simd(round_on_fp32_pipe(pack_byte_vectors(code)))


tvm_ffi.register_global_func("tvm_callback_cuda_postproc", postprocess, override=True)

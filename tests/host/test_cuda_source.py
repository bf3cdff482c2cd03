"""The speed-ups of compile/cuda/source.py: INT8 requantize rounding on the FP32 pipe (round_on_fp32_pipe) and
byte-vector max/min as one SIMD instruction a word (byte_simd). (Its fix, pack_byte_vectors: test_cuda_conv_pad.)

The rounding rewrite is checked where it can be exact or not: its output is compiled (gcc, with the CUDA intrinsics it
uses defined as their IEEE single-precision meaning) beside the expression TVM writes, and both run over
every float of a wide sweep: all floats whose magnitude is in [2^-3, 2^10) (every tie, every clamp edge) and
every 97th bit pattern of the whole range (huge values, infinities, NaNs, denormals). On the GPU, the bundles
built with and without either rewrite give the same bytes (run24 in docs/benchmarks.md).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from edgedeploy.compile.cuda.source import byte_simd, postprocess, round_on_fp32_pipe
from tests.helpers import require

# as TVM 0.27 writes them: a requantize (zero point 8), the residual's quantize (zero point -128), a ReLU's
# unsigned byte, no zero point at all, and a clamp narrower than the byte (ReLU6-like bounds)
CASES = {
    "rq_zp8": "((signed char)max(min((nearbyintf(x) + 0x1p+3f/*8.000000e+00*/), 0x1.fcp+6f/*1.270000e+02*/), "
    "-0x1p+7f/*-1.280000e+02*/))",
    "q_zp-128": "((signed char)max(min((nearbyintf((x / 0x1.a2e956p-5f/*5.113665e-02*/)) + -0x1p+7f/*-1.280000e+02*/), "
    "0x1.fcp+6f/*1.270000e+02*/), -0x1p+7f/*-1.280000e+02*/))",
    "u8": "((unsigned char)max(min(nearbyintf(x), 0x1.fep+7f/*2.550000e+02*/), 0x0p+0f/*0.000000e+00*/))",
    "narrow": "((signed char)max(min((nearbyintf(x) + 3.000000e+00f), 1.000000e+02f), -5.000000e+00f))",
}

HARNESS = r"""
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#define __device__
#define __forceinline__ inline
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
static inline float max(float a, float b) { return fmaxf(a, b); }  /* CUDA's float overloads */
static inline float min(float a, float b) { return fminf(a, b); }
HELPERS
static int tvm_form(float x) { return ORIGINAL; }
static int rewritten(float x) { return REWRITTEN; }
static long long check(uint32_t bits) {
  float x; memcpy(&x, &bits, 4);
  if (tvm_form(x) != rewritten(x)) {
    printf("%08x %.9g: %d != %d\n", bits, x, tvm_form(x), rewritten(x));
    return 1;
  }
  return 0;
}
int main(void) {
  long long bad = 0, n = 0;
  for (uint32_t sign = 0; sign < 2; sign++)           /* |x| in [2^-3, 2^10): exponents 124..136 */
    for (uint32_t b = 124u << 23; b < 137u << 23 && bad < 5; b++, n++) bad += check(sign << 31 | b);
  for (uint64_t b = 0; b < (1ull << 32) && bad < 5; b += 97, n++) bad += check((uint32_t)b);
  printf("%lld of %lld differ\n", bad, n);
  return bad != 0;
}
"""


def _split_helpers(code: str) -> tuple[str, str]:
    body = code.splitlines()[-1]
    return code[: len(code) - len(body)], body


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_rewritten_rounding_equals_nearbyint_for_every_float(case: str, tmp_path: Path) -> None:
    gcc = shutil.which("gcc")
    require("GCC", "gcc not installed" if gcc is None else None)
    assert gcc is not None
    original = CASES[case]
    helpers, rewritten = _split_helpers(round_on_fp32_pipe(original))
    assert "__edgedeploy_rq(" in rewritten and "nearbyintf" not in rewritten
    source = HARNESS.replace("HELPERS", helpers).replace("ORIGINAL", original).replace("REWRITTEN", rewritten)
    (tmp_path / "check.c").write_text(source)
    # no contraction and no fast math: IEEE single precision, round to nearest even, as the GPU's FADD.RN
    build = [
        gcc,
        "-O2",
        "-ffp-contract=off",
        "-fno-fast-math",
        "-o",
        str(tmp_path / "check"),
        str(tmp_path / "check.c"),
    ]
    subprocess.run([*build, "-lm"], check=True, capture_output=True)
    run = subprocess.run([str(tmp_path / "check")], capture_output=True, text=True, timeout=300)
    summary = run.stdout.strip().splitlines()[-1]
    assert run.returncode == 0 and summary.startswith("0 of "), run.stdout


def test_the_rewrite_takes_nested_requantizes_and_leaves_other_clamps() -> None:
    inner = CASES["rq_zp8"]
    residual = f"((signed char)max(min((nearbyintf(((float)(((int){inner}) - 8)) * 0.5f) + -0x1p+7f), 127.f), -128.f))"
    code = round_on_fp32_pipe(f"y = {residual}; z = {inner};")
    assert code.count("static __device__") == 1 and "nearbyintf(" not in code.split("}\n")[-1]
    assert code.split("}\n")[-1].count("__edgedeploy_rq(") == 3
    assert "__edgedeploy_rq(x, 8.0f, -128.0f, 127.0f)" in code
    untouched = [
        "((signed char)max(min(x, 0x1.fcp+6f), -0x1p+7f))",  # a clamp without rounding
        "((signed char)max(min(nearbyintf(x), 2.000000e+02f), -0x1p+7f))",  # a bound outside the byte
        "((signed char)max(min(nearbyintf(x) + 0.5f, 1.270000e+02f), -0x1p+7f))",  # a zero point that is not integral
        "((signed char)max(min(nearbyintf(x), hi), -0x1p+7f))",  # a bound that is not a constant
        "((unsigned char)max(min(nearbyintf(x), 0x1.fcp+6f), -0x1p+7f))",  # a signed bound for an unsigned byte
    ]
    for expr in untouched:
        assert round_on_fp32_pipe(expr) == expr, expr


def _lanes(op: str = "max", sign: str = "signed", d: str = "__1.x", a: str = "v_.x", b: str = "condval.x") -> str:
    """A byte-vector max/min's 4 lanes of one word as TVM 0.27 writes them (INT8 NHWC max pooling)."""
    return "\n        ".join(
        f"reinterpret_cast<{sign} char*>(&({d}))[{i}] = ({sign} char)({op}((reinterpret_cast<const {sign} char*>"
        f"(&({a}))[{i}]), (reinterpret_cast<const {sign} char*>(&({b}))[{i}])));"
        for i in range(4)
    )


def test_a_word_of_byte_lanes_becomes_one_simd_max_or_min() -> None:
    code = f"{_lanes()}\n        {_lanes(d='__1.y', a='v_.y', b='condval.y')}\n"
    assert byte_simd(code).split() == [
        "__1.x",
        "=",
        "__vmaxs4(v_.x,",
        "condval.x);",
        "__1.y",
        "=",
        "__vmaxs4(v_.y,",
        "condval.y);",
    ]
    assert byte_simd(_lanes("min", "unsigned")) == "__1.x = __vminu4(v_.x, condval.x);"
    three = _lanes().rsplit("\n", 1)[0]  # a word not written whole
    mixed = _lanes().replace("(&(v_.x))[2]", "(&(v_.y))[2]")  # a lane from another word
    assert byte_simd(three) == three and byte_simd(mixed) == mixed


@pytest.mark.compile
def test_int8_nhwc_max_pooling_takes_words_of_bytes() -> None:
    """The whole path: ResNet-18's INT8 max pooling (NHWC, 64 channels), scheduled and compiled to CUDA source,
    takes each tap's 16 bytes as 4 __vmaxs4 and no byte-by-byte max is left."""
    from tests.host.cuda import cuda_source
    from tests.host.models import pool_model

    kernel = cuda_source(pool_model((8, 112, 112, 64), "NHWC")).split("__global__")[-1]
    assert kernel.count("__vmaxs4(") == 4 and "reinterpret_cast<signed char*>" not in kernel, kernel


def test_postprocess_applies_the_fix_and_both_rewrites() -> None:
    code = f"y = {CASES['rq_zp8']};\n{_lanes()}"
    out = postprocess(code)
    assert "__edgedeploy_rq(" in out and "__vmaxs4(" in out
    assert out == byte_simd(round_on_fp32_pipe(code))

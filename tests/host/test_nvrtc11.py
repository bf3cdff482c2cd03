"""NVRTC 11.8 through ctypes (compile/cuda/nvrtc11.py) on a kernel of the kind TVM generates (WMMA INT8 and FP16,
TVM's `__CUDACC_RTC__` preamble with libcu++ includes), without TVM: what the cubin's ELF header says, and that
the PTX of the sm_XX compilation is the compute_XX one. Seconds, no GPU."""

from __future__ import annotations

import locale
import os
import struct
import subprocess
from pathlib import Path

import pytest

from edgedeploy.compile.cuda import nvrtc11
from edgedeploy.compile.cuda.devcode import _cubin_sm, cubin_functions, ptx_entries, ptx_version
from edgedeploy.compile.cuda.toolchain import resolve_toolchain
from edgedeploy.errors import BuildError
from edgedeploy.profiles import get_profile
from tests.helpers import require
from tests.host.cuda import require_toolchain

# TVM 0.27's preamble under NVRTC (its codegen writes these lines), a WMMA INT8 and a WMMA FP16 kernel
SOURCE = r"""
#ifdef __CUDACC_RTC__
  #include <cuda/std/cstdint>
  using cuda::std::int8_t;
  using cuda::std::int32_t;
  using cuda::std::uint64_t;
  #include <cuda/std/type_traits>
  namespace std {
    using cuda::std::is_same;
    using cuda::std::is_same_v;
    using cuda::std::is_integral;
    using cuda::std::is_signed;
    using cuda::std::is_unsigned;
    using cuda::std::is_floating_point;
    using cuda::std::enable_if;
    using cuda::std::conditional;
  }
#endif
#include <cuda_fp16.h>
#include <mma.h>
static_assert(std::is_signed<int8_t>::value && std::is_unsigned<uint64_t>::value, "");
static_assert(std::is_integral<const int32_t>::value && !std::is_integral<float>::value, "");
static_assert(std::is_floating_point<float>::value && !std::is_signed<bool>::value, "");
static_assert(std::is_same_v<std::conditional<true, int, float>::type, int>, "");
using namespace nvcuda;
extern "C" __global__ void __launch_bounds__(32) imma_kernel(const signed char* a, const signed char* b, int* c) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, signed char, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, signed char, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, int> fc;
  wmma::fill_fragment(fc, 0);
  wmma::load_matrix_sync(fa, a, 16);
  wmma::load_matrix_sync(fb, b, 16);
  wmma::mma_sync(fc, fa, fb, fc);
  wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}
extern "C" __global__ void __launch_bounds__(32) hmma_kernel(const half* a, const half* b, float* c) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
  wmma::fill_fragment(fc, 0.0f);
  wmma::load_matrix_sync(fa, a, 16);
  wmma::load_matrix_sync(fb, b, 16);
  wmma::mma_sync(fc, fa, fb, fc);
  wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}
"""


@pytest.fixture(scope="module")
def compiler() -> nvrtc11.Nvrtc:
    require_toolchain("xavier-agx")
    env = resolve_toolchain(get_profile("xavier-agx")).env
    include = [Path(p) for p in env[nvrtc11.INCLUDE_ENV].split(os.pathsep)]
    return nvrtc11.Nvrtc(Path(env[nvrtc11.LIB_ENV]), include)


@pytest.mark.cuda
@pytest.mark.parametrize("sm", [72, 75])
def test_cubin_is_one_an_11x_driver_reads_and_its_ptx_is_the_compute_one(compiler: nvrtc11.Nvrtc, sm: int) -> None:
    assert compiler.version() == (11, 8)
    real = compiler.compile(SOURCE, sm)
    twin = compiler.compile(SOURCE, sm, ptx_only=True)
    assert real.cubin is not None and twin.cubin is None
    # ELF ident: class 64, little endian, version 1, OSABI 0x33 (CUDA), ABI version 7; e_version 118 (CUDA 11.8).
    # (NVRTC 12.9: the same but e_version 129; nvcc 13: OSABI 0x41, ABI version 8, e_version 1 - cuda/nvrtc11.py)
    assert real.cubin[:9] == b"\x7fELF\x02\x01\x01\x33\x07"
    assert struct.unpack_from("<HHI", real.cubin, 16) == (2, 190, 118)  # ET_EXEC, EM_CUDA, e_version
    assert _cubin_sm(real.cubin, 0) == sm
    # the cubin's PTX is the compute_XX PTX, byte for byte: twins (compile/twin.py) run exactly this code
    assert real.ptx == twin.ptx and real.source_sha256 == twin.source_sha256
    assert ptx_version(twin.ptx) == twin.ptx_isa == "7.8" and f"\n.target sm_{sm}\n".encode() in twin.ptx
    assert sorted(cubin_functions(real.cubin)) == sorted(ptx_entries(twin.ptx)) == ["hmma_kernel", "imma_kernel"]
    assert not twin.ptx.endswith(b"\0")


@pytest.mark.cuda
def test_the_process_keeps_reading_text_as_utf8_after_a_compile(compiler: nvrtc11.Nvrtc) -> None:
    """NVRTC 11.8 leaves its thread in the C locale: without nvrtc11._KeepThreadLocale, every text subprocess
    of this process after a compile decoded as ASCII (a CI run failed 11 tests so)."""
    before = locale.getpreferredencoding(False)
    compiler.compile(SOURCE, 75)
    assert locale.getpreferredencoding(False) == before
    assert subprocess.run(["printf", "\\342\\200\\246"], capture_output=True, text=True).stdout == "\u2026"


@pytest.mark.cuda
def test_compile_errors_name_the_line(compiler: nvrtc11.Nvrtc) -> None:
    with pytest.raises(nvrtc11.NvrtcError, match=r"compute_72: .*error: identifier \"undefined_thing\""):
        compiler.compile('extern "C" __global__ void k() { undefined_thing(); }', 72, ptx_only=True)


@pytest.mark.cuda
def test_toolchain_refuses_cuda12_headers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cu12 wheels write the same nvidia/cuda_* folders: with one of them installed beside the cu11 ones the
    headers are not CUDA 11's, and the build must stop and say so."""
    from edgedeploy.compile.cuda import toolchain as cuda_toolchain

    real = cuda_toolchain._dist_version
    monkeypatch.setattr(
        cuda_toolchain, "_dist_version", lambda n: "12.9.79" if n == "nvidia-cuda-runtime-cu12" else real(n)
    )
    require("GPU_TOOLCHAIN", "the cuda11 extra is not installed" if real("nvidia-cuda-runtime-cu11") is None else None)
    with pytest.raises(BuildError, match="nvidia-cuda-runtime-cu12 installed beside the cu11 wheels") as e:
        resolve_toolchain(get_profile("t4"))
    assert "pip uninstall -y nvidia-cuda-runtime-cu12" in (e.value.hint or "")

"""Device code from NVRTC 11.8 (pip `nvidia-cuda-nvrtc-cu11`, the `cuda11` extra), called through ctypes, as
TVM's CUDA compile callback: cubins that every CUDA 11.x driver loads (JetPack 5's 11.4 included), and the PTX
of the same compilation.

Why NVRTC 11.8: CUDA's minor-version compatibility lets a driver of CUDA 11.0 or newer (>= 450.80.02) load a
cubin made by any CUDA 11.x toolkit, NVRTC included when it emits the cubin itself (`nvrtcGetCUBIN`: SASS, no PTX
left for the driver to JIT). A cubin from CUDA 12/13 is outside that promise on an 11.x driver. What the three
code generators write in the cubin's ELF header (e_ident[EI_OSABI], e_ident[EI_ABIVERSION], e_version), seen here
on TVM's INT8 and FP16 kernels:

    NVRTC 11.8.89, sm_72 / sm_75:  OSABI 0x33, ABI version 7, e_version 0x76 (118)
    NVRTC 12.9.86, sm_72 / sm_75:  OSABI 0x33, ABI version 7, e_version 0x81 (129)
    nvcc 13.0.88,  sm_75 (fatbin): OSABI 0x41, ABI version 8, e_version 1 (the SM moved to e_flags' second byte)

PTX: NVRTC writes PTX ISA 7.8 (`.version 7.8`), which only a CUDA 11.8+ driver can JIT-compile. The PTX of a
`--gpu-architecture=sm_72` compilation (what the cubin was assembled from) is byte for byte the PTX of a
`compute_72` one (checked on both kernels above), so a bundle's `model.ptx` and a twin's device code
(compile/twin.py) are the same text.

The CUDA source TVM 0.27 generates needs three things under NVRTC 11.8:
- headers: `cuda_fp16.h` and `mma.h` from `nvidia-cuda-runtime-cu11`, `crt/mma.h` (which mma.h includes) from
  `nvidia-cuda-nvcc-cu11`;
- `<cuda/std/cstdint>` and `<cuda/std/type_traits>`, which TVM includes under `__CUDACC_RTC__` (libcu++, which the
  cu11 wheels do not ship): SHIM_HEADERS below, given to NVRTC in memory, define exactly the names TVM's source
  takes from them (fixed-width integers; is_same(_v), is_integral, is_signed, is_unsigned, is_floating_point,
  enable_if, conditional);
- TVM's NVRTC options (tvm.support.nvcc) less the ptxas flags CUDA 11.8 does not know (--register-usage-level).

The callback is registered (override) when a process whose environment names the NVRTC 11 library imports
tvm_backend, i.e. in the CUDA worker (cuda_worker.py) of a `cuda_codegen = "nvrtc-11"` profile.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LIB_ENV = "EDGEDEPLOY_NVRTC11_LIB"  # folder holding libnvrtc.so.11.2 and libnvrtc-builtins.so.11.8
INCLUDE_ENV = "EDGEDEPLOY_NVRTC11_INCLUDE"  # header folders, os.pathsep-separated
FORMAT_ENV = "EDGEDEPLOY_CUDA_DEVICE_CODE"  # "sass": a cubin goes into the library; "ptx": the PTX does (twins)
LIBNVRTC = "libnvrtc.so.11.2"
BUILTINS = "libnvrtc-builtins.so.11.8"

_CSTDINT = """#pragma once
// edgedeploy (compile/cuda/nvrtc11.py): the names TVM's CUDA source takes from libcu++, which NVRTC 11.8 lacks
namespace cuda { namespace std {
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
} }
"""

_TYPE_TRAITS = """#pragma once
// edgedeploy (compile/cuda/nvrtc11.py): the names TVM's CUDA source takes from libcu++, which NVRTC 11.8 lacks
namespace cuda { namespace std {
template <class T, T v> struct integral_constant { static constexpr T value = v; };
typedef integral_constant<bool, true> true_type;
typedef integral_constant<bool, false> false_type;
template <class A, class B> struct is_same : false_type {};
template <class A> struct is_same<A, A> : true_type {};
template <class A, class B> constexpr bool is_same_v = is_same<A, B>::value;
template <class T> struct remove_cv { typedef T type; };
template <class T> struct remove_cv<const T> { typedef T type; };
template <class T> struct remove_cv<volatile T> { typedef T type; };
template <class T> struct remove_cv<const volatile T> { typedef T type; };
template <class T> struct __ed_integral : false_type {};
template <> struct __ed_integral<bool> : true_type {};
template <> struct __ed_integral<char> : true_type {};
template <> struct __ed_integral<signed char> : true_type {};
template <> struct __ed_integral<unsigned char> : true_type {};
template <> struct __ed_integral<short> : true_type {};
template <> struct __ed_integral<unsigned short> : true_type {};
template <> struct __ed_integral<int> : true_type {};
template <> struct __ed_integral<unsigned int> : true_type {};
template <> struct __ed_integral<long> : true_type {};
template <> struct __ed_integral<unsigned long> : true_type {};
template <> struct __ed_integral<long long> : true_type {};
template <> struct __ed_integral<unsigned long long> : true_type {};
template <class T> struct is_integral : __ed_integral<typename remove_cv<T>::type> {};
template <class T> struct __ed_floating : false_type {};
template <> struct __ed_floating<float> : true_type {};
template <> struct __ed_floating<double> : true_type {};
template <> struct __ed_floating<long double> : true_type {};
template <class T> struct is_floating_point : __ed_floating<typename remove_cv<T>::type> {};
template <class T, bool = is_integral<T>::value || is_floating_point<T>::value> struct __ed_signed : false_type {};
template <class T> struct __ed_signed<T, true> : integral_constant<bool, T(-1) < T(0)> {};
template <class T> struct is_signed : __ed_signed<typename remove_cv<T>::type> {};
template <class T, bool = is_integral<T>::value> struct __ed_unsigned : false_type {};
template <class T> struct __ed_unsigned<T, true> : integral_constant<bool, T(0) < T(-1)> {};
template <class T> struct is_unsigned : __ed_unsigned<typename remove_cv<T>::type> {};
template <bool B, class T = void> struct enable_if {};
template <class T> struct enable_if<true, T> { typedef T type; };
template <bool B, class T, class F> struct conditional { typedef T type; };
template <class T, class F> struct conditional<false, T, F> { typedef F type; };
} }
"""

SHIM_HEADERS = {"cuda/std/cstdint": _CSTDINT, "cuda/std/type_traits": _TYPE_TRAITS}

# tvm.support.nvcc's NVRTC options, less its ptxas flags (CUDA 11.8's ptxas has no --register-usage-level)
OPTIONS = (
    "-default-device",
    "-std=c++17",
    "--device-int128",
    "-D__NV_SILENCE_DEPRECATION_BEGIN=",
    "-D__NV_SILENCE_DEPRECATION_END=",
    "-D__NV_SILENCE_HOST_DEPRECATION_BEGIN=",
    "-D__NV_SILENCE_HOST_DEPRECATION_END=",
    "-U__CUDA_NO_HALF_OPERATORS__",
    "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT16_OPERATORS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT162_OPERATORS__",
    "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
    "--use_fast_math",
)


class NvrtcError(RuntimeError):
    pass


@dataclass(frozen=True)
class DeviceModule:
    """One CUDA module as NVRTC compiled it: the PTX always, the cubin unless only PTX was asked for."""

    sm: int
    source_sha256: str  # of TVM's CUDA source, as handed to the callback
    ptx: bytes  # text, without NVRTC's trailing NUL
    cubin: bytes | None

    @property
    def ptx_isa(self) -> str:
        """The PTX ISA version (`.version 7.8`): a driver JIT-compiles only ISAs of its CUDA version or older."""
        from .devcode import ptx_version

        return ptx_version(self.ptx) or "?"


class _KeepThreadLocale:
    """NVRTC 11.8 switches the calling thread to the C locale (uselocale) and leaves it there: Python then reads
    every later subprocess's text in that thread as ASCII (`locale.getpreferredencoding()` follows the thread's
    locale), and a UTF-8 byte from a child ('…', '●') raises UnicodeDecodeError far from here. Seen in a test run:
    every text subprocess after tests/host/test_nvrtc11.py failed so. This restores the thread's own locale."""

    def __init__(self) -> None:
        self.libc = ctypes.CDLL(None)
        self.libc.uselocale.restype = ctypes.c_void_p
        self.libc.uselocale.argtypes = [ctypes.c_void_p]
        self.saved: int | None = None

    def __enter__(self) -> None:
        self.saved = self.libc.uselocale(None)  # NULL: ask, change nothing

    def __exit__(self, *exc: object) -> None:
        self.libc.uselocale(self.saved)


class Nvrtc:
    """libnvrtc.so.11.2 through ctypes (no cuda-bindings 11 exists on PyPI for it to go through)."""

    def __init__(self, lib_dir: Path, include: list[Path]) -> None:
        self.keep_locale = _KeepThreadLocale()
        # libnvrtc dlopens its builtins by soname: loaded first (RTLD_GLOBAL) it is found wherever lib_dir is
        with self.keep_locale:
            ctypes.CDLL(str(lib_dir / BUILTINS), mode=ctypes.RTLD_GLOBAL)
            self.lib = ctypes.CDLL(str(lib_dir / LIBNVRTC))
        self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        self.include = include

    def version(self) -> tuple[int, int]:
        major, minor = ctypes.c_int(), ctypes.c_int()
        with self.keep_locale:
            self._check(self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        return major.value, minor.value

    def _check(self, result: int, what: str) -> None:
        if result != 0:
            raise NvrtcError(f"{what}: {self.lib.nvrtcGetErrorString(result).decode()}")

    def _get(self, prog: ctypes.c_void_p, what: str) -> bytes:
        size = ctypes.c_size_t()
        self._check(getattr(self.lib, f"nvrtcGet{what}Size")(prog, ctypes.byref(size)), f"nvrtcGet{what}Size")
        buf = ctypes.create_string_buffer(size.value)
        self._check(getattr(self.lib, f"nvrtcGet{what}")(prog, buf), f"nvrtcGet{what}")
        return buf.raw

    def compile(self, source: str, sm: int, ptx_only: bool = False) -> DeviceModule:
        """`source` for sm_XX: a cubin and its PTX, or (ptx_only) the PTX of compute_XX alone."""
        with self.keep_locale:
            return self._compile(source, sm, ptx_only)

    def _compile(self, source: str, sm: int, ptx_only: bool) -> DeviceModule:
        code = source.encode()
        names = list(SHIM_HEADERS)
        heads = (ctypes.c_char_p * len(names))(*[SHIM_HEADERS[n].encode() for n in names])
        includes = (ctypes.c_char_p * len(names))(*[n.encode() for n in names])
        prog = ctypes.c_void_p()
        self._check(
            self.lib.nvrtcCreateProgram(ctypes.byref(prog), code, b"tvm_kernels.cu", len(names), heads, includes),
            "nvrtcCreateProgram",
        )
        try:
            arch = f"compute_{sm}" if ptx_only else f"sm_{sm}"
            opts = [f"--gpu-architecture={arch}", *OPTIONS, *(f"-I{p}" for p in self.include)]
            argv = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
            result = self.lib.nvrtcCompileProgram(prog, len(opts), argv)
            if result != 0:
                log = self._get(prog, "ProgramLog").rstrip(b"\0").decode(errors="replace")
                errors = [ln for ln in log.splitlines() if "error" in ln] or log.splitlines()[-5:]
                raise NvrtcError(f"NVRTC 11 failed to compile TVM's CUDA source for {arch}: " + "; ".join(errors[:5]))
            ptx = self._get(prog, "PTX").rstrip(b"\0")
            cubin = None if ptx_only else self._get(prog, "CUBIN")
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))
        return DeviceModule(sm, hashlib.sha256(code).hexdigest(), ptx, cubin)


# every module this process compiled through the callback, in order: the compile-cuda stage takes its own
MODULES: list[DeviceModule] = []
_compiler: Nvrtc | None = None


def compiler_from_env() -> Nvrtc:
    global _compiler
    if _compiler is None:
        include = [Path(p) for p in os.environ.get(INCLUDE_ENV, "").split(os.pathsep) if p]
        _compiler = Nvrtc(Path(os.environ[LIB_ENV]), include)
    return _compiler


def ptx_only() -> bool:
    return os.environ.get(FORMAT_ENV, "sass") == "ptx"


def _target_sm() -> int:
    import tvm

    target = tvm.target.Target.current(allow_none=True)
    arch = str(getattr(target, "arch", "")) if target is not None else ""
    if not arch.startswith("sm_") or not arch[3:].isdigit():
        raise NvrtcError(f"the CUDA compile callback needs a target with arch sm_XX (`with target`), got {arch!r}")
    return int(arch[3:])


def tvm_callback_cuda_compile(code: str, *_: Any) -> bytes:
    """TVM's CUDA compile hook: a cubin (TVM stores it as fmt "cubin"), or for twins the PTX text (starting
    with "//", which TVM stores as fmt "ptx" and its module loader hands to the driver to JIT)."""
    module = compiler_from_env().compile(code, _target_sm(), ptx_only=ptx_only())
    MODULES.append(module)
    return module.ptx if module.cubin is None else module.cubin


def install_from_env() -> bool:
    """Register the callback when this process's environment names the NVRTC 11 library (the CUDA worker of a
    `nvrtc-11` profile); a no-op otherwise."""
    if not os.environ.get(LIB_ENV):
        return False
    import tvm_ffi

    tvm_ffi.register_global_func("tvm_callback_cuda_compile", tvm_callback_cuda_compile, override=True)
    return True

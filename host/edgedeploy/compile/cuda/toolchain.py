"""CUDA toolchains per profile, checked before a build, and the environment a CUDA build runs in.

- `nvcc` (h200): CUDA 12/13's nvcc makes a fatbin of SASS.
- `nvrtc-11` (t4, xavier-agx, xavier-nx): NVRTC 11.8 from pip (`pip install 'edgedeploy[cuda11]'`), called
  through ctypes as TVM's compile callback (nvrtc11.py): a cubin that every CUDA 11.x driver loads (JetPack 5:
  11.4), and the PTX of the same compilation (the bundle's model.ptx); a twin's library gets the PTX instead.
- `nvrtc-12`: a CUDA 12 NVRTC from pip (`pip install 'edgedeploy[cuda12]'`): a cubin of SASS. No built-in profile
  uses it now. The cuda11 and cuda12 extras exclude each other: their wheels install into the same
  `nvidia/cuda_*` folders, and the one installed second overwrites the other's headers.

Either way TVM only runs its CUDA compile callback when its CUDA runtime library loads, which needs
`libcuda.so.1`. A GPU-less build host gets a stub driver (every call fails with NO_DEVICE) that lets
the library load; without it TVM would silently store CUDA *source* in the bundle.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from edgedeploy_agent.durable import move_durably

from ...errors import BuildError
from ...paths import cache_dir
from ...profiles import DeviceProfile
from . import nvrtc11

# The driver symbols libtvm_runtime_cuda.so imports (`nm -D --undefined-only`); apache-tvm 0.27.
STUB_SYMBOLS = (
    "cuDeviceGetName",
    "cuFuncSetAttribute",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuLaunchKernelEx",
    "cuModuleGetFunction",
    "cuModuleLoadData",
    "cuModuleUnload",
    "cuTensorMapEncodeTiled",
    "cuInit",
)
CUDA_ERROR_NO_DEVICE = 100
# CUDA 13 supports sm_75 and newer; CUDA 12 supports sm_50 and newer
MIN_SM = {12: 50, 13: 75}


@dataclass(frozen=True)
class CudaToolchain:
    codegen: str  # "nvcc" | "nvrtc-11" | "nvrtc-12"
    version: str  # CUDA version that produces the device code, e.g. "13.0.88"
    env: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        return f"{self.codegen.split('-')[0]} {self.version}"


def stub_libcuda_dir() -> Path:
    """Build (once) a stub libcuda.so.1 into the cache and return its folder."""
    out = cache_dir() / "cuda-stub"
    lib = out / "libcuda.so.1"
    if lib.is_file():
        return out
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise BuildError("GPU builds need a C compiler for the stub CUDA driver", hint="apt-get install gcc")
    out.mkdir(parents=True, exist_ok=True)
    src = out / "stub.c"
    src.write_text(
        "/* GPU-less build host: lets TVM's CUDA runtime load; every driver call fails. */\n"
        + "".join(f"int {s}(void) {{ return {CUDA_ERROR_NO_DEVICE}; }}\n" for s in STUB_SYMBOLS)
    )
    tmp = out / "libcuda.so.1.tmp"
    subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(tmp), str(src)], check=True)
    move_durably(tmp, lib)  # a torn stub would be taken as built
    return out


def _cuda_root(nvcc: str) -> Path | None:
    candidates = [os.environ.get("CUDA_PATH"), str(Path(os.path.realpath(nvcc)).parent.parent), "/usr/local/cuda"]
    for c in candidates:
        if c and (Path(c) / "include" / "cuda_runtime.h").is_file():
            return Path(c)
    # wrapper scripts (e.g. /usr/local/bin/nvcc -> exec /usr/local/cuda-13.0/bin/nvcc)
    text = Path(nvcc).read_text(errors="ignore") if Path(nvcc).stat().st_size < 4096 else ""
    m = re.search(r"(/\S+)/bin/nvcc", text)
    return Path(m.group(1)) if m and (Path(m.group(1)) / "include" / "cuda_runtime.h").is_file() else None


def _find_cudart13(root: Path | None) -> Path | None:
    dirs = [root / "lib64", root / "targets" / "x86_64-linux" / "lib"] if root else []
    dirs += [r / "cu13" / "lib" for r in _nvidia_roots()]
    return next((d for d in dirs if (d / "libcudart.so.13").exists()), None)


def _nvcc_toolchain(profile: DeviceProfile, sm: int) -> CudaToolchain:
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
    if nvcc is None:
        raise BuildError(
            f"profile {profile.name} needs nvcc (CUDA 12 or 13) on PATH",
            hint="install the CUDA toolkit, or build in the edgedeploy builder image",
        )
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release (\d+)\.(\d+), V([\d.]+)", out)
    if not m:
        raise BuildError(f"cannot read the version of {nvcc}")
    major, version = int(m.group(1)), m.group(3)
    if sm < MIN_SM.get(major, 75):
        raise BuildError(
            f"nvcc {version} cannot target sm_{sm}", hint="sm_72 (Xavier) profiles use cuda_codegen = 'nvrtc-11'"
        )
    root = _cuda_root(nvcc)
    if root is None:
        raise BuildError(f"CUDA headers for {nvcc} not found", hint="set CUDA_PATH to the CUDA toolkit root")
    cudart = _find_cudart13(root)
    if cudart is None:
        raise BuildError(
            "libcudart.so.13 not found: TVM's CUDA runtime cannot load, so no device code would be compiled",
            hint="install the CUDA 13 toolkit or `pip install nvidia-cuda-runtime` (cu13)",
        )
    env = {
        nvrtc11.LIB_ENV: "",  # empty: TVM's own callback (nvcc), whatever the calling process had set
        "TVM_CUDA_COMPILE_MODE": "nvcc",
        "CUDA_PATH": str(root),
        "PATH": f"{Path(os.path.realpath(nvcc)).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "LD_LIBRARY_PATH": os.pathsep.join([str(stub_libcuda_dir()), str(cudart)]),
    }
    return CudaToolchain("nvcc", version, env)


def _nvrtc12_toolchain(profile: DeviceProfile, sm: int) -> CudaToolchain:
    hint = "install it with: pip install 'edgedeploy[cuda12]'"
    try:
        bindings = importlib.metadata.version("cuda-bindings")
    except importlib.metadata.PackageNotFoundError:
        raise BuildError(f"profile {profile.name} needs CUDA 12 NVRTC (cuda-bindings 12.x)", hint=hint) from None
    if not bindings.startswith("12."):
        raise BuildError(f"profile {profile.name} needs cuda-bindings 12.x, found {bindings}", hint=hint)
    roots = _nvidia_roots()
    # cuda_nvcc: its headers only (crt/mma.h, which the tensor-core (WMMA) kernels include)
    parts = {
        name: next((r / name for r in roots if (r / name).is_dir()), None)
        for name in ("cuda_nvrtc", "cuda_runtime", "cuda_cccl", "cuda_nvcc")
    }
    missing = [f"nvidia-{n.replace('_', '-')}-cu12" for n, p in parts.items() if p is None]
    if missing:
        raise BuildError(f"profile {profile.name} needs {', '.join(missing)}", hint=hint)
    nvrtc_version = importlib.metadata.version("nvidia-cuda-nvrtc-cu12")
    # NVRTC wants one CUDA_PATH/include: symlinks into these packages, one folder per installation
    where = hashlib.sha256("|".join(str(p) for p in parts.values()).encode()).hexdigest()[:12]
    include = cache_dir() / f"cuda12-root-{where}" / "include"
    include.mkdir(parents=True, exist_ok=True)
    for p in parts.values():
        assert p is not None
        for f in (p / "include").iterdir():
            link = include / f.name
            if not link.exists() and not f.name.startswith("__"):
                link.symlink_to(f)
    cudart = _require_cudart13()
    assert parts["cuda_nvrtc"] is not None
    env = {
        nvrtc11.LIB_ENV: "",  # TVM's own callback (NVRTC 12 through cuda-bindings)
        "TVM_CUDA_COMPILE_MODE": "nvrtc",
        "CUDA_PATH": str(include.parent),
        "LD_LIBRARY_PATH": os.pathsep.join([str(stub_libcuda_dir()), str(cudart), str(parts["cuda_nvrtc"] / "lib")]),
    }
    return CudaToolchain("nvrtc-12", nvrtc_version, env)


def _require_cudart13() -> Path:
    """The folder of a libcudart.so.13: TVM's CUDA runtime library needs one to load and register the codegen,
    whatever compiles the device code."""
    cudart = _find_cudart13(None) or _find_cudart13(Path("/usr/local/cuda"))
    if cudart is None:
        raise BuildError(
            "libcudart.so.13 not found (needed to load TVM's CUDA codegen)",
            hint="install the CUDA 13 runtime: `pip install nvidia-cuda-runtime` (cu13)",
        )
    return cudart


def _nvidia_roots() -> list[Path]:
    spec = importlib.util.find_spec("nvidia")
    return [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cudart_version(include: Path) -> int | None:
    """CUDART_VERSION of the headers in `include` (11080 for CUDA 11.8)."""
    m = re.search(r"#define\s+CUDART_VERSION\s+(\d+)", (include / "cuda_runtime_api.h").read_text(errors="ignore"))
    return int(m.group(1)) if m else None


def _nvrtc11_toolchain(profile: DeviceProfile, sm: int) -> CudaToolchain:
    hint = "install it with: pip install 'edgedeploy[cuda11]'"
    wheels = ("nvidia-cuda-nvrtc-cu11", "nvidia-cuda-runtime-cu11", "nvidia-cuda-nvcc-cu11")
    missing = [w for w in wheels if _dist_version(w) is None]
    if missing:
        raise BuildError(f"profile {profile.name} needs NVRTC 11.8 and its headers: {', '.join(missing)}", hint=hint)
    # the cu12 wheels write the same nvidia/cuda_* folders: whichever came second left its headers there
    clash = [w.replace("cu11", "cu12") for w in wheels if _dist_version(w.replace("cu11", "cu12"))]
    roots = _nvidia_roots()
    parts = {
        n: next((r / n for r in roots if (r / n).is_dir()), None) for n in ("cuda_nvrtc", "cuda_runtime", "cuda_nvcc")
    }
    lib = parts["cuda_nvrtc"] / "lib" if parts["cuda_nvrtc"] else None
    if lib is None or not (lib / nvrtc11.LIBNVRTC).exists() or not (lib / nvrtc11.BUILTINS).exists():
        raise BuildError(
            f"profile {profile.name} needs {nvrtc11.LIBNVRTC} and {nvrtc11.BUILTINS} (nvidia-cuda-nvrtc-cu11 11.8)",
            hint=hint,
        )
    runtime_inc = parts["cuda_runtime"] / "include" if parts["cuda_runtime"] else None
    nvcc_inc = parts["cuda_nvcc"] / "include" if parts["cuda_nvcc"] else None
    if runtime_inc is None or nvcc_inc is None or not (nvcc_inc / "crt" / "mma.h").is_file():
        raise BuildError(
            f"profile {profile.name} needs the CUDA 11.8 headers (cuda_fp16.h, mma.h, crt/mma.h)", hint=hint
        )
    cudart_h = _cudart_version(runtime_inc) if (runtime_inc / "cuda_runtime_api.h").is_file() else None
    if clash or cudart_h is None or cudart_h // 1000 != 11:
        raise BuildError(
            f"the CUDA headers in {runtime_inc} are not CUDA 11's (CUDART_VERSION {cudart_h})"
            + (f"; {', '.join(clash)} installed beside the cu11 wheels overwrote them" if clash else ""),
            hint=f"pip uninstall -y {' '.join(clash) or 'nvidia-cuda-runtime-cu12'} && "
            f"pip install --force-reinstall 'edgedeploy[cuda11]'",
        )
    version = str(_dist_version("nvidia-cuda-nvrtc-cu11"))  # there: refused above otherwise
    cudart = _require_cudart13()
    env = {
        nvrtc11.LIB_ENV: str(lib),
        nvrtc11.INCLUDE_ENV: os.pathsep.join([str(runtime_inc), str(nvcc_inc)]),
        nvrtc11.FORMAT_ENV: profile.compiler.cuda_device_code,
        "LD_LIBRARY_PATH": os.pathsep.join([str(stub_libcuda_dir()), str(cudart), str(lib)]),
    }
    return CudaToolchain("nvrtc-11", version, env)


def resolve_toolchain(profile: DeviceProfile) -> CudaToolchain:
    """Check that everything a CUDA build for `profile` needs is here; say what is missing and how to get it."""
    if profile.cuda_sm is None or profile.compiler.cuda_codegen is None:
        raise BuildError(f"profile {profile.name} is a CUDA profile without cuda_sm / compiler.cuda_codegen")
    if profile.compiler.cuda_codegen == "nvcc":
        return _nvcc_toolchain(profile, profile.cuda_sm)
    if profile.compiler.cuda_codegen == "nvrtc-11":
        return _nvrtc11_toolchain(profile, profile.cuda_sm)
    return _nvrtc12_toolchain(profile, profile.cuda_sm)

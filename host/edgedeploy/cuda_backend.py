"""Builds edgedeploy's CUDA backend for the TVM runtime (`libedgedeploy_cuda.so`) for a device architecture.

The source is `edgedeploy_agent/runtime/cuda_backend.cc` (docs/gpu.md, "The CUDA backend"): the TVM
runtime's device API, module loader and CUDA graphs on the CUDA 11.4 driver API, resolved from
libcuda.so.1 at run time, so the build needs no CUDA toolkit: only g++ (x86_64) or aarch64-linux-gnu-g++
(Jetson) and the headers the apache-tvm and apache-tvm-ffi wheels ship. Builds are cached by the hash of
the sources, the headers' versions and the compiler, so `agent install` and the tests build once.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.resources
import importlib.util
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from edgedeploy_agent.durable import move_durably

from .errors import BuildError
from .paths import cache_dir

LIBRARY = "libedgedeploy_cuda.so"


@dataclass(frozen=True)
class Arch:
    compiler: str  # the g++ that targets it
    dl_version: str  # the oldest glibc symbol version of dlopen/dlsym/dlerror on this architecture
    package: str  # the Debian package that brings the compiler


ARCHS = {
    "x86_64": Arch("g++", "GLIBC_2.2.5", "g++"),
    "aarch64": Arch("aarch64-linux-gnu-g++", "GLIBC_2.17", "g++-aarch64-linux-gnu"),
}
# Only the copy of libstdc++'s std::__throw_bad_array_new_length stays out of the dynamic symbol table
# (cuda_backend.cc says why it is there); everything else keeps its default visibility.
_VERSION_SCRIPT = "{ global: *; local: _ZSt28__throw_bad_array_new_lengthv; };\n"


def sources() -> list[Path]:
    """The backend's source and the two stand-in headers (cuda_backend_include/), from the agent package."""
    root = Path(str(importlib.resources.files("edgedeploy_agent.runtime")))
    main = root / "cuda_backend.cc"
    headers = sorted((root / "cuda_backend_include").rglob("*.h"))
    if not main.is_file() or not headers:
        raise BuildError(f"the CUDA backend's source is missing from {root}", hint="reinstall edgedeploy")
    return [main, *headers]


def include_dirs() -> list[Path]:
    """Our stand-in headers, then the apache-tvm and apache-tvm-ffi wheels' headers (found without importing
    either package: importing tvm loads its 260 MB compiler)."""
    found = []
    for package, parts in (("tvm", ("include",)), ("tvm", ("src", "runtime")), ("tvm_ffi", ("include",))):
        spec = importlib.util.find_spec(package)
        locations = list(spec.submodule_search_locations or []) if spec else []
        folder = next((Path(loc).joinpath(*parts) for loc in locations if Path(loc).joinpath(*parts).is_dir()), None)
        if folder is None:
            raise BuildError(
                f"the {package} package's {'/'.join(parts)} headers are not installed",
                hint="install the host extra: pip install 'edgedeploy[host]'",
            )
        found.append(folder)
    return [sources()[0].parent / "cuda_backend_include", *found]


def _compiler(arch: str) -> tuple[Arch, str, str]:
    """(the architecture's build facts, the compiler's path, the path and version line that key the cache)"""
    if arch not in ARCHS:
        raise BuildError(f"no CUDA backend for {arch}", hint=f"architectures: {', '.join(ARCHS)}")
    spec = ARCHS[arch]
    path = shutil.which(spec.compiler)
    if path is None:
        raise BuildError(f"the CUDA backend for {arch} needs {spec.compiler}", hint=f"apt-get install {spec.package}")
    version = subprocess.run([path, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    return spec, path, f"{path} {' '.join(version)}"


def build_backend(arch: str) -> Path:
    """libedgedeploy_cuda.so for `arch` (x86_64 | aarch64), built once into the cache."""
    spec, cxx, compiler = _compiler(arch)
    files = sources()
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode() + b"\0" + f.read_bytes())
    for package in ("apache-tvm", "apache-tvm-ffi"):
        digest.update(f"{package}=={importlib.metadata.version(package)}".encode())
    digest.update(compiler.encode())
    out = cache_dir() / "cuda-backend" / f"{arch}-{digest.hexdigest()[:16]}" / LIBRARY
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    script = out.parent / "exports.map"
    script.write_text(_VERSION_SCRIPT)
    tmp = out.with_name(LIBRARY + ".building")
    command = [
        cxx,
        "-std=c++17",
        "-O2",
        "-fPIC",
        "-shared",
        f'-DEDGEDEPLOY_DL_VERSION="{spec.dl_version}"',
        *(f"-I{d}" for d in include_dirs()),
        "-o",
        str(tmp),
        str(files[0]),
        f"-Wl,--version-script={script}",
        f"-Wl,-soname,{LIBRARY}",
    ]
    p = subprocess.run(command, capture_output=True, text=True)
    if p.returncode != 0:
        errors = [ln for ln in p.stderr.splitlines() if "error" in ln] or p.stderr.splitlines()[-1:] or ["no output"]
        raise BuildError(f"building the CUDA backend for {arch} failed: {errors[0]}")
    tmp.chmod(0o755)
    move_durably(tmp, out)
    return out

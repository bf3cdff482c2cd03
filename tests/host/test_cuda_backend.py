"""edgedeploy's CUDA backend for the TVM runtime (agent/edgedeploy_agent/runtime/cuda_backend.cc), on a machine
without a GPU: built for x86_64 and aarch64 with the toolchains CI has, its driver entry points checked against
CUDA 11.x's own declarations, its library loadable on JetPack 5's glibc and libstdc++, and loaded into a real TVM
runtime in a process of its own, where it reads a real GPU bundle's device module and says clearly that there
is no driver or no device. What only a GPU can show (bit-identical outputs, speed) is bench/gpu_backend.sh's."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgedeploy.compile.cuda.devcode import elf_machine
from edgedeploy.compile.elf_versions import version_needs
from edgedeploy.cuda_backend import ARCHS, build_backend, sources
from tests.helpers import require

# JetPack 5 (Ubuntu 20.04): glibc 2.31 and GCC 10's libstdc++ (GLIBCXX_3.4.28, CXXABI_1.3.12)
FLOORS = {"GLIBC": (2, 31), "GLIBCXX": (3, 4, 28), "CXXABI": (1, 3, 12)}
DRIVER_FLOOR = 11040  # CUDA 11.4, as cuDriverGetVersion counts


def entry_points() -> list[str]:
    """The driver symbols the backend resolves, read from its one list (EDGEDEPLOY_CUDA_ENTRY_POINTS)."""
    text = sources()[0].read_text()
    block = text.split("#define EDGEDEPLOY_CUDA_ENTRY_POINTS(X)", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"X\((cu\w+),", block)


def _compiler_or_skip(arch: str) -> None:
    missing = f"{ARCHS[arch].compiler} not installed (containers/install-build-deps.sh installs it)"
    require(
        "GCC" if arch == "x86_64" else "CROSS_TOOLCHAIN",
        missing if shutil.which(ARCHS[arch].compiler) is None else None,
    )


CUDA11_ENTRY_POINTS = Path(__file__).resolve().parents[1] / "fixtures" / "cuda11.7_driver_entry_points.txt"


def cuda11_versions() -> dict[str, list[int]]:
    """name -> the CUDA versions that introduced its ABIs, from CUDA 11.7's cudaTypedefs.h (tests/fixtures)."""
    versions: dict[str, list[int]] = {}
    for line in CUDA11_ENTRY_POINTS.read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split()
            versions.setdefault(name, []).append(int(version))
    return versions


def test_every_entry_point_is_in_the_cuda_11_4_driver_api() -> None:
    versions = cuda11_versions()
    names = entry_points()
    assert len(names) == 39 and len(set(names)) == len(names), names
    for symbol in names:
        base, _, abi = symbol.rpartition("_v") if re.search(r"_v\d$", symbol) else (symbol, "", "1")
        assert base in versions, f"{symbol}: not a CUDA 11.7 driver entry point"
        # the plain name is the oldest ABI, _v2 the next (per-thread-stream variants come later still)
        introduced = sorted(versions[base])[int(abi) - 1]
        assert introduced <= DRIVER_FLOOR, f"{symbol} needs CUDA {introduced} (> 11.4)"
    # what CUDA 11.5-11.7 added to the driver API (from the same file): none of it is used
    newer = {n for n, vs in versions.items() if min(vs) > DRIVER_FLOOR}
    assert {"cuGraphAddBatchMemOpNode", "cuArrayGetMemoryRequirements"} <= newer  # the file says what we think
    assert not newer & {s.rpartition("_v")[0] or s for s in names}


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_builds_for_each_device_architecture_within_jetpack_5s_floors(arch: str) -> None:
    _compiler_or_skip(arch)
    lib = build_backend(arch)
    data = lib.read_bytes()
    assert elf_machine(data) == arch
    built = lib.stat()
    assert build_backend(arch) == lib and (lib.stat().st_ino, lib.stat().st_mtime_ns) == (
        built.st_ino,
        built.st_mtime_ns,
    )
    needs = {n.version for n in version_needs(data)}
    for version in needs:
        family, _, number = version.partition("_")
        if family in FLOORS and number.replace(".", "").isdigit():
            assert tuple(int(p) for p in number.split(".")) <= FLOORS[family], f"{lib} needs {version}"
    # the driver is opened at run time, never linked: no libcuda or libcudart in the library's needs
    assert not [n for n in version_needs(data) if "cuda" in n.library]
    assert b"libcudart" not in data and b"libcuda.so.1" in data
    for symbol in entry_points():
        assert symbol.encode() + b"\0" in data, symbol


FAKE_DRIVER = r"""
#include <string.h>
int cuGetErrorName(int e, const char **s) { *s = "CUDA_ERROR_NO_DEVICE"; return 0; }
int cuGetErrorString(int e, const char **s) { *s = "no CUDA-capable device is detected"; return 0; }
"""


def _run_backend(backend: Path, script: str, ld_path: Path | None = None) -> str:
    """Load libtvm_runtime.so and the backend into a fresh Python (never this one: a process holds one CUDA
    backend) and run `script` there; returns its stdout."""
    prelude = (
        "import ctypes, sys, tvm_ffi\n"
        "from edgedeploy_agent.runtime.tvm import find_runtime_lib\n"
        "ctypes.CDLL(str(find_runtime_lib()), ctypes.RTLD_GLOBAL)\n"
        f"ctypes.CDLL({str(backend)!r}, ctypes.RTLD_GLOBAL)\n"
        "info = tvm_ffi.get_global_func('edgedeploy.cuda.backend_info')\n"
    )
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(ld_path) if ld_path else ""}
    p = subprocess.run([sys.executable, "-c", prelude + script], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout


@pytest.mark.compile
def test_no_driver_and_no_device_are_one_clear_error(tmp_path: Path) -> None:
    _compiler_or_skip("x86_64")
    backend = build_backend("x86_64")
    check = (
        "print(dict(info())['problem'])\n"
        "try:\n"
        "    alloc = tvm_ffi.get_global_func('runtime.TVMTensorAllocWithScope')\n"
        "    alloc((2,), 'float32', tvm_ffi.device('cuda', 0), None)\n"
        "except RuntimeError as e:\n"
        "    print(str(e).splitlines()[-1])\n"
    )
    empty = tmp_path / "nodriver"
    empty.mkdir()
    out = _run_backend(backend, check, empty).splitlines()
    assert out[0].startswith("edgedeploy CUDA backend: no CUDA driver: libcuda.so.1 cannot be loaded")
    assert "no CUDA driver" in out[1]
    # a driver whose cuInit finds no GPU (a container without one): every entry point there, all failing
    names = entry_points()
    stubs = "".join(f"int {n}(void) {{ return 100; }}\n" for n in names if not n.startswith("cuGetError"))
    (tmp_path / "fake.c").write_text(FAKE_DRIVER + stubs)
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "libcuda.so.1"), str(tmp_path / "fake.c")], check=True
    )
    out = _run_backend(backend, check, tmp_path).splitlines()
    assert out[0] == (
        "edgedeploy CUDA backend: no CUDA device (cuInit: CUDA_ERROR_NO_DEVICE (100): no CUDA-capable device is "
        "detected)"
    )


@pytest.mark.compile
@pytest.mark.cuda
def test_reads_the_device_module_of_a_real_gpu_bundle(tmp_path: Path) -> None:
    """An h200 library (nvcc 13 fatbin): the backend's reader of TVM's serialized CUDA module gives the format
    and every kernel with its argument and launch counts, without a GPU (the driver is needed only on launch)."""
    from tests.host.cuda import require_toolchain
    from tests.host.models import convnet

    require_toolchain("h200")
    _compiler_or_skip("x86_64")
    from edgedeploy.api import build
    from edgedeploy.compile.cards import ModelCard
    from edgedeploy_agent.bundle import Preprocess, extract_bundle

    res = build(convnet(tmp_path / "convnet.onnx"), "h200", tmp_path / "c.edb", ModelCard(
        name="convnet", preprocess=Preprocess(scale=1 / 255)), precision="fp16")  # fmt: skip
    extract_bundle(res.bundle, tmp_path / "rel")
    library = tmp_path / "rel" / "model.so"
    out = _run_backend(
        build_backend("x86_64"),
        "import json\n"
        f"lib = tvm_ffi.load_module({str(library)!r})\n"
        "def find(m):\n"
        "    return m if m.kind == 'cuda' else next(x for x in map(find, m.imports) if x is not None)\n"
        "m = tvm_ffi.get_global_func('edgedeploy.cuda.module_info')(find(lib))\n"
        "print(json.dumps({'format': m['format'], 'kernels': {k: dict(v) for k, v in m['kernels'].items()}}))\n",
    )
    import json

    info = json.loads(out)
    assert info["format"] in ("cubin", "fatbin")  # TVM calls an nvcc fatbin "cubin"; the driver takes either
    kernels = info["kernels"]
    assert len(kernels) >= 5
    blob = library.read_bytes()
    for name, k in kernels.items():
        assert name.endswith("_kernel") and name.encode() in blob
        assert k["args"] >= 1 and 1 <= k["launch_values"] <= 6

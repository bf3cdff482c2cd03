"""CUDA helpers for the host tests: the sm_75 target the schedule tests compile for, the CUDA source TVM writes,
and the tools a GPU-profile build needs (nvcc or NVRTC, cuobjdump and nvdisasm), each through require()."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import tvm

from edgedeploy.compile.cuda.devcode import device_blobs
from edgedeploy.compile.cuda.tensorcore import legalize_passes
from edgedeploy.compile.cuda.toolchain import resolve_toolchain
from edgedeploy.errors import BuildError
from edgedeploy.profiles import get_profile
from tests.helpers import require

TARGET = {
    "kind": "cuda",
    "arch": "sm_75",
    "max_threads_per_block": 1024,
    "max_num_threads": 1024,
    "max_shared_memory_per_block": 49152,
    "thread_warp_size": 32,
    "registers_per_block": 65536,
}


def cuda_source(mod: Any, rule: Any = None) -> str:
    """The CUDA source of `mod` built for TARGET (the tensor-core rule `rule` when given)."""
    target = tvm.target.Target({**TARGET, "host": {"kind": "llvm"}})
    with target:
        ex = tvm.compile(tvm.transform.Sequential(legalize_passes(target, rule))(mod), target=target)

    def modules(m: Any) -> Any:
        yield m
        for i in m.imports:
            yield from modules(i)

    return "".join(m.inspect_source() for m in modules(ex.mod) if m.kind == "cuda")


def require_toolchain(profile: str) -> None:
    """The CUDA toolchain `profile` builds with (nvcc or NVRTC); CI sets EDGEDEPLOY_REQUIRE_GPU_TOOLCHAIN=1."""
    try:
        resolve_toolchain(get_profile(profile))
    except BuildError as e:
        require("GPU_TOOLCHAIN", f"no CUDA toolchain for {profile} here: {e.message}")


def find_cuobjdump() -> str | None:
    """CUDA 13's cuobjdump (pip's nvidia-cuda-cuobjdump, else PATH's)."""
    spec = importlib.util.find_spec("nvidia")
    for root in spec.submodule_search_locations if spec and spec.submodule_search_locations else []:
        exe = Path(root) / "cu13" / "bin" / "cuobjdump"
        if exe.is_file():
            exe.chmod(0o755)
            return str(exe)
    return shutil.which("cuobjdump")


def find_cuobjdump_cuda12() -> str | None:
    """CUDA 12.8's cuobjdump (with its nvdisasm), shipped inside the triton wheel: it still reads sm_72."""
    spec = importlib.util.find_spec("triton")
    for root in spec.submodule_search_locations if spec and spec.submodule_search_locations else []:
        exe = Path(root) / "backends" / "nvidia" / "bin" / "cuobjdump"
        if exe.is_file():
            return str(exe)
    return None


def require_cuobjdump(sm: int = 75, nvdisasm: bool = True) -> str:
    """A cuobjdump that reads sm_`sm` device code (and its nvdisasm beside it, to dump SASS, when `nvdisasm`)."""
    exe = find_cuobjdump() if sm >= 75 else find_cuobjdump_cuda12()
    if exe is None or (nvdisasm and not (Path(exe).parent / "nvdisasm").exists()):
        tools = "nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm" if sm >= 75 else "triton==3.3.1 (CUDA 12.8 tools)"
        require("GPU_TOOLCHAIN", f"cuobjdump/nvdisasm for sm_{sm} not installed (pip install {tools})")
    assert exe is not None
    if nvdisasm:
        (Path(exe).parent / "nvdisasm").chmod(0o755)
    return exe


def dump_sass(lib: Path, tmp_path: Path, sm: int = 75) -> str:
    """The SASS of a built library's one device-code blob."""
    cuobjdump = require_cuobjdump(sm)
    [(kind, blob)] = device_blobs(lib.read_bytes())
    (tmp_path / f"dev.{kind}").write_bytes(blob)
    env = {**os.environ, "NVDISASM_PATH": str(Path(cuobjdump).parent)}
    cmd = [cuobjdump, "--dump-sass", str(tmp_path / f"dev.{kind}")]
    return subprocess.run(cmd, capture_output=True, text=True, env=env).stdout


# profile -> (SM, host architecture, CUDA codegen) of the GPU profiles the build tests build
GPU_PROFILES = {"t4": (75, "x86_64", "nvrtc"), "h200": (90, "x86_64", "nvcc"), "xavier-agx": (72, "aarch64", "nvrtc")}

"""What `agent install` uploads: the agent's wheel (built from this checkout or taken from a wheelhouse)
and the TVM runtime library for the device's architecture."""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
from pathlib import Path

from edgedeploy_agent.errors import RuntimeLoadError

from ..errors import InputError

PROJECT_ROOT = Path(__file__).resolve().parents[3]
SOURCE_PARTS = ("pyproject.toml", "README.md", "agent", "host", "profiles", "examples")  # what pyproject packages


def agent_wheels(out: Path, wheelhouse: Path | None) -> list[Path]:
    """[the edgedeploy wheel, other wheels...]: from `wheelhouse`, else built from this source checkout."""
    if wheelhouse is not None:
        wheels = sorted(wheelhouse.glob("*.whl"))
        ours = [w for w in wheels if w.name.startswith("edgedeploy-")]
        if not ours:
            raise InputError(f"no edgedeploy-*.whl in {wheelhouse}", hint="build one with `pip wheel --no-deps .`")
        return ours[:1] + [w for w in wheels if w not in ours]
    if not (PROJECT_ROOT / "pyproject.toml").is_file():
        raise InputError("this edgedeploy is not a source checkout", hint="pass --wheelhouse DIR with the agent wheel")
    # build from a clean copy: setuptools' build/ folder in the checkout could carry stale modules into the wheel
    src = out / "src"
    for name in SOURCE_PARTS:
        part = PROJECT_ROOT / name
        if part.is_dir():
            shutil.copytree(part, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            src.mkdir(parents=True, exist_ok=True)
            shutil.copy2(part, src / name)
    p = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
        capture_output=True,
        text=True,
    )
    built = sorted(out.glob("edgedeploy-*.whl"))
    if p.returncode != 0 or not built:
        lines = p.stderr.strip().splitlines() or ["no output"]
        why = next((ln.strip() for ln in lines if "error" in ln.lower() and "hint" not in ln.lower()), lines[-1])
        raise InputError(f"building the agent wheel from {PROJECT_ROOT} failed: {why}")
    return built[:1]


CUDA_BACKEND_DIR = "cuda-backend"  # in a wheelhouse: cuda-backend/<arch>/libedgedeploy_cuda.so


def wheelhouse_backend(wheelhouse: Path, arch: str) -> Path:
    """Where a wheelhouse keeps edgedeploy's CUDA backend for `arch`."""
    from ..cuda_backend import LIBRARY

    return wheelhouse / CUDA_BACKEND_DIR / arch / LIBRARY


def cuda_backend_for(device_arch: str, wheelhouse: Path | None) -> tuple[Path | None, str]:
    """edgedeploy's CUDA backend for the device's architecture: the wheelhouse's, else built here (cached);
    (None, why) when neither can be had (a CPU-only device does not need it)."""
    from ..cuda_backend import build_backend
    from ..errors import BuildError

    if wheelhouse is not None:
        lib = wheelhouse_backend(wheelhouse, device_arch)
        if lib.is_file():
            return lib, f"from {wheelhouse}"
    try:
        return build_backend(device_arch), "built here"
    except BuildError as e:
        return None, f"not installed: {e.message}" + (f" ({e.hint})" if e.hint else "")


def default_runtime_lib(device_arch: str) -> Path | None:
    """This machine's libtvm_runtime.so when the device has the same architecture, else None."""
    if device_arch != platform.machine():
        return None  # aarch64 (Jetson) needs its own build: containers/tvm-runtime-kit.sh, docs/agent-service.md
    from edgedeploy_agent.runtime.tvm import find_runtime_lib  # the agent's runtime (NumPy): only for an install

    try:
        return find_runtime_lib()
    except RuntimeLoadError:
        return None

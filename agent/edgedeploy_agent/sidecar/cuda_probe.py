"""Which CUDA device is here, asked of the driver through ctypes, before anything touches TensorRT.

TensorRT's lean runtime segfaults when it deserializes with no usable driver (reference notes §5), so
the TensorRT runtime calls `probe_cuda()` first. The driver query is gpu.py's (the one the bundle
compatibility check uses); this adds the CUDA runtime version and TensorRT's engine-key form.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from pathlib import Path
from typing import Any

from ..errors import RuntimeLoadError
from ..gpu import CudaDevice as GpuFacts
from ..gpu import probe_cuda as query_driver


class CudaDevice:
    """Facts about CUDA device 0 that decide whether a TensorRT engine can be reused."""

    def __init__(self, name: str, compute_capability: str, driver_version: str, runtime_version: str | None):
        self.name = name
        self.compute_capability = compute_capability
        self.driver_version = driver_version
        self.runtime_version = runtime_version

    def as_gpu(self) -> GpuFacts:
        """The same facts in the form the bundle compatibility check takes."""
        major, _, minor = self.compute_capability.partition(".")
        return GpuFacts(driver_api=self.driver_version, name=self.name, sm=int(major) * 10 + int(minor or 0))

    def as_dict(self) -> dict[str, str | None]:
        return {
            "gpu_name": self.name,
            "compute_capability": self.compute_capability,
            "cuda_driver": self.driver_version,
            "cuda_runtime": self.runtime_version,
        }


def probe_cuda(libcuda: str = "libcuda.so.1") -> CudaDevice:
    """Device 0's name, compute capability and CUDA versions; RuntimeLoadError when there is no usable GPU."""
    gpu, reason = query_driver(libcuda)
    if gpu is None:
        raise RuntimeLoadError(
            f"no usable CUDA GPU on this device: {reason}",
            hint="TensorRT bundles need an NVIDIA GPU with its driver (check nvidia-smi, or tegrastats on Jetson, "
            "and that the agent's user may open /dev/nvidia*); or build a TVM bundle for a CPU profile",
        )
    return CudaDevice(
        name=gpu.name,
        compute_capability=f"{gpu.sm // 10}.{gpu.sm % 10}",
        driver_version=gpu.driver_api,
        runtime_version=_cudart_version(),
    )


def _cudart_version() -> str | None:
    """The CUDA runtime TensorRT will use, when a libcudart can be found (None otherwise)."""
    found = ctypes.util.find_library("cudart")
    for name in ([found] if found else []) + ["libcudart.so"]:
        try:
            lib: Any = ctypes.CDLL(name)
        except OSError:
            continue
        v = ctypes.c_int(0)
        if lib.cudaRuntimeGetVersion(ctypes.byref(v)) == 0:
            return f"{v.value // 1000}.{(v.value % 1000) // 10}"
    return None


def l4t_release(root: Path = Path("/")) -> str | None:
    """The Jetson L4T release from etc/nv_tegra_release, e.g. 'R35 (release), REVISION: 4.1'; None off Jetson."""
    try:
        first = (root / "etc" / "nv_tegra_release").read_text(encoding="utf-8", errors="replace").splitlines()[0]
    except (OSError, IndexError):
        return None
    # "# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref, EABI: aarch64, DATE: ..."
    parts = [p.strip() for p in first.lstrip("# ").split(",")]
    return ", ".join(parts[:2]) if parts and parts[0] else None

"""Which CUDA device is here, asked of the driver through ctypes, before anything touches TensorRT.

TensorRT's lean runtime segfaults when it deserializes with no usable driver (reference notes §5), so
the TensorRT runtime calls `probe_cuda()` first. Only the standard library is used here.
"""

import ctypes
import ctypes.util
from pathlib import Path
from typing import Any, Callable, Optional

from ..errors import RuntimeLoadError
from ..gpu import CudaDevice as GpuFacts

_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76


def _load_default(name: str) -> Any:
    return ctypes.CDLL(name)


class CudaDevice:
    """Facts about CUDA device 0 that decide whether a TensorRT engine can be reused."""

    def __init__(self, name: str, compute_capability: str, driver_version: str, runtime_version: Optional[str]):
        self.name = name
        self.compute_capability = compute_capability
        self.driver_version = driver_version
        self.runtime_version = runtime_version

    def as_gpu(self) -> GpuFacts:
        """The same facts in the form the bundle compatibility check takes."""
        major, _, minor = self.compute_capability.partition(".")
        return GpuFacts(driver_api=self.driver_version, name=self.name, sm=int(major) * 10 + int(minor or 0))

    def as_dict(self) -> dict[str, Optional[str]]:
        return {
            "gpu_name": self.name,
            "compute_capability": self.compute_capability,
            "cuda_driver": self.driver_version,
            "cuda_runtime": self.runtime_version,
        }


def _version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


def probe_cuda(load: Callable[[str], Any] = _load_default) -> CudaDevice:
    """Device 0's name, compute capability and CUDA versions; RuntimeLoadError when there is no usable GPU."""
    try:
        cuda = load("libcuda.so.1")
    except OSError as e:
        raise RuntimeLoadError(
            f"no CUDA driver on this device ({e})",
            hint="TensorRT bundles need an NVIDIA GPU with its driver; build a TVM bundle for a CPU profile instead",
        ) from None
    rc = cuda.cuInit(0)
    count = ctypes.c_int(0)
    if rc != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value < 1:
        raise RuntimeLoadError(
            f"the CUDA driver reports no usable device (cuInit returned {rc}, {count.value} devices)",
            hint="check nvidia-smi (or tegrastats on Jetson) and that the agent's user may open /dev/nvidia*",
        )
    dev = ctypes.c_int(0)
    cuda.cuDeviceGet(ctypes.byref(dev), 0)
    name = ctypes.create_string_buffer(256)
    cuda.cuDeviceGetName(name, 256, dev)
    major, minor, drv = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0)
    cuda.cuDeviceGetAttribute(ctypes.byref(major), _CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
    cuda.cuDeviceGetAttribute(ctypes.byref(minor), _CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
    cuda.cuDriverGetVersion(ctypes.byref(drv))
    return CudaDevice(
        name=name.value.decode("utf-8", "replace"),
        compute_capability=f"{major.value}.{minor.value}",
        driver_version=_version(drv.value),
        runtime_version=_cudart_version(load),
    )


def _cudart_version(load: Callable[[str], Any]) -> Optional[str]:
    """The CUDA runtime TensorRT will use, when a libcudart can be found (None otherwise)."""
    found = ctypes.util.find_library("cudart")
    for name in ([found] if found else []) + ["libcudart.so"]:
        try:
            lib = load(name)
        except OSError:
            continue
        v = ctypes.c_int(0)
        if lib.cudaRuntimeGetVersion(ctypes.byref(v)) == 0:
            return _version(v.value)
    return None


def l4t_release(root: Path = Path("/")) -> Optional[str]:
    """The Jetson L4T release from etc/nv_tegra_release, e.g. 'R35 (release), REVISION: 4.1'; None off Jetson."""
    try:
        first = (root / "etc" / "nv_tegra_release").read_text(encoding="utf-8", errors="replace").splitlines()[0]
    except (OSError, IndexError):
        return None
    # "# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref, EABI: aarch64, DATE: ..."
    parts = [p.strip() for p in first.lstrip("# ").split(",")]
    return ", ".join(parts[:2]) if parts and parts[0] else None

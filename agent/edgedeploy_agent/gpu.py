"""What CUDA the device offers, read from the driver (libcuda) with ctypes: no CUDA toolkit needed.

Standard library only, and Python 3.8: the TensorRT side probes with it under JetPack's Python (sidecar/).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

_CC_MAJOR, _CC_MINOR = 75, 76  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_{MAJOR,MINOR}
_INTEGRATED = 18  # CU_DEVICE_ATTRIBUTE_INTEGRATED: the GPU shares the host's memory (Jetson)


@dataclass(frozen=True)
class CudaDevice:
    driver_api: str  # e.g. "13.0" (what cuDriverGetVersion says)
    name: str
    sm: int  # e.g. 75
    integrated: bool = False  # shares the host's memory (a Jetson): page-locked host memory is the GPU's too


def _version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


def probe_cuda(libcuda: str = "libcuda.so.1") -> tuple[CudaDevice | None, str]:
    """The first CUDA device, or None with the reason (no driver, no device, ...)."""
    try:
        cuda: Any = ctypes.CDLL(libcuda)
    except OSError:
        return None, "no CUDA driver (libcuda.so.1 not found)"
    try:
        if cuda.cuInit(0) != 0:
            return None, "CUDA driver found but cuInit failed (no GPU visible?)"
        version, count = ctypes.c_int(), ctypes.c_int()
        cuda.cuDriverGetVersion(ctypes.byref(version))
        if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value < 1:
            return None, "CUDA driver reports no device"
        dev, major, minor, integrated = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        cuda.cuDeviceGet(ctypes.byref(dev), 0)
        cuda.cuDeviceGetAttribute(ctypes.byref(major), _CC_MAJOR, dev)
        cuda.cuDeviceGetAttribute(ctypes.byref(minor), _CC_MINOR, dev)
        cuda.cuDeviceGetAttribute(ctypes.byref(integrated), _INTEGRATED, dev)
        name = ctypes.create_string_buffer(256)
        cuda.cuDeviceGetName(name, 256, dev)
    except AttributeError as e:
        return None, f"libcuda is incomplete ({e})"
    return CudaDevice(
        driver_api=_version(version.value),
        name=name.value.decode(errors="replace"),
        sm=major.value * 10 + minor.value,
        integrated=bool(integrated.value),
    ), ""


def version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split(".") if x.isdigit())

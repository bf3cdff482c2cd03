"""A DLPack view of memory the caller already holds, on a device the caller names: how the runtime hands TVM a
GPU's own address for page-locked host memory (runtime/cuda_copy.py `device_pointer`), so a kernel writes its
result straight into host memory and no copy comes back (TVM's runtime makes no such view itself).

`tvm_ffi.from_dlpack(DeviceView(...))` gives a TVM tensor over those bytes; nothing is copied or freed: the
tensor keeps the view alive (its deleter lets it go), the view keeps the owner, whose memory stays where it is.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):  # DLTensor (dlpack.h)
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _Managed(ctypes.Structure):  # DLManagedTensor (dlpack.h): the unversioned capsule "dltensor"
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]


# views a consumer holds, by the address of their DLManagedTensor: the consumer reads the shape from it for the
# tensor's life and calls the deleter when done, which lets the view (and its owner) go
_HELD: dict[int, DeviceView] = {}


def _let_go(managed: int | None) -> None:
    _HELD.pop(managed or 0, None)


_release = _DELETER(_let_go)


_capsule = ctypes.pythonapi.PyCapsule_New
_capsule.restype = ctypes.py_object
_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_CODES = {"i": 0, "u": 1, "f": 2}


class DeviceView:
    """`array`'s shape and dtype at `address` on (device_type, device_id), DLPack's device types (2: CUDA); it
    keeps `owner` (what holds the memory; the array by default) alive."""

    def __init__(
        self, array: np.ndarray, address: int, device_type: int, device_id: int = 0, owner: Any = None
    ) -> None:
        if not array.flags.c_contiguous or array.dtype.kind not in _CODES:
            raise ValueError(f"a view needs a contiguous int, uint or float array, not {array.dtype} {array.flags}")
        self.owner = array if owner is None else owner
        self._shape = (ctypes.c_int64 * array.ndim)(*array.shape)
        dtype = _DataType(_CODES[array.dtype.kind], array.dtype.itemsize * 8, 1)
        tensor = _Tensor(address, _Device(device_type, device_id), array.ndim, dtype, self._shape, None, 0)
        self._managed = _Managed(tensor, None, _release)
        self._device = (device_type, device_id)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._device

    def __dlpack__(self, **_: Any) -> Any:
        _HELD[ctypes.addressof(self._managed)] = self  # until the consumer's tensor is freed (one at a time)
        return _capsule(ctypes.addressof(self._managed), b"dltensor", None)

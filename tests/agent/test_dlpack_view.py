"""runtime/dlpack_view.py: a TVM tensor over memory the caller holds, on the device the caller names (the GPU's
address of the runtime's page-locked top-k buffer; no GPU here: a CPU view shows the aliasing, a CUDA one the
device and address TVM is given)."""

from __future__ import annotations

import numpy as np
import pytest

from edgedeploy_agent.runtime.cuda_copy import device_pointer
from edgedeploy_agent.runtime.dlpack_view import DeviceView

tvm_ffi = pytest.importorskip("tvm_ffi")


def test_a_cpu_view_aliases_the_array() -> None:
    owner = np.zeros((1, 2, 5), np.float64)
    view = DeviceView(owner, owner.ctypes.data, 1)
    tensor = tvm_ffi.from_dlpack(view)
    np.from_dlpack(tensor)[0, 1, 3] = 7.0  # a write through TVM's tensor lands in the owner's memory
    assert owner[0, 1, 3] == 7.0 and tensor.shape == (1, 2, 5) and str(tensor.dtype) == "float64"


def test_a_cuda_view_has_the_given_device_and_address() -> None:
    owner = np.zeros((4, 2, 5), np.float64)
    address = owner.ctypes.data + 4096  # what the driver would give (the same under unified addressing)
    tensor = tvm_ffi.from_dlpack(DeviceView(owner, address, 2))
    assert (tensor.device.dlpack_device_type(), tensor.device.index) == (2, 0)
    assert tensor.data_ptr() == address and tensor.shape == (4, 2, 5)


def test_a_view_needs_a_contiguous_number_array() -> None:
    with pytest.raises(ValueError, match="contiguous"):
        DeviceView(np.zeros((4, 4))[:, ::2], 0, 2)


def test_no_driver_no_device_pointer() -> None:
    assert device_pointer(4096, library="libcuda-missing.so.1") is None


def test_the_tensor_keeps_its_view_until_it_is_freed() -> None:
    import gc

    from edgedeploy_agent.runtime import dlpack_view

    owner = np.zeros((3, 5), np.float32)
    tensor = tvm_ffi.from_dlpack(DeviceView(owner, owner.ctypes.data, 1))  # the view is no one else's
    gc.collect()
    assert tensor.shape == (3, 5) and len(dlpack_view._HELD) == 1
    del tensor
    gc.collect()
    assert not dlpack_view._HELD

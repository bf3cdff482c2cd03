"""Input tensors aligned the way TVM declares its buffers.

TVM declares every buffer 64-byte aligned, and the AVX code it generates uses aligned vector loads: a
numpy array that is only 16-byte aligned, handed to the library without a copy, faults. preprocess()
allocates its output aligned, so the runtime takes it as it is; anything else is copied once.
"""

from typing import Any

import numpy as np

ALIGNMENT = 64


def aligned_empty(shape: "tuple[int, ...]", dtype: Any) -> np.ndarray:
    """An uninitialised array whose data starts on an ALIGNMENT-byte boundary."""
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dt.itemsize
    raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    out: np.ndarray = raw[start : start + nbytes].view(dt).reshape(shape)
    return out


def aligned(x: np.ndarray) -> np.ndarray:
    """`x` itself when its data is ALIGNMENT-byte aligned, else an aligned copy."""
    if x.ctypes.data % ALIGNMENT == 0:
        return x
    out = aligned_empty(x.shape, x.dtype)
    out[...] = x
    return out

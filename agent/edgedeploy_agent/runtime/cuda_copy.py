"""Frames to the GPU: the crop box of a page-locked frame batch in one copy, queued ahead where it can be.

TVM's copy (`runtime.TVMTensorCopyFromTo`) takes contiguous tensors only, so a lent frame batch went whole: a
1280x720 frame is 2.76 MB, its centre crop (87.5 % of the short side, 630x630) 1.19 MB. `cuMemcpy3DAsync` from
the CUDA driver (libcuda.so.1, which every CUDA backend runs on, the wheel's through libcudart and
edgedeploy's directly) copies a box of rows of each frame of the batch at once: pitch W*3 bytes in, w*3 out.

Queued on the legacy default stream, the one TVM's runtime uses here (both backends), the copy is in order with
the preprocessing kernel after it. A capture thread that has just decoded a frame queues its copy ahead, on a
stream of its own while the previous frame's model runs, and records an event the default stream later waits on
(TvmRuntime.prefetch_frames). The driver API needs the primary context current on the calling thread; a thread
that has made no CUDA call yet (a capture thread) gets it made current here, as the runtime API would do.
"""

from __future__ import annotations

import ctypes
from typing import Any

MEMORYTYPE_HOST, MEMORYTYPE_DEVICE = 1, 2
ERROR_INVALID_CONTEXT = 201
STREAM_NON_BLOCKING, EVENT_DISABLE_TIMING = 0x1, 0x2


class Memcpy3D(ctypes.Structure):
    """CUDA_MEMCPY3D (cuda.h; 200 bytes on 64-bit Linux, the same on JetPack 5's CUDA 11.4 and CUDA 13)."""

    _fields_ = [
        ("srcXInBytes", ctypes.c_size_t),
        ("srcY", ctypes.c_size_t),
        ("srcZ", ctypes.c_size_t),
        ("srcLOD", ctypes.c_size_t),
        ("srcMemoryType", ctypes.c_int),
        ("srcHost", ctypes.c_void_p),
        ("srcDevice", ctypes.c_uint64),
        ("srcArray", ctypes.c_void_p),
        ("reserved0", ctypes.c_void_p),
        ("srcPitch", ctypes.c_size_t),
        ("srcHeight", ctypes.c_size_t),
        ("dstXInBytes", ctypes.c_size_t),
        ("dstY", ctypes.c_size_t),
        ("dstZ", ctypes.c_size_t),
        ("dstLOD", ctypes.c_size_t),
        ("dstMemoryType", ctypes.c_int),
        ("dstHost", ctypes.c_void_p),
        ("dstDevice", ctypes.c_uint64),
        ("dstArray", ctypes.c_void_p),
        ("reserved1", ctypes.c_void_p),
        ("dstPitch", ctypes.c_size_t),
        ("dstHeight", ctypes.c_size_t),
        ("WidthInBytes", ctypes.c_size_t),
        ("Height", ctypes.c_size_t),
        ("Depth", ctypes.c_size_t),
    ]


def box_params(host: int, device: int, shape: tuple[int, ...], box: tuple[int, int, int, int]) -> Memcpy3D:
    """The copy of crop box (top, left, height, width) of each frame of a uint8 batch `shape` (N, H, W, C) at
    host address `host` into a dense (N, height, width, C) device buffer at `device`."""
    n, frame_height, frame_width, channels = shape
    top, left, height, width = box
    if not (0 <= top and top + height <= frame_height and 0 <= left and left + width <= frame_width):
        raise ValueError(f"crop box {box} is not inside frames of {frame_height}x{frame_width}")
    p = Memcpy3D()
    p.srcXInBytes, p.srcY, p.srcMemoryType, p.srcHost = left * channels, top, MEMORYTYPE_HOST, host
    p.srcPitch, p.srcHeight = frame_width * channels, frame_height
    p.dstMemoryType, p.dstDevice, p.dstPitch, p.dstHeight = MEMORYTYPE_DEVICE, device, width * channels, height
    p.WidthInBytes, p.Height, p.Depth = width * channels, height, n
    return p


class DriverCopies:
    """The few driver calls the frame path makes itself: the box copy (`cuMemcpy3DAsync`), and for uploads queued
    ahead by the capture thread, a stream of their own (non-blocking: it does not wait for the model's kernels on
    the default stream), an event per buffer and the default stream's wait on it. After a failure it says why
    (`failure`) and every call returns False: callers copy another way (staging the box, on the default stream)."""

    def __init__(self, library: str = "libcuda.so.1") -> None:
        self.failure: str | None = None
        cuda = ctypes.CDLL(library)
        self._fn: dict[str, Any] = {}
        for name, argtypes in (
            ("cuMemcpy3DAsync_v2", [ctypes.POINTER(Memcpy3D), ctypes.c_void_p]),
            ("cuDevicePrimaryCtxRetain", [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]),
            ("cuCtxSetCurrent", [ctypes.c_void_p]),
            ("cuStreamCreate", [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]),
            ("cuEventCreate", [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]),
            ("cuEventRecord", [ctypes.c_void_p, ctypes.c_void_p]),
            ("cuStreamWaitEvent", [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint]),
        ):
            fn = getattr(cuda, name)
            fn.argtypes, fn.restype = argtypes, ctypes.c_int
            self._fn[name] = fn

    def _call(self, name: str, *args: Any) -> bool:
        if self.failure is not None:
            return False
        rc: int = self._fn[name](*args)
        if rc == ERROR_INVALID_CONTEXT:  # this thread's first CUDA call: the primary context, as cudart does
            context = ctypes.c_void_p()
            if self._fn["cuDevicePrimaryCtxRetain"](ctypes.byref(context), 0) == 0:
                if self._fn["cuCtxSetCurrent"](context) == 0:
                    rc = self._fn[name](*args)
        if rc != 0:
            self.failure = f"{name} failed with CUresult {rc}"
        return rc == 0

    def copy_box(self, params: Memcpy3D, stream: int | None = None) -> bool:
        """Queue the copy on `stream` (None: the legacy default stream, TVM's)."""
        return self._call("cuMemcpy3DAsync_v2", ctypes.byref(params), stream)

    def new_stream(self) -> int | None:
        stream = ctypes.c_void_p()
        return stream.value if self._call("cuStreamCreate", ctypes.byref(stream), STREAM_NON_BLOCKING) else None

    def new_event(self) -> int | None:
        event = ctypes.c_void_p()
        return event.value if self._call("cuEventCreate", ctypes.byref(event), EVENT_DISABLE_TIMING) else None

    def record(self, event: int, stream: int) -> bool:
        return self._call("cuEventRecord", event, stream)

    def wait(self, event: int) -> bool:
        """The default stream (TVM's kernels) waits for the event before its next work; the host does not."""
        return self._call("cuStreamWaitEvent", None, event, 0)


def load_driver_copies() -> tuple[DriverCopies | None, str | None]:
    """(the driver's calls, None), or (None, why not)."""
    try:
        return DriverCopies(), None
    except (OSError, AttributeError) as e:
        return None, f"no frame copies from libcuda.so.1: {e}"

"""The driver calls the runtime makes itself (libcuda.so.1 through ctypes): the crop box of a page-locked frame
batch to the GPU in one copy, only the bytes preprocessing reads; the GPU's address of page-locked host
memory, where a kernel writes its result without a copy back (`device_pointer`, runtime/dlpack_view.py); two
CUDA events that time the model alone in a frame whose input was loaded before it (`ModelClock`); and one untimed
event that tells the host when the copy and preprocessing queued before the model have finished (`QueueMark`); a frame's
box copy queued by the capture's thread on a stream of its own, which the runtime's stream waits for (`AheadCopy`).

TVM's copy (`runtime.TVMTensorCopyFromTo`) takes contiguous tensors only, so a lent frame batch went whole: a
1280x720 frame is 2.76 MB, its centre crop (87.5 % of the short side, 630x630) 1.19 MB. `cuMemcpy3DAsync` from
the CUDA driver (libcuda.so.1, which every CUDA backend runs on, the wheel's through libcudart and
edgedeploy's directly) copies a box of rows of each frame of the batch at once: pitch W*3 bytes in, w*3 out.

It is queued on the legacy default stream, the one TVM's runtime uses here (both backends): in order with the
preprocessing kernel after it. The driver API needs the primary context current on the calling thread; a
thread that has not yet made a CUDA call gets it made current here (as the runtime API would do).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Hashable
from typing import Any

MEMORYTYPE_HOST, MEMORYTYPE_DEVICE = 1, 2
EVENT_DISABLE_TIMING = 2  # CU_EVENT_DISABLE_TIMING: the cheapest event to record and wait for
STREAM_NON_BLOCKING = 1  # CU_STREAM_NON_BLOCKING: no implicit order with the legacy default stream
EVENT_RECORD_EXTERNAL = 1  # CU_EVENT_RECORD_EXTERNAL: recorded while a stream is recorded, an event node of the graph
ERROR_INVALID_CONTEXT = 201


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


@functools.cache
def libcuda(library: str) -> ctypes.PyDLL:
    """libcuda, loaded once per process and path (this module's calls and runtime/frame_graph.py's). PyDLL: its
    calls keep the GIL, as the runtime's TVM calls do (runtime/tvm.py): they only queue work, and a CDLL call's
    release let the capture thread take the GIL in the middle of the loop's stage."""
    return ctypes.PyDLL(library)


class BoxCopy:
    """cuMemcpy3DAsync on prepared parameters; after a failure it says why (`failure`) and callers copy another
    way (the caller's fallback: the box through a page-locked staging buffer, as for frames it did not lend)."""

    def __init__(self, library: str = "libcuda.so.1") -> None:
        self.failure: str | None = None
        cuda = libcuda(library)
        self._copy = cuda.cuMemcpy3DAsync_v2
        self._copy.argtypes = [ctypes.POINTER(Memcpy3D), ctypes.c_void_p]
        self._copy.restype = ctypes.c_int
        self._retain = cuda.cuDevicePrimaryCtxRetain
        self._retain.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
        self._set_current = cuda.cuCtxSetCurrent
        self._set_current.argtypes = [ctypes.c_void_p]

    def __call__(self, params: Memcpy3D, device_id: int = 0, stream: int = 0) -> bool:
        """Queue the copy on `stream` (0: the legacy default stream); False (and `failure` set) when the driver
        refused it."""
        if self.failure is not None:
            return False
        rc = self._copy(ctypes.byref(params), stream or None)
        if rc == ERROR_INVALID_CONTEXT and self.make_current(device_id):  # this thread's first CUDA call
            rc = self._copy(ctypes.byref(params), stream or None)
        if rc != 0:
            self.failure = f"cuMemcpy3DAsync failed with CUresult {rc}"
            return False
        return True

    def make_current(self, device_id: int = 0) -> bool:
        """Make the device's primary context current on this thread, as cudart does on a thread's first call."""
        context = ctypes.c_void_p()
        return bool(self._retain(ctypes.byref(context), device_id) == 0 and self._set_current(context) == 0)


def device_pointer(host: int, library: str = "libcuda.so.1") -> int | None:
    """The GPU's address of page-locked host memory at `host` (cuMemHostGetDevicePointer: the same address under
    unified addressing, which every 64-bit CUDA platform has, Jetson's shared memory too), or None when the driver
    gives none: the caller then copies. Needs the context TVM made current on this thread (its allocation did)."""
    try:
        get = libcuda(library).cuMemHostGetDevicePointer_v2
    except (OSError, AttributeError):
        return None
    get.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p, ctypes.c_uint]
    get.restype = ctypes.c_int
    address = ctypes.c_uint64()
    return int(address.value) if get(ctypes.byref(address), host, 0) == 0 and address.value else None


class Retired:
    """Driver handles whose owner went away, destroyed later: `add` may run in a finaliser on any thread (where no
    CUDA context is current; one list append, atomic under the GIL), `destroy` runs on the thread that owns them."""

    def __init__(self, destroy: Any) -> None:
        self._destroy = destroy
        self._handles: list[ctypes.c_void_p] = []

    def __bool__(self) -> bool:
        return bool(self._handles)

    def add(self, handle: ctypes.c_void_p) -> None:
        self._handles.append(handle)

    def destroy(self) -> None:
        while self._handles:
            self._destroy(self._handles.pop())


def bind(cuda: ctypes.PyDLL, name: str, *argtypes: Any) -> Any:
    """The driver's `name`, its argument types set, returning a CUresult."""
    func = getattr(cuda, name)
    func.argtypes = list(argtypes)
    func.restype = ctypes.c_int
    return func


class _Events:
    """What the model clock and the queue mark share: the driver's event calls, and the first failure (`failure`:
    what failed with which CUresult; callers then measure nothing more)."""

    def __init__(self, library: str) -> None:
        self.failure: str | None = None
        cuda, p = libcuda(library), ctypes.c_void_p
        self._cuda = cuda
        self._create = bind(cuda, "cuEventCreate", ctypes.POINTER(p), ctypes.c_uint)
        self._record = bind(cuda, "cuEventRecord", p, p)
        self._destroy = bind(cuda, "cuEventDestroy_v2", p)  # cuda.h's cuEventDestroy

    def _ok(self, what: str, rc: int) -> bool:
        if rc != 0 and self.failure is None:
            self.failure = f"{what} failed with CUresult {rc}"
        return rc == 0


class ModelClock(_Events):
    """The GPU's time for the model alone, in a frame whose preprocessing was queued before it: a CUDA event queued
    on the legacy default stream (the runtime's) after the preprocessing kernel (`start`), one after the model's
    kernels (`stop`), read once the frame was waited for (`read`: their distance in ms, or None when this frame did
    not mark both). The host's clock cannot tell: load_frames only queues, so the wait that ends the infer stage
    also covers the preprocessing the GPU was still running (H100, 720p MobileNetV1-0.25: the infer stage read
    1.45-1.52x the kernel alone, the events 0.90-0.91x). The events cost a frame 4.6-8.2 us there, so only every
    `every`-th frame's `start` records (the others read None) and the reports carry the number beside the stages
    (`model_gpu_ms`). After a failure it says why (`failure`) and reads None."""

    def __init__(self, library: str = "libcuda.so.1", every: int = 1) -> None:
        super().__init__(library)
        self.every = every
        self._frames = 0  # start() calls so far: the sampled ones are 0, every, 2 * every, ...
        p = ctypes.c_void_p
        self._elapsed = bind(self._cuda, "cuEventElapsedTime", ctypes.POINTER(ctypes.c_float), p, p)
        self._events: list[ctypes.c_void_p] = []
        self._marked = 0  # events recorded for this frame: 0, 1 (start) or 2 (start and stop)

    def start(self) -> None:
        """A frame's preprocessing is queued: on a sampled frame, queue the first event (on the thread that queued
        the preprocessing: its context is current)."""
        self._marked = 0
        sampled = self.due()
        self._frames += 1
        if not sampled:
            return
        if not self._events:  # CU_EVENT_DEFAULT: timed
            events = [ctypes.c_void_p(), ctypes.c_void_p()]
            if not all(self._ok("cuEventCreate", self._create(ctypes.byref(e), 0)) for e in events):
                return
            self._events = events
        if self._ok("cuEventRecord", self._record(self._events[0], None)):
            self._marked = 1

    def stop(self) -> None:
        """Queue the second event (after the model's kernels), if this frame started the clock."""
        if self._marked == 1 and self._ok("cuEventRecord", self._record(self._events[1], None)):
            self._marked = 2

    @property
    def started(self) -> bool:
        """This frame's first event is queued and its second is not yet."""
        return self._marked == 1

    def due(self) -> bool:
        """The next `start` samples its frame (a caller that cannot place the events, a whole frame's graph, then
        queues that frame the usual way)."""
        return self._frames % self.every == 0 and self.failure is None

    def cancel(self) -> None:
        """Forget this frame's events: what runs next was not preprocessed after `start`."""
        self._marked = 0

    def read(self) -> float | None:
        """ms from start to stop on the GPU, once both events completed (the caller waited for the stream)."""
        marked, self._marked = self._marked, 0
        if marked != 2:
            return None
        ms = ctypes.c_float()
        return float(ms.value) if self._ok("cuEventElapsedTime", self._elapsed(ms, *self._events)) else None

    def close(self) -> None:
        """Destroy the events (the runtime's close); a later `start` would create new ones."""
        events, self._events, self._marked = self._events, [], 0
        for event in events:
            self._ok("cuEventDestroy", self._destroy(event))


class QueueMark(_Events):
    """Where the GPU has got to in the legacy default stream's queue: `mark` queues an untimed event (after what is
    queued so far: a frame's preprocessing), `wait` returns once the GPU has passed it. The runtime marks the end
    of a frame's preprocessing, queues the model behind it, then waits for the mark: the host's clock then splits
    the frame where the GPU did (the preprocess stage ends when the GPU's preprocessing does), and the GPU never
    waits for the host to queue the model. After a failure it says why (`failure`) and marks nothing more."""

    def __init__(self, library: str = "libcuda.so.1") -> None:
        super().__init__(library)
        p = ctypes.c_void_p
        self._sync = bind(self._cuda, "cuEventSynchronize", p)
        try:  # CUDA 11.1+: JetPack 5's 11.4 has it
            self._record_flags = bind(self._cuda, "cuEventRecordWithFlags", p, p, ctypes.c_uint)
        except AttributeError:
            self._record_flags = None
        self._event: ctypes.c_void_p | None = None

    def mark(self) -> bool:
        """Queue the event (on the thread that queued the work before it: its context is current); False when the
        driver refused (then `wait` must not be called for it)."""
        if self.failure is not None or not self._created():
            return False
        return self._ok("cuEventRecord", self._record(self._event, None))

    def _created(self) -> bool:
        """The event exists (created on the first call); False when the driver refused it."""
        if self._event is None:
            event = ctypes.c_void_p()
            if not self._ok("cuEventCreate", self._create(ctypes.byref(event), EVENT_DISABLE_TIMING)):
                return False
            self._event = event
        return True

    def mark_in(self, stream: int) -> None:
        """Queue the event on `stream` while the driver records it: an event node of the graph, which records the
        event at each of its launches after what the graph ran before it (a whole frame's graph: the preprocessing;
        `wait` then waits for that). Raises where the driver refused (no cuEventRecordWithFlags before CUDA 11.1):
        the recording is then given up (FrameGraphs.capture), and the frame queued the usual way."""
        if self.failure is not None or not self._created():
            raise RuntimeError(f"no mark: {self.failure}")
        if self._record_flags is None:
            raise RuntimeError("no cuEventRecordWithFlags in libcuda.so.1 (CUDA 11.1+)")
        rc = self._record_flags(self._event, stream or None, EVENT_RECORD_EXTERNAL)
        if rc != 0:  # not `failure`: the mark still works outside a graph
            raise RuntimeError(f"cuEventRecordWithFlags (external, while recording) failed with CUresult {rc}")

    def wait(self) -> None:
        """Return once the GPU has done what was queued before the last `mark`."""
        if self._event is not None:
            self._ok("cuEventSynchronize", self._sync(self._event))

    def close(self) -> None:
        """Destroy the event (the runtime's close)."""
        event, self._event = self._event, None
        if event is not None:
            self._ok("cuEventDestroy", self._destroy(event))


class AheadCopy(_Events):
    """A lent frame's crop box sent to the GPU as soon as it is decoded: on the capture's thread (`send`, keyed by
    the lent batch), the box copy queued on a non-blocking stream of its own with an untimed event after it; on the
    loop's, the legacy default stream (the runtime's) made to wait for that event on the GPU (`take`) before the
    preprocessing is queued, and told whether the batch's current fill was sent (else the loop copies it). The
    copy (a 720p frame's box: 1.19 MB, about 0.02 ms over PCIe by the measured 62 GB/s) then runs while the loop is
    still being woken for the frame, or finishing the one before, instead of inside its preprocess stage. Each
    batch has a device buffer of its own (TvmRuntime.frame_batch with `ahead`): the copy of one never waits for,
    nor overwrites, what the loop's kernels read from another. After a failure it says why (`failure`) and sends
    nothing more: the loop copies the box itself, as for any batch."""

    def __init__(self, copy: BoxCopy, library: str = "libcuda.so.1") -> None:
        super().__init__(library)
        p = ctypes.c_void_p
        self._box_copy = copy
        self._stream_create = bind(self._cuda, "cuStreamCreate", ctypes.POINTER(p), ctypes.c_uint)
        self._stream_destroy = bind(self._cuda, "cuStreamDestroy_v2", p)
        self._wait = bind(self._cuda, "cuStreamWaitEvent", p, p, ctypes.c_uint)
        self._stream: ctypes.c_void_p | None = None
        self._events: dict[Hashable, ctypes.c_void_p] = {}  # key -> the event after its last copy
        self._sent: set[Hashable] = set()  # keys sent since their last `take`
        # events of retired keys, destroyed on a thread that sends (a refusal said, as close says one)
        self._retired = Retired(lambda event: self._ok("cuEventDestroy", self._destroy(event)))

    def send(self, key: Hashable, params: Memcpy3D) -> bool:
        """Queue the copy `params` describes on the stream, then `key`'s event; False (and `failure` set) when the
        driver refused a step (the copy may then be queued or not: the caller copies again)."""
        self._sent.discard(key)  # (a refill that is not sent must not pass for the last one that was)
        if self.failure is not None:
            return False
        self._retired.destroy()
        if self._stream is None:
            stream = ctypes.c_void_p()
            if not self._call("cuStreamCreate", self._stream_create, ctypes.byref(stream), STREAM_NON_BLOCKING):
                return False
            self._stream = stream
        event = self._events.get(key)
        if event is None:
            event = ctypes.c_void_p()
            if not self._call("cuEventCreate", self._create, ctypes.byref(event), EVENT_DISABLE_TIMING):
                return False
            self._events[key] = event
        if not self._box_copy(params, stream=self._stream.value or 0):
            self.failure = f"sending a frame ahead: {self._box_copy.failure}"
            return False
        if not self._call("cuEventRecord", self._record, event, self._stream):
            return False
        self._sent.add(key)
        return True

    def _call(self, what: str, func: Any, *args: Any) -> bool:
        """`func(*args)`, made again after the primary context was made current where the calling thread had none
        (a thread's first CUDA call: the capture thread's may be this one's); False (and `failure` set) on a
        refusal."""
        rc = func(*args)
        if rc == ERROR_INVALID_CONTEXT and self._box_copy.make_current():
            rc = func(*args)
        return self._ok(what, rc)

    def take(self, key: Hashable) -> bool:
        """For the loop, about to preprocess `key`'s batch: make the legacy default stream wait for `key`'s last copy
        (the host goes on at once; waited for even when this fill was not sent: a copy sent for a fill never loaded
        may still be running); True when this fill was sent and waited for, False when the caller must copy it
        (not sent, the driver refused, or sending failed since)."""
        sent = key in self._sent
        self._sent.discard(key)
        event = self._events.get(key)
        waited = event is not None and self._ok("cuStreamWaitEvent", self._wait(None, event, 0))
        return sent and waited and self.failure is None

    def retire(self, key: Hashable) -> None:
        """`key`'s batch went: forget whether it was sent; its event is destroyed at the next send or close (a
        finaliser may run on any thread). Single set, dict and list operations, atomic under the GIL."""
        self._sent.discard(key)
        event = self._events.pop(key, None)
        if event is not None:
            self._retired.add(event)

    def close(self) -> None:
        """Destroy the events and the stream (the runtime's close, after the capture threads stopped)."""
        self._retired.destroy()
        events, self._events = self._events, {}
        for event in events.values():
            self._ok("cuEventDestroy", self._destroy(event))
        if self._stream is not None:
            self._ok("cuStreamDestroy", self._stream_destroy(self._stream))
            self._stream = None


def load_ahead_copy(copy: BoxCopy | None) -> AheadCopy | None:
    """Frames sent ahead over `copy` (AheadCopy), or None without it or the driver's stream and event calls."""
    if copy is None:
        return None
    try:
        return AheadCopy(copy)
    except (OSError, AttributeError):
        return None


def load_box_copy() -> tuple[BoxCopy | None, str | None]:
    """(the driver's box copy, None), or (None, why not)."""
    try:
        return BoxCopy(), None
    except (OSError, AttributeError) as e:
        return None, f"no cuMemcpy3DAsync from libcuda.so.1: {e}"


def load_queue_mark() -> QueueMark | None:
    """The stages' mark (QueueMark), or None without the driver's event calls (the stage then ends when the
    preprocessing is queued, as before)."""
    try:
        return QueueMark()
    except (OSError, AttributeError):
        return None

"""CUDA graphs of a frame's work on the GPU: what the runtime queues for a lent frame (the crop box's copy and the
preprocessing kernel; the model and the postprocess function) recorded once and replayed with one launch.

Queued call by call, a MobileNetV1-0.25 frame costs the host about as much as its kernels cost the GPU: on an H100
the box copy 0.020 ms, the preprocessing call 0.009, the model's VM call 0.028 (its quantize kernel, its own CUDA
graph, its softmax), the postprocess call 0.015, against a 0.066 ms model (docs/agent-service.md, the frame
pipeline). A graph launch replaces each group of calls.

How a graph is made (`FrameGraphs.capture`): the work is queued as usual, but on a stream of the runtime's own that
the driver is recording (`cuStreamBeginCapture`), with TVM's current stream switched to it
(`tvm_ffi.use_raw_stream`), so TVM's kernels are recorded too. The recording is in relaxed mode: the VM's pooled
allocator may allocate while it runs (the memory is allocated at once, not recorded; the graph holds its address,
and the pool or the runtime's kept outputs keep it). In thread-local mode (until 2026-12-07) the driver refused such
an allocation, and the pool answered by freeing every buffer it cached, scratch memory of graphs recorded before
included: on the H200 MobileNetV1-0.25's whole-frame graph, then its model-and-top-k graph, could not be recorded
(the pool had no spare buffer of their output's size; the VM's own CUDA graph, replayed by edgedeploy's backend
outside recordings, allocates nothing from it). Other threads are not affected in either mode. The stream is
non-blocking: work on the legacy default stream, where the runtime queues everything else, never depends on the
recording. A graph is launched on the legacy default stream, so it is in order with all the rest. A graph holds the
addresses its work used: the caller keys each graph by what it was recorded with (a lent frame batch, its device
buffer) and retires it when that goes.

A VM function with a CUDA graph of its own (bundles are built with them) cannot launch that graph into a recording:
edgedeploy's CUDA backend runs the function's kernels plainly while the current stream is being recorded
(cuda_backend.cc, RunOrCapture), and frees no memory while it is (FreeDataSpace). Anything the driver refuses while
recording (the wheel's backend launching its graph) ends the recording with an error: `capture` then returns False
and says why (`failure`), nothing of the recording stays, the caller queues the frame call by call, and no graph is
tried again.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Hashable

from .cuda_copy import STREAM_NON_BLOCKING, Retired, bind, libcuda

CAPTURE_MODE_RELAXED = 2  # CU_STREAM_CAPTURE_MODE_RELAXED: allocations allowed while recording


class FrameGraphs:
    """Graphs keyed by the caller: `run(key, queue)` launches `key`'s graph, recording it first from `queue` on the
    second call for `key` (the first is the caller's, call by call: kernels load, pools fill, tables are made,
    none of which may happen while recording). `retire(key)` forgets a key whose addresses go away, its graph
    destroyed at the next call on the owning thread (a finaliser may run on any thread, where no CUDA context is
    current); `close()` destroys them all."""

    def __init__(self, library: str = "libcuda.so.1") -> None:
        self.failure: str | None = None
        cuda = libcuda(library)
        p = ctypes.c_void_p
        self._stream_create = bind(cuda, "cuStreamCreate", ctypes.POINTER(p), ctypes.c_uint)
        self._stream_destroy = bind(cuda, "cuStreamDestroy_v2", p)
        self._begin = bind(cuda, "cuStreamBeginCapture_v2", p, ctypes.c_int)
        self._end = bind(cuda, "cuStreamEndCapture", p, ctypes.POINTER(p))
        self._instantiate = bind(cuda, "cuGraphInstantiateWithFlags", ctypes.POINTER(p), p, ctypes.c_ulonglong)
        self._launch = bind(cuda, "cuGraphLaunch", p, p)
        self._exec_destroy = bind(cuda, "cuGraphExecDestroy", p)
        self._graph_destroy = bind(cuda, "cuGraphDestroy", p)
        self._stream: ctypes.c_void_p | None = None
        self._graphs: dict[Hashable, ctypes.c_void_p] = {}
        self._seen: set[Hashable] = set()  # keys whose first call the caller made itself
        self._retired = Retired(self._exec_destroy)  # graphs of retired keys, destroyed on the owning thread
        self.recorded = 0  # graphs recorded so far (retired ones included)
        self.launches = 0  # graph launches so far

    def __contains__(self, key: Hashable) -> bool:
        return key in self._graphs

    def __len__(self) -> int:
        return len(self._graphs)

    def run(self, key: Hashable, queue: Callable[[int], None]) -> bool:
        """Launch `key`'s graph (recorded from `queue` first, on the key's second call); False when the caller
        queues this call's work itself: the key's first call, or no graph (`failure` says why)."""
        if self.failure is not None:
            return False
        if self.launch(key):
            return True
        if key not in self._seen:
            self._seen.add(key)
            return False
        return self.capture(key, queue) and self.launch(key)

    def ready(self, key: Hashable) -> bool:
        """Whether `run(key, ...)` now replays or records a graph, for a caller that must know before it queues
        anything: False on the key's first call (counted as the caller's own, as `run` counts it) and after a
        failure. (The recording may still be refused: `run` then returns False.)"""
        if self.failure is not None:
            return False
        if key in self._graphs or key in self._seen:
            return True
        self._seen.add(key)
        return False

    def _refuse(self, what: str, rc: int) -> bool:
        if self.failure is None:
            self.failure = f"{what} failed with CUresult {rc}"
        return False

    def capture(self, key: Hashable, queue: Callable[[int], None]) -> bool:
        """Record what `queue(stream)` queues on `stream` (a handle, for calls that take one; TVM's current stream
        is the caller's to switch) as the graph for `key`. Nothing runs: the caller launches it. False (and
        `failure` set) when the driver refused the recording or `queue` raised: the recording is thrown away and
        the caller queues the work itself (where `queue` failed for a reason of its own, it fails again there)."""
        if self.failure is not None:
            return False
        self._retired.destroy()
        if self._stream is None:
            stream = ctypes.c_void_p()
            rc = self._stream_create(ctypes.byref(stream), STREAM_NON_BLOCKING)
            if rc != 0:
                return self._refuse("cuStreamCreate", rc)
            self._stream = stream
        rc = self._begin(self._stream, CAPTURE_MODE_RELAXED)
        if rc != 0:
            return self._refuse("cuStreamBeginCapture", rc)
        graph = ctypes.c_void_p()
        try:
            queue(self._stream.value or 0)
        except Exception as e:  # TVM raises when the driver refused one of its calls while recording
            self._end(self._stream, ctypes.byref(graph))
            if graph.value:
                self._graph_destroy(graph)
            self.failure = f"recording a frame graph: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            return False
        rc = self._end(self._stream, ctypes.byref(graph))  # a call refused while recording invalidated it
        if rc != 0 or not graph.value:
            if graph.value:
                self._graph_destroy(graph)
            return self._refuse("recording a frame graph (cuStreamEndCapture)", rc)
        executable = ctypes.c_void_p()
        rc = self._instantiate(ctypes.byref(executable), graph, 0)
        self._graph_destroy(graph)
        if rc != 0:
            return self._refuse("cuGraphInstantiateWithFlags", rc)
        old = self._graphs.pop(key, None)
        if old is not None:
            self._exec_destroy(old)
        self._graphs[key] = executable
        self.recorded += 1
        return True

    def launch(self, key: Hashable) -> bool:
        """Queue `key`'s graph on the legacy default stream; False when there is none (or the driver refused:
        `failure` says why, and the caller queues the work itself)."""
        if self._retired:
            self._retired.destroy()
        executable = self._graphs.get(key)
        if executable is None or self.failure is not None:
            return False
        rc = self._launch(executable, None)
        if rc != 0:
            return self._refuse("cuGraphLaunch", rc)
        self.launches += 1
        return True

    def retire(self, key: Hashable) -> None:
        """`key`'s graph recorded addresses that are going away: never launched again, destroyed at the next
        capture, launch or close (a new batch at the same address starts again with a call of the caller's own).
        Each step is one dict or list operation, atomic under the GIL, as a finaliser on another thread needs."""
        self._seen.discard(key)
        executable = self._graphs.pop(key, None)
        if executable is not None:
            self._retired.add(executable)

    def close(self) -> None:
        """Destroy every graph and the recording stream (the runtime's close)."""
        self._retired.destroy()
        graphs, self._graphs, self._seen = self._graphs, {}, set()
        for executable in graphs.values():
            self._exec_destroy(executable)
        if self._stream is not None:
            self._stream_destroy(self._stream)
            self._stream = None

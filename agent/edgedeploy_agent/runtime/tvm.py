"""The TVM runtime, without the compiler: tvm_ffi + libtvm_runtime.so load the bundle's library.

The `tvm` Python package (and its 260 MB libtvm_compiler.so) is never imported. The runtime library
comes from the agent config (`tvm_runtime_lib`), or from the installed apache-tvm wheel's `tvm/lib`
folder, found without importing the package.

GPU bundles need a CUDA backend beside it, one of two (config `cuda_backend`):
- `edgedeploy`: libedgedeploy_cuda.so (runtime/cuda_backend.cc, put there by `edgedeploy agent install`):
  the CUDA 11.4 driver API only, so it runs on JetPack 5 and on long-term driver branches;
- `tvm`: the apache-tvm wheel's libtvm_runtime_cuda.so, which needs libcudart.so.13 and a CUDA 13 driver.
`auto` (the default) takes edgedeploy's where it is installed, else the wheel's.
"""

import ctypes
import dataclasses
import importlib.util
import os
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

from ..aligned import aligned
from ..bundle import Manifest, check_compatible
from ..errors import RuntimeLoadError
from ..gpu import probe_cuda, version_tuple
from ..preprocess import crop_box, resize_taps
from .cuda_copy import (
    AheadCopy,
    Memcpy3D,
    ModelClock,
    QueueMark,
    box_params,
    device_pointer,
    load_ahead_copy,
    load_box_copy,
    load_queue_mark,
)
from .dlpack_view import DeviceView
from .frame_graph import FrameGraphs

_DEVICE_TYPE = {"cpu": 1, "cuda": 2, "cuda_host": 3}  # DLPack device types (cuda_host: page-locked memory)
_POOLED_ALLOCATOR = 2
_loaded: set[str] = set()
_RUNTIME_HINT = "likely causes: wrong CPU architecture, glibc older than 2.28, missing libstdc++"
EDGEDEPLOY_CUDA = "libedgedeploy_cuda.so"
TVM_CUDA = "libtvm_runtime_cuda.so"
TVM_CUDA_DRIVER = "13.0"  # the wheel's backend links libcudart.so.13
CUDA_DRIVER_FLOOR = {"edgedeploy": "11.4", "tvm": TVM_CUDA_DRIVER}  # the driver API each backend needs
CUDA_BACKENDS = ("auto", "edgedeploy", "tvm")
_CUDA_HINT = {
    "edgedeploy": "reinstall the agent (edgedeploy agent install DEVICE puts libedgedeploy_cuda.so beside "
    "libtvm_runtime.so); likely causes: a library for another architecture, libstdc++ older than GCC 9's",
    "tvm": "the wheel's CUDA backend needs libcudart.so.13 beside it (RUNPATH $ORIGIN) and a CUDA 13 driver "
    "(R580+); edgedeploy's own backend (cuda_backend = 'edgedeploy') needs neither",
}


def find_runtime_lib(configured: Optional[str] = None) -> Path:
    """Locate libtvm_runtime.so: the configured path, else the apache-tvm wheel's copy."""
    if configured:
        p = Path(configured)
        if not p.is_file():
            raise RuntimeLoadError(f"configured TVM runtime {p} does not exist")
        return p
    spec = importlib.util.find_spec("tvm")  # locates the package; does not import it
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            p = Path(loc) / "lib" / "libtvm_runtime.so"
            if p.is_file():
                return p
    raise RuntimeLoadError(
        "libtvm_runtime.so not found",
        hint="set tvm_runtime_lib in the agent config, or install the TVM runtime kit on the device",
    )


def unpin_thread_pool() -> str:
    """Leave TVM's CPU thread pool to the scheduler unless the device's environment says otherwise; returns the
    TVM_BIND_THREADS in force. TVM pins each worker to one core unless it is set to something else than 1, and a
    pinned worker whose core another process wants (the agent's own decoder, a second model, anything else on the
    device) gets a time slice there while every parallel kernel waits for it: ResNet-18 INT8, two threads, one
    core kept busy by another process, 92 ms pinned against 10.6 unpinned, 5.5-6.7 with both cores free
    (bench/cpu_contention.py; docs/int8.md, "TVM's thread pool and a busy core"). TVM reads it when its pool
    starts, at the first parallel kernel."""
    return os.environ.setdefault("TVM_BIND_THREADS", "0")


def _load(lib: Path, hint: str) -> None:
    if str(lib) in _loaded:
        return
    try:
        ctypes.CDLL(str(lib), ctypes.RTLD_GLOBAL)
    except OSError as e:
        raise RuntimeLoadError(f"cannot load {lib}: {e}", hint=hint) from None
    _loaded.add(str(lib))


def cuda_backend_lib(runtime_lib: Path, choice: str = "auto", configured: Optional[str] = None) -> tuple[str, Path]:
    """(name, path) of the CUDA backend `choice` names: edgedeploy's at `configured` or beside `runtime_lib`,
    the wheel's beside `runtime_lib`."""
    if choice not in CUDA_BACKENDS:
        raise RuntimeLoadError(f"unknown cuda_backend {choice!r}", hint=f"one of: {', '.join(CUDA_BACKENDS)}")
    ours = Path(configured) if configured else runtime_lib.with_name(EDGEDEPLOY_CUDA)
    if choice == "edgedeploy" or (choice == "auto" and ours.is_file()):
        if not ours.is_file():
            raise RuntimeLoadError(f"edgedeploy's CUDA backend {ours} is not installed", hint=_CUDA_HINT["edgedeploy"])
        return "edgedeploy", ours
    return "tvm", runtime_lib.with_name(TVM_CUDA)


def load_runtime_libraries(
    runtime_lib: Optional[str] = None,
    cuda: bool = False,
    cuda_backend: str = "auto",
    cuda_backend_path: Optional[str] = None,
) -> Path:
    """Load tvm_ffi and libtvm_runtime.so (and a CUDA backend) into this process; returns the runtime's path.
    One CUDA backend per process: both register the same functions."""
    try:
        import tvm_ffi  # noqa: F401  (loads libtvm_ffi.so, which libtvm_runtime.so links against)
    except ImportError as e:
        raise RuntimeLoadError(
            f"apache-tvm-ffi is not installed: {e}", hint="reinstall the agent: edgedeploy agent install DEVICE"
        ) from None
    lib = find_runtime_lib(runtime_lib)
    unpin_thread_pool()
    _load(lib, _RUNTIME_HINT)
    if cuda:
        # The runtime-only mode autoloads no CUDA backend (shared/reference/tvm.md §5): load it by hand.
        name, backend = cuda_backend_lib(lib, cuda_backend, cuda_backend_path)
        other = {EDGEDEPLOY_CUDA: TVM_CUDA, TVM_CUDA: EDGEDEPLOY_CUDA}[backend.name]
        if any(Path(p).name == other for p in _loaded):
            raise RuntimeLoadError(f"this process already runs the other CUDA backend ({other})")
        _load(backend, _CUDA_HINT[name])
    return lib


def loaded_cuda_backend() -> Optional[str]:
    """ "edgedeploy" or "tvm": the CUDA backend this process loaded, if any."""
    names = {Path(p).name for p in _loaded}
    return "edgedeploy" if EDGEDEPLOY_CUDA in names else "tvm" if TVM_CUDA in names else None


class TvmRuntime:
    """Runs a Relax VM executable exported by `tvm.compile(...).export_library`."""

    name = "tvm"

    def __init__(
        self,
        release_dir: Path,
        manifest: Manifest,
        runtime_lib: Optional[str] = None,
        cuda_backend: str = "auto",
        cuda_backend_lib: Optional[str] = None,
        frames_in_place: Optional[bool] = None,
        frame_graphs: bool = True,
    ) -> None:
        """`frames_in_place`: the preprocessing kernel reads a lent frame batch where it is, through the GPU's
        address for that page-locked memory, instead of a copy of its crop box; by default where the GPU shares
        the host's memory (a Jetson: there it is the same memory, so the copy is pure waste). `frame_graphs`: a
        lent frame batch's copy and preprocessing, and the model with its top k, each replayed as one CUDA graph
        (runtime/frame_graph.py) where the GPU path allows it; False queues them call by call (benches, A/Bs)."""
        target = manifest.target
        gpu, reason = probe_cuda() if target.device == "cuda" else (None, "")
        check_compatible(manifest, gpu=gpu, gpu_reason=reason)
        self._lib_path = load_runtime_libraries(runtime_lib, target.device == "cuda", cuda_backend, cuda_backend_lib)
        self._cuda_backend = loaded_cuda_backend() if target.device == "cuda" else None
        if gpu is not None and self._cuda_backend == "tvm":
            _check_wheel_driver(gpu.driver_api)
        import tvm_ffi

        self._ffi = tvm_ffi
        self._alloc = tvm_ffi.get_global_func("runtime.TVMTensorAllocWithScope")
        self._copy = tvm_ffi.get_global_func("runtime.TVMTensorCopyFromTo")
        self._device = tvm_ffi.device(target.device, 0)
        self._stream_sync: Any = (
            tvm_ffi.get_global_func("runtime.Device_StreamSync") if target.device == "cuda" else None
        )
        self._pinned = tvm_ffi.device(_DEVICE_TYPE["cuda_host"], 0)
        self._manifest_device = target.device
        self._host_outputs: dict[tuple[Any, ...], tuple[Any, np.ndarray]] = {}  # (shape, dtype) -> page-locked
        library = release_dir / manifest.artifact("tvm-library").path
        try:
            module = tvm_ffi.load_module(str(library.resolve()))
            self._vm = module["vm_load_executable"]()
            if target.device == "cuda":  # the device, then the host, each with a pooled allocator
                self._vm["vm_initialization"](_DEVICE_TYPE["cuda"], 0, _POOLED_ALLOCATOR, 1, 0, _POOLED_ALLOCATOR)
            else:
                self._vm["vm_initialization"](1, 0, _POOLED_ALLOCATOR)
            self._main = self._vm["main"]
        except Exception as e:  # the FFI raises its own error types
            raise RuntimeLoadError(
                f"TVM could not load {library.name}: {e}",
                hint="likely causes: runtime ABI mismatch (rebuild the bundle with the device's TVM version), "
                "a library for another architecture, or a truncated file",
            ) from None
        self._manifest = manifest
        self._gpu = gpu
        # GPU: each input lives in one device tensor and one page-locked host tensor, allocated here for the
        # release: run() copies into the host one (a memcpy) and from there to the device (one DMA copy). CPU:
        # run() hands the caller's arrays over as they are; with a preprocessing module (GPU bundles carry one; a
        # CPU bundle may, as the tests build it) load_frames fills one tensor per input, allocated here.
        self._preprocess, self._postprocess = self._load_frame_kernels(release_dir, manifest)
        gpu_or_frames = target.device == "cuda" or self._preprocess is not None
        self._inputs: list[_Staged] = [self._staged(s.shape, s.dtype) for s in manifest.inputs] if gpu_or_frames else []
        # preprocess.py writes here when it runs on the CPU for a GPU bundle: run() then has no host copy to make
        self.input_array: Optional[np.ndarray] = self._inputs[0].array if target.device == "cuda" else None
        self._lent: dict[int, _Lent] = {}  # data address -> a frame batch lent (frame_batch) and not yet dropped
        # a lent batch's crop box goes to the GPU alone (cuda_copy.py); without the driver's copy, through staging
        self._box_copy, self._no_box_copy = load_box_copy() if target.device == "cuda" else (None, None)
        # a batch lent `ahead` has its box sent by the capture's thread as soon as it is decoded (send_frames)
        self._ahead = load_ahead_copy(self._box_copy) if self._preprocess is not None else None
        self.frames_sent = self.frames_ahead = 0  # of the loads of batches lent `ahead`: sent, and all
        # the model's own GPU time in a frame whose input was loaded before it (cuda_copy.ModelClock), every
        # MODEL_CLOCK_EVERY-th
        self._clock = _model_clock() if target.device == "cuda" else None
        self.model_gpu_ms: Optional[float] = None  # the last run_loaded(_top), when its load was sampled
        # where the GPU's copy and preprocessing end, for a caller's `preprocessed` (run_loaded, run_loaded_top)
        self._queue_mark = load_queue_mark() if target.device == "cuda" else None
        self._in_place = bool(gpu and gpu.integrated) if frames_in_place is None else frames_in_place
        self._device_frames: dict[tuple[int, ...], Any] = {}  # frame batch shape -> the device buffer they go to
        self._staging: dict[tuple[int, ...], _Staged] = {}  # crop shape -> where other arrays' crop is copied
        self._taps: dict[tuple[int, int, int, int], tuple[Any, Any]] = {}  # crop box -> the device tap tables
        # the postprocess function's (N, 2, k) result: scores, then classes (float64), written by the kernel into
        # page-locked host memory through the GPU's address for it where the driver gives one, else copied back
        self._top = self._staged(top_shape(manifest), "float64") if self._postprocess is not None else None
        self._top_view: Optional[DeviceView] = None
        if self._top is not None and target.device == "cuda":
            address = device_pointer(self._top.host.data_ptr())
            if address is not None:
                self._top_view = DeviceView(self._top.array, address, _DEVICE_TYPE["cuda"], 0)
                self._top = _Staged(self._top.host, self._top.array, tvm_ffi.from_dlpack(self._top_view))
        # a lent batch's copy and preprocessing (keyed by the batch), and the model (MODEL: alone, for run_loaded;
        # TOP: with the postprocess function writing the top k into mapped host memory, for run_loaded_top: only
        # where it does), each as one CUDA graph; a refusal: call by call, as before (each kind on its own: one
        # refused leaves the others)
        graphs = frame_graphs and target.device == "cuda"
        self._frame_graphs = _frame_graphs() if graphs and self._preprocess is not None else None
        kinds = (MODEL, TOP) if self._top_view is not None else (MODEL,)
        self._model_graphs = {kind: _frame_graphs() for kind in kinds} if graphs else {}
        # a lent batch's whole frame (copy, preprocessing, mark, model and top k) as one graph: run_frames_top
        whole = graphs and self._preprocess is not None and self._top_view is not None
        self._whole_graphs = _frame_graphs() if whole else None
        # each model graph's outputs, kept from the VM's pool: by kind (MODEL, TOP), and by lent batch (whole frames)
        self._graph_outputs: dict[Union[str, int], Any] = {}
        if target.device == "cuda":
            # tvm_ffi releases the GIL around every call by default; these return once the work is queued (the
            # stream sync: once a frame's kernels are done, tens of microseconds): released, the loop's thread
            # had to win the GIL back from the capture threads after each one, in the middle of a stage
            for func in (self._main, self._copy, self._alloc, self._stream_sync, self._preprocess, self._postprocess):
                if func is not None:
                    func.release_gil = False

    def _staged(self, shape: "list[int] | tuple[int, ...]", dtype: str) -> "_Staged":
        """Host and device buffers for one tensor (on a CPU one tensor is both)."""
        host = self._alloc(tuple(shape), dtype, self._pinned if self._manifest_device == "cuda" else self._device, None)
        device = self._alloc(tuple(shape), dtype, self._device, None) if self._manifest_device == "cuda" else host
        return _Staged(host, np.from_dlpack(host), device)

    def _load_frame_kernels(self, release_dir: Path, manifest: Manifest) -> tuple[Any, Any]:
        """The bundle's preprocessing kernel (artifact tvm-preprocess), or None: frames then go through the
        CPU path (preprocess.py) and run(); and its postprocess function where the library has one (classifiers
        built since it exists), or None: top_k then runs on the host."""
        art = next((a for a in manifest.artifacts if a.role == "tvm-preprocess"), None)
        if art is None:
            return None, None
        try:
            module = self._ffi.load_module(str((release_dir / art.path).resolve()))
            post = module["postprocess"] if module.implements_function("postprocess") else None
            return module["preprocess"], post
        except Exception as e:  # the FFI raises its own error types
            raise RuntimeLoadError(f"TVM could not load {art.path}: {e}") from None

    @property
    def frames_on_device(self) -> bool:
        """Frames go to the GPU as uint8 and are preprocessed there (load_frames, then run_loaded)."""
        return self._preprocess is not None

    @property
    def top_k_on_device(self) -> bool:
        """The classifier's top k is computed on the device (run_loaded_top)."""
        return self._postprocess is not None

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        if self._manifest_device == "cpu":
            return self._outputs(self._main(*[self._ffi.from_dlpack(aligned(np.ascontiguousarray(x))) for x in inputs]))
        self.load_inputs(inputs)
        return self.run_loaded()

    @property
    def loads_inputs(self) -> bool:
        """Host inputs go to the device apart from the model (load_inputs, then run_loaded or run_loaded_top)."""
        return self._manifest_device == "cuda"

    def load_inputs(self, inputs: list[np.ndarray]) -> None:
        """The model's inputs (preprocessed on the host) to the GPU: into its page-locked buffers (no copy where
        preprocess.py wrote into input_array), then one copy each to the device, queued, not waited for. The
        agent's CPU path ends its preprocess stage with this, as load_frames ends the GPU path's: the model queued
        next (run_loaded, run_loaded_top) runs after the copy on the same stream."""
        if self._manifest_device != "cuda":
            raise RuntimeError("a CPU runtime reads its inputs where they are: run() takes them")
        if len(inputs) != len(self._inputs):
            raise ValueError(f"{len(inputs)} inputs given, the model takes {len(self._inputs)}")
        for x, staged in zip(inputs, self._inputs):
            if x.shape != staged.array.shape:
                raise ValueError(f"input of shape {list(x.shape)}, the model takes {list(staged.array.shape)}")
            if x.ctypes.data != staged.array.ctypes.data:  # not preprocessed into input_array
                np.copyto(staged.array, x, casting="same_kind")
            self._copy(staged.host, staged.device)  # asynchronous, in order on the stream the model runs on
        if self._clock is not None:
            self._clock.start()

    def frame_batch(self, height: int, width: int, ahead: bool = False) -> np.ndarray:
        """A new page-locked uint8 batch (N, height, width, 3), N the model's batch: a caller that fills it (a
        decoder, a batcher) and hands it to load_frames saves the host copy, and on a GPU only its crop box is
        copied to the device (or, in place, not at all: __init__'s frames_in_place). Each call lends another; all
        of one resolution share one device buffer (the copies and the kernels reading it are in order on one
        stream), except those lent `ahead`: each has its own, and the caller may send the box as soon as the batch
        is filled (send_frames: a capture thread), before it hands it to load_frames. A batch the caller drops is
        given back: its memory, and its resolution's device buffer with the last of them, are freed (a camera that
        changes resolution does not keep the old one's buffers)."""
        shape = (self._manifest.inputs[0].shape[0], height, width, 3)
        if self._manifest_device == "cuda":
            host = self._alloc(shape, "uint8", self._pinned, None)
        else:
            host = device = self._alloc(shape, "uint8", self._device, None)
            region, params = shape, None
        array = np.from_dlpack(host)  # keeps `host` alive as long as the caller holds it (or a view of it)
        address = device_pointer(host.data_ptr()) if self._manifest_device == "cuda" and self._in_place else None
        self._in_place = address is not None  # (the driver gave no address: the box copy from now on)
        if address is not None:  # the kernel reads the batch where it is, as on a CPU (upload_frames)
            view = DeviceView(array, address, _DEVICE_TYPE["cuda"], 0, owner=host)
            device, region, params = self._ffi.from_dlpack(view), shape, None
        elif self._manifest_device == "cuda":
            box = crop_box(height, width, self._manifest.preprocess)
            region = (shape[0], box[2], box[3], 3)
            ahead = ahead and self._ahead is not None
            device = None if ahead else self._device_frames.get(region)
            if device is None:
                device = self._alloc(region, "uint8", self._device, None)
                if not ahead:
                    self._device_frames[region] = device
            params = box_params(host.data_ptr(), device.data_ptr(), shape, box)
        ahead = ahead and params is not None
        self._lent[array.ctypes.data] = _Lent(shape, host, device, region, params, ahead)
        batch_graphs = (self._frame_graphs, self._whole_graphs)
        weakref.finalize(
            array, _given_back, self._lent, self._device_frames, batch_graphs, self._ahead, array.ctypes.data
        )
        return array

    def send_frames(self, frames: np.ndarray) -> bool:
        """For the thread that filled a batch lent `ahead` (a capture's, as soon as the decoder has written a frame):
        queue its crop box's copy to the GPU now, on a stream of its own (cuda_copy.AheadCopy), so it runs while
        the loop is still being handed the frame; load_frames then has the GPU wait for it and queues only the
        preprocessing. False where nothing was sent (not such a batch, a CPU, frames read in place, the driver
        refused): load_frames copies the box itself. Call it again after every refill."""
        lent = self._lent_ahead(frames)
        if lent is None or self._ahead is None:
            return False
        assert lent.params is not None  # (lent ahead: a box copy)
        return self._ahead.send(frames.ctypes.data, lent.params)

    def load_frames(self, frames: np.ndarray) -> None:
        """uint8 BGR frames (N, H, W, 3), N the model's batch (or one frame (H, W, 3) for a batch of one), to the
        GPU and through the bundle's preprocessing kernel into the model's input: queued, not waited for (the
        model queued next runs after them on the same stream; run_loaded and run_loaded_top wait for the whole).
        So the host queues the model while the GPU copies and preprocesses: a wait here cost the MobileNet 720p
        frame the GPU's copy and preprocessing plus the model's launch, one after the other (H100: 0.025 ms of
        wait, then 0.028 ms to queue the model). The frames' memory must stay as it is until then: the agent's
        loop and batcher refill a frame buffer only after the call that read it. One copy to the device; tap
        tables are made and copied once per resolution. A lent batch's copy and kernel are one CUDA graph from its
        second call on (frame_graphs)."""
        if not (self._load_sent(frames) or self._replay_frames(frames)):
            self._queue_frames(frames)
        if self._clock is not None:
            self._clock.start()

    def _queue_frames(self, frames: np.ndarray, stream: int = 0) -> None:
        """The frames' copy and the preprocessing kernel, queued on `stream` (0: the legacy default stream)."""
        staged, box = self.upload_frames(frames, stream)
        xtaps, ytaps = self._tap_tables(box)
        self._preprocess(staged.device, xtaps, ytaps, self._inputs[0].device)

    def _load_sent(self, frames: np.ndarray) -> bool:
        """A batch lent `ahead`: the GPU waits for the copy its filler sent (send_frames), or the box is copied here
        where none was; then the preprocessing alone, as a frame graph from the batch's second call on. False
        where the caller queues the frames the usual way (not such a batch; the box copy refused)."""
        lent = self._lent_ahead(frames)
        if lent is None or not self._take_sent(lent, frames.ctypes.data):
            return False
        self._preprocess_sent(lent, frames.ctypes.data)
        return True

    def _take_sent(self, lent: "_Lent", address: int) -> bool:
        """A batch lent `ahead` about to be preprocessed: the GPU made to wait for the box its filler sent
        (AheadCopy.take), or the box copied here where none was. False where the caller stages the frames instead
        (no driver copy, or it was refused)."""
        if self._ahead is None or self._box_copy is None:
            return False
        assert lent.params is not None  # (lent ahead: a box copy)
        sent = self._ahead.take(address)
        if not sent and not self._box_copy(lent.params):
            return False
        self.frames_ahead += 1
        self.frames_sent += sent
        return True

    def _sent_taps(self, lent: "_Lent") -> tuple[Any, Any]:
        """The tap tables of a batch lent `ahead`: its device buffer holds the crop box alone."""
        _, height, width, _ = lent.device_shape
        return self._tap_tables((0, 0, height, width))

    def _preprocess_sent(self, lent: "_Lent", address: int) -> None:
        """A batch lent `ahead`, its box taken (_take_sent): the preprocessing, as a frame graph from the batch's
        second call on."""
        xtaps, ytaps = self._sent_taps(lent)

        def record(stream: int) -> None:
            with self._ffi.use_raw_stream(self._device, stream):
                self._preprocess(lent.device, xtaps, ytaps, self._inputs[0].device)

        if self._frame_graphs is None or not self._frame_graphs.run(address, record):
            self._preprocess(lent.device, xtaps, ytaps, self._inputs[0].device)

    def run_frames_top(
        self, frames: np.ndarray, outputs: bool = False, preprocessed: Optional[Callable[[], None]] = None
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """load_frames, then run_loaded_top (the same arguments and result), as one CUDA graph where it can be: a
        batch this runtime lent, from its second call on (the first goes the usual way: kernels load, the VM's pool
        fills, the tap tables are made), is one graph of its box copy (none for a batch sent ahead: the GPU waits
        for the capture thread's copy first), its preprocessing, the mark (an event node: `preprocessed` still
        learns when the GPU's preprocessing ended), the model and the top k, written into mapped host memory. One
        launch a frame, where the usual way launches two with the host's calls between them while the GPU waits
        for the second. The health check's frames (`outputs`), the model clock's sampled frames, frames the runtime
        did not lend, and every frame once the driver refused such a graph go the usual way."""
        lent = self._whole_ready(frames, outputs)
        if lent is not None and self._run_whole(frames, lent, preprocessed):
            assert self._top is not None
            return self._top.array, []
        if lent is not None and lent.ahead:  # the recording refused (no more are tried); the box is already taken
            self._preprocess_sent(lent, frames.ctypes.data)
            if self._clock is not None:
                self._clock.start()
        else:
            self.load_frames(frames)
        return self.run_loaded_top(outputs=outputs, preprocessed=preprocessed)

    def _whole_ready(self, frames: np.ndarray, outputs: bool) -> Optional["_Lent"]:
        """The lent batch `frames` is, where its whole frame goes as one graph at this call (recorded or replayed;
        a batch sent ahead has its box taken here), else None: the usual way."""
        graphs, address = self._whole_graphs, frames.ctypes.data
        lent = self._lent.get(address) if graphs is not None and not outputs else None
        if graphs is None or lent is None or lent.shape != _batch_shape(frames):
            return None
        if self._clock is not None and self._clock.due():  # its events go between the steps
            return None
        if lent.params is not None and (self._box_copy is None or self._box_copy.failure is not None):
            return None  # staged through the host: a copy per call, nothing a graph could hold
        if not graphs.ready(address) or lent.ahead and not self._take_sent(lent, address):
            return None
        return lent

    def _run_whole(self, frames: np.ndarray, lent: "_Lent", preprocessed: Optional[Callable[[], None]]) -> bool:
        """The whole frame's graph for `lent` (recorded first where it has none), launched and waited for; False
        where the driver refused the recording (nothing of it ran)."""
        assert self._whole_graphs is not None and self._top is not None
        address, top = frames.ctypes.data, self._top
        mark = self._queue_mark if self._queue_mark is not None and not self._queue_mark.failure else None

        def record(stream: int) -> None:
            with self._ffi.use_raw_stream(self._device, stream):
                if lent.ahead:
                    self._preprocess(lent.device, *self._sent_taps(lent), self._inputs[0].device)
                else:
                    self._queue_frames(frames, stream)
                if mark is not None:
                    mark.mark_in(stream)
                out = self._main(*[s.device for s in self._inputs])
                self._postprocess(self._output_list(out)[0], top.device)
            for key in [k for k in self._graph_outputs if isinstance(k, int) and k not in self._lent]:
                del self._graph_outputs[key]  # batches given back: their graphs are retired
            self._graph_outputs[address] = out  # (kept from the VM's pool while the graph may run)

        if not self._whole_graphs.run(address, record):
            return False
        if self._clock is not None:
            self._clock.start()  # (not due: it counts the frame, and records nothing)
        if preprocessed is not None:
            if mark is not None:
                mark.wait()
            preprocessed()  # (without the mark: as queued, the only end the host can tell)
        self.synchronize()
        self.model_gpu_ms = None
        return True

    def _lent_ahead(self, frames: np.ndarray) -> Optional["_Lent"]:
        """The batch lent `ahead` these frames are (a box copy of its own), or None."""
        lent = self._lent.get(frames.ctypes.data)
        return lent if lent is not None and lent.ahead and lent.shape == _batch_shape(frames) else None

    def _replay_frames(self, frames: np.ndarray) -> bool:
        """A lent batch's copy and preprocessing as its CUDA graph; False where the caller queues them itself (not
        a lent batch, its first call, no graphs)."""
        graphs, lent = self._frame_graphs, self._lent.get(frames.ctypes.data)
        if graphs is None or lent is None or lent.shape != _batch_shape(frames):
            return False
        if lent.params is not None and (self._box_copy is None or self._box_copy.failure is not None):
            return False  # staged through the host: a copy per call, nothing a graph could hold

        def record(stream: int) -> None:
            with self._ffi.use_raw_stream(self._device, stream):
                self._queue_frames(frames, stream)

        return graphs.run(frames.ctypes.data, record)

    def upload_frames(self, frames: np.ndarray, stream: int = 0) -> tuple["_Staged", tuple[int, int, int, int]]:
        """The frames' part that preprocessing reads, copied to the device (asynchronously); returns its buffers
        and the crop box in them. A batch from frame_batch (or one frame of a batch-1 one) has its crop box copied
        from where it is, by the driver (no host copy; on a CPU nothing is copied); any other array has its crop
        box copied into a page-locked buffer first, which then goes whole (a 720p frame centre-cropped to 87.5 %:
        43 % of its bytes). `stream`: where a lent batch's copy is queued (a frame graph's recording)."""
        if frames.ndim == 3:
            frames = frames[None]
        batch = self._manifest.inputs[0].shape[0]
        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[0] != batch or frames.shape[3] != 3:
            raise ValueError(f"frames {frames.dtype} {list(frames.shape)}: the model takes uint8 ({batch}, H, W, 3)")
        top, left, height, width = box = crop_box(frames.shape[1], frames.shape[2], self._manifest.preprocess)
        lent = self._lent.get(frames.ctypes.data)
        if lent is not None and lent.shape == frames.shape:
            if lent.params is None:  # read where it is: a CPU's preprocessing, or a GPU's in place (frame_batch)
                return _Staged(lent.host, frames, lent.device), box
            if self._box_copy is not None and self._box_copy(lent.params, stream=stream):  # else: staged below
                return _Staged(lent.host, frames, lent.device), (0, 0, height, width)
            if stream:  # recording a graph: the staging's copy and wait cannot be part of it
                raise RuntimeError(f"the box copy was refused: {self._box_copy and self._box_copy.failure}")
        region = frames[:, top : top + height, left : left + width]
        if region.shape not in self._staging:
            self._staging[region.shape] = self._staged(region.shape, "uint8")
        staged = self._staging[region.shape]
        if staged.device is not staged.host:
            self.synchronize()  # the previous load_frames' copy out of this buffer may still be queued
        np.copyto(staged.array, region)
        if staged.device is not staged.host:
            self._copy(staged.host, staged.device)
        return staged, (0, 0, height, width)

    def synchronize(self) -> None:
        """Wait for what this runtime queued on the device."""
        if self._stream_sync is not None:
            self._stream_sync(self._device, 0)

    def loaded_input(self) -> np.ndarray:
        """A host copy of the model's first device input, as load_frames or run left it (checks, benches)."""
        staged = self._inputs[0]
        if staged.device is not staged.host:
            self._copy(staged.device, staged.host)
            self.synchronize()
        out: np.ndarray = staged.array.copy()
        return out

    def _tap_tables(self, box: tuple[int, int, int, int]) -> tuple[Any, Any]:
        taps = self._taps.get(box)
        if taps is None:
            pp, spec = self._manifest.preprocess, self._manifest.inputs[0]
            xtaps, ytaps = resize_taps(box, pp.interpolation, spec)
            taps = self._taps[box] = (self._to_device(xtaps), self._to_device(ytaps))
        return taps

    def _to_device(self, x: np.ndarray) -> Any:
        """A new device tensor holding `x` (once-per-resolution tables, not per-call data)."""
        dev = self._alloc(x.shape, str(x.dtype), self._device, None)
        self._copy(self._ffi.from_dlpack(aligned(np.ascontiguousarray(x))), dev)
        self.synchronize()  # `x` may go once this returns
        return dev

    def _mark_preprocessed(self, preprocessed: Optional[Callable[[], None]]) -> Optional[QueueMark]:
        """Before the model is queued: mark the end of what is queued (load_frames' preprocessing) for
        `preprocessed`, or, where nothing is left running (a CPU) or nothing can mark it, call it now."""
        if preprocessed is None:
            return None
        mark = self._queue_mark
        if mark is not None and mark.mark():
            return mark
        preprocessed()
        return None

    @staticmethod
    def _preprocessed(mark: Optional[QueueMark], preprocessed: Optional[Callable[[], None]]) -> None:
        """After the model is queued: wait for the mark, then tell the caller."""
        if mark is not None and preprocessed is not None:
            mark.wait()
            preprocessed()

    def run_loaded(self, preprocessed: Optional[Callable[[], None]] = None) -> list[np.ndarray]:
        """The model on the device input tensors as they stand (filled by run or load_frames). `preprocessed`:
        called once the GPU has finished what was queued before the model (load_frames' preprocessing), the model
        already queued behind it: where the agent's preprocess stage ends (on a CPU, and without the driver's
        events, at once)."""
        graphs = self._model_graphs.get(MODEL)
        sampled = self._clock is not None and self._clock.started  # the clock's second event goes after the model
        mark = self._mark_preprocessed(preprocessed)
        if graphs is not None and not sampled and graphs.run(MODEL, self._record_model):
            out = self._graph_outputs[MODEL]
        else:
            out = self._main(*[s.device for s in self._inputs])
            if self._clock is not None:
                self._clock.stop()
        self._preprocessed(mark, preprocessed)
        outs = self._outputs(out)
        self.model_gpu_ms = self._clock.read() if self._clock is not None else None
        return outs

    def run_loaded_top(
        self, outputs: bool = False, preprocessed: Optional[Callable[[], None]] = None
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """The model on the device input tensors as they stand, then the bundle's postprocess function on its first
        output: (N, 2, k) float64, per row the k best scores, then their classes, best first (top_shape), in host
        memory the next call reuses (read it before); with `outputs`, the model's outputs in host memory too (the
        health check reads them). `preprocessed`: as for run_loaded."""
        assert self._top is not None, "the bundle has no postprocess function"
        graphs = self._model_graphs.get(TOP)
        sampled = self._clock is not None and self._clock.started  # the clock's second event goes between the two
        mark = self._mark_preprocessed(preprocessed)
        if graphs is not None and not outputs and not sampled and graphs.run(TOP, self._record_top):
            self._preprocessed(mark, preprocessed)
            self.synchronize()
            self.model_gpu_ms = None
            return self._top.array, []
        out = self._main(*[s.device for s in self._inputs])
        if self._clock is not None:
            self._clock.stop()
        self._postprocess(self._output_list(out)[0], self._top.device)
        if self._top.device is not self._top.host and self._top_view is None:
            self._copy(self._top.device, self._top.host)
        self._preprocessed(mark, preprocessed)
        full = self._outputs(out) if outputs else []  # (waits for them)
        self.synchronize()  # (on a CPU, a no-op: the function has run)
        self.model_gpu_ms = self._clock.read() if self._clock is not None else None
        return self._top.array, full

    def _record_model(self, stream: int) -> None:
        """The model, queued on `stream` for its graph (MODEL)."""
        with self._ffi.use_raw_stream(self._device, stream):
            self._graph_outputs[MODEL] = self._main(*[s.device for s in self._inputs])

    def _record_top(self, stream: int) -> None:
        """The model and the postprocess function, queued on `stream` for their graph (TOP)."""
        assert self._top is not None
        with self._ffi.use_raw_stream(self._device, stream):
            out = self._main(*[s.device for s in self._inputs])
            self._postprocess(self._output_list(out)[0], self._top.device)
        self._graph_outputs[TOP] = out

    def run_kernel(self) -> None:
        """The model alone on the device input tensors, waited for: no copy either way (the bench's peer)."""
        self._main(*[s.device for s in self._inputs])
        self.synchronize()

    @staticmethod
    def _output_list(out: Any) -> list[Any]:
        return list(out) if isinstance(out, (list, tuple)) or type(out).__name__ == "Array" else [out]

    def _outputs(self, out: Any) -> list[np.ndarray]:
        return [self._to_host(o).copy() for o in self._output_list(out)]

    def _to_host(self, t: Any) -> np.ndarray:
        """`t` in host memory, the inference finished. On a GPU: a page-locked tensor per output shape,
        reused by the next call (callers copy it out). A new pageable tensor per call, as before, cost a
        batch-64 ResNet-18 call 0.045 ms more on the H200 (0.908 against 0.864 ms, outputs equal;
        docs/benchmarks.md, "Build changes", run25 calls 6-7)."""
        if self._manifest_device == "cpu":
            return np.from_dlpack(t)
        key = (tuple(t.shape), str(t.dtype))
        host = self._host_outputs.get(key)
        if host is None:
            tensor = self._alloc(t.shape, t.dtype, self._pinned, None)
            host = self._host_outputs[key] = (tensor, np.from_dlpack(tensor))
        self._copy(t, host[0])
        self._stream_sync(self._device, 0)  # the default stream: a copy into page-locked memory returns early
        return host[1]

    def describe(self) -> dict[str, Any]:
        return {
            "runtime": "tvm",
            "runtime_lib": str(self._lib_path),
            "device": self._manifest.target.device,
            "cuda_backend": self._cuda_backend,
            "frames_on_device": self.frames_on_device,  # preprocessing by the bundle's kernel (load_frames)
            "top_k_on_device": self.top_k_on_device,  # postprocessing by its postprocess function
            # how a lent frame batch's crop box reaches the GPU: the driver's copy, or why it is staged instead
            "frame_box_copy": self._frame_box_copy(),
            # batches lent `ahead` (a capture's): how many of their loads found the box sent by the capture's thread
            "frames_sent_ahead": self._sent_state(),
            # where the device's top k lands: written by the kernel into host memory, or copied back after it
            "top_k_output": None if self._top is None else "mapped host memory" if self._top_view else "copied back",
            # the reports' model_gpu_ms: CUDA events on every MODEL_CLOCK_EVERY-th frame, or why there are none
            "model_clock": self._events_state(self._clock, f"CUDA events, every {MODEL_CLOCK_EVERY} frames"),
            # the frame's work as CUDA graphs (runtime/frame_graph.py): how many, or why none
            "frame_graphs": self._graph_state(),
            # where the preprocess stage ends for a caller's `preprocessed`: the GPU's end of the input's copy (and
            # preprocessing), or why not
            "preprocessed_mark": self._events_state(
                self._queue_mark,
                "a CUDA event after the input's load",
                " (the stage ends when the load is queued)",
            ),
            "gpu": dataclasses.asdict(self._gpu) if self._gpu else None,
            "loaded_tvm_libraries": loaded_tvm_libraries(),
        }

    def _events_state(
        self, events: Optional[Union[ModelClock, QueueMark]], working: str, otherwise: str = ""
    ) -> Optional[str]:
        """What the model clock or the queue mark does: `working`, or why nothing (then `otherwise`)."""
        if self._manifest_device != "cuda":
            return None
        if events is None or events.failure:
            return f"none: {events.failure if events else 'no CUDA events from libcuda.so.1'}{otherwise}"
        return working

    def _graph_state(self) -> Optional[str]:
        if self._manifest_device != "cuda":
            return None
        if not self._model_graphs:
            return "off"

        def state(graphs: Optional[FrameGraphs], why_none: str) -> str:
            if graphs is None:
                return why_none
            if graphs.failure:
                return f"none: {graphs.failure}"
            return f"{graphs.recorded} recorded, {graphs.launches} launches"

        model = f"model: {state(self._model_graphs[MODEL], '')}"
        if self._top is not None:
            top = state(self._model_graphs[TOP], "") if TOP in self._model_graphs else "none: the top k is copied back"
            model += f"; model and top k: {top}"
        if not self.frames_on_device:
            return model
        why_none = "none: no device top k" if self._top is None else "none: the top k is copied back"
        whole = state(self._whole_graphs, why_none)
        return f"copy and preprocessing: {state(self._frame_graphs, '')}; {model}; whole frames: {whole}"

    def _sent_state(self) -> Optional[str]:
        if self._manifest_device != "cuda" or not self.frames_on_device:
            return None
        if self._ahead is None or self._ahead.failure:
            return f"none: {self._ahead.failure if self._ahead else 'no box copy and events from libcuda.so.1'}"
        return f"{self.frames_sent} of {self.frames_ahead} loads"

    def _frame_box_copy(self) -> Optional[str]:
        if self._manifest_device != "cuda":
            return None
        if self._in_place:
            return "none: read in place"
        return self._no_box_copy or (self._box_copy.failure if self._box_copy else None) or "cuMemcpy3DAsync"

    def close(self) -> None:
        """Destroy the CUDA events (the model clock's, the preprocessing's mark) and the frame graphs. The loaded
        libraries stay for the process (one CUDA backend per process); the buffers are TVM tensors, freed with this
        object."""
        for graphs in (self._frame_graphs, self._whole_graphs, *self._model_graphs.values()):
            if graphs is not None:
                graphs.close()  # (before the mark's event, which whole frames' graphs record)
        for events in (self._clock, self._queue_mark, self._ahead):
            if events is not None:
                events.close()


MODEL, TOP = "model", "model and top k"  # the model graphs' keys (run_loaded, run_loaded_top)
MODEL_CLOCK_EVERY = 32  # the clock's events cost a frame 4.6-8.2 us (H100): by arithmetic 0.15-0.26 us on average


def _frame_graphs() -> Optional[FrameGraphs]:
    try:
        return FrameGraphs()
    except (OSError, AttributeError):  # no libcuda.so.1, or one without the graph calls
        return None


def _model_clock() -> Optional[ModelClock]:
    try:
        return ModelClock(every=MODEL_CLOCK_EVERY)
    except (OSError, AttributeError):  # no libcuda.so.1, or one without the event calls
        return None


def top_shape(manifest: Manifest) -> tuple[int, int, int]:
    """(N, 2, k) of the postprocess function's result: k = the card's top_k, at most the classes."""
    out = manifest.outputs[0]
    return out.shape[0], 2, manifest.postprocess.top_count(out)


@dataclasses.dataclass(frozen=True)
class _Staged:
    """One tensor's buffers for a release: page-locked host memory (and a numpy view of it), device memory."""

    host: Any
    array: np.ndarray
    device: Any


@dataclasses.dataclass(frozen=True)
class _Lent:
    """A frame batch lent by frame_batch: its shape, page-locked host memory, the device buffer its crop box goes
    to (on a CPU the batch itself), that buffer's shape and the driver's copy of the box (None on a CPU)."""

    shape: tuple[int, ...]
    host: Any
    device: Any
    device_shape: tuple[int, ...]
    params: Optional[Memcpy3D]
    ahead: bool = False  # the device buffer is the batch's own, and its filler may send the box (send_frames)


def _given_back(
    lent: dict[int, _Lent],
    device_frames: dict[tuple[int, ...], Any],
    graphs: tuple[Optional[FrameGraphs], ...],
    ahead: Optional[AheadCopy],
    address: int,
) -> None:
    """The borrower dropped a frame batch: forget it, its frame graphs and its copy's event, and, with the last batch
    of its shape, that shape's shared device buffer (run by weakref.finalize, so it holds the dictionaries, not the
    runtime)."""
    for kind in graphs:
        if kind is not None:
            kind.retire(address)
    if ahead is not None:
        ahead.retire(address)
    gone = lent.pop(address, None)
    if gone is None or gone.ahead:
        return
    if all(x.device_shape != gone.device_shape or x.ahead for x in list(lent.values())):
        device_frames.pop(gone.device_shape, None)


def _batch_shape(frames: np.ndarray) -> tuple[int, ...]:
    """A frame batch's shape; one frame (H, W, 3) is a batch of one."""
    return (1, *frames.shape) if frames.ndim == 3 else tuple(frames.shape)


def _check_wheel_driver(driver_api: str) -> None:
    if version_tuple(driver_api) < version_tuple(TVM_CUDA_DRIVER):
        raise RuntimeLoadError(
            f"the apache-tvm wheel's CUDA backend needs a CUDA {TVM_CUDA_DRIVER}+ driver, this device's offers "
            f"{driver_api}",
            hint="install edgedeploy's CUDA backend (edgedeploy agent install DEVICE), which needs CUDA 11.4+",
        )


def loaded_tvm_libraries() -> list[str]:
    """The TVM shared libraries mapped into this process (proof that no compiler is loaded)."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            paths = {line.split()[-1] for line in f if "libtvm" in line}
    except OSError:
        return []
    return sorted(Path(p).name for p in paths)

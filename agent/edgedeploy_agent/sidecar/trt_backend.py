"""The only module that touches TensorRT: Polygraphy's loaders build, one named-tensor path runs.

It runs in the agent when the agent's Python has TensorRT, else in the sidecar worker under JetPack's
Python 3.8 (worker.py): so Python 3.8, and no import of the manifest's pydantic models.

`tensorrt` and `polygraphy` are imported when a `PolygraphyBackend` is made, never at agent import.
Version branches are the three places where TensorRT 8.5 (Xavier, JetPack 5.1), 10.x and 11.x differ
(reference notes §4):
  * EXPLICIT_BATCH network flag below 10: Polygraphy's network loader sets it itself (`explicit_batch`
    defaults to True for TensorRT < 10), so no branch is written here;
  * INT8 (+FP16) builder flags below 11; 11 removed them and is always strongly typed: `build_options`;
  * context device memory (`device_memory` vs `set_device_memory`): not used, TensorRT allocates it.
Execution is `set_input_shape` + `set_tensor_address` + `execute_async_v3` on every version (8.5+).
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, List, Protocol, Tuple

import numpy as np

from ..durable import move_durably
from ..errors import RuntimeLoadError

if TYPE_CHECKING:  # the manifest's pydantic model; the sidecar gets the same fields as a plain object
    from ..bundle import TensorRTSettings


# typing's generics: this alias is evaluated at run time, under Python 3.8 too
Allocate = Callable[[List[Tuple[Tuple[int, ...], np.dtype]]], List[np.ndarray]]


def new_arrays(outputs: list[tuple[tuple[int, ...], np.dtype]]) -> list[np.ndarray]:
    return [np.empty(shape, dtype) for shape, dtype in outputs]


class Engine(Protocol):
    """A deserialized engine with its execution context, run on host arrays.

    `allocate` gets the outputs' (shape, dtype) and returns the host arrays the engine copies them into:
    new arrays by default, shared memory in the sidecar worker (so an output is copied once on its way)."""

    def run(self, inputs: list[np.ndarray], allocate: Allocate = new_arrays) -> list[np.ndarray]: ...


class TrtBackend(Protocol):
    """Build, deserialize and run engines; the real one is PolygraphyBackend."""

    version: str
    python: str  # the Python TensorRT runs under, and where (in the agent, or its sidecar worker)

    def build(
        self, onnx: Path, settings: TensorRTSettings, timing_cache: Path | None, progress: Callable[[str], None]
    ) -> bytes: ...

    def load(self, plan: bytes) -> Engine | None: ...

    def close(self) -> None:
        """Free the backend's process or handles; engines it loaded are not used after."""


def trt_major(version: str) -> int:
    try:
        return int(version.split(".")[0])
    except ValueError:
        raise RuntimeLoadError(f"cannot read the TensorRT version {version!r}") from None


def build_options(version: str, settings: TensorRTSettings) -> tuple[dict[str, Any], dict[str, Any]]:
    """(network options, builder-config options) for a Q/DQ ONNX on this TensorRT version."""
    major = trt_major(version)
    if major < 8 or (major == 8 and int(version.split(".")[1]) < 5):
        raise RuntimeLoadError(
            f"TensorRT {version} is too old: the named-tensor API (execute_async_v3) needs 8.5 or newer",
            hint="JetPack 5.1 (TensorRT 8.5.2) is the oldest supported stack",
        )
    config: dict[str, Any] = {"builder_optimization_level": settings.builder_optimization_level}
    if major >= 11:
        # 11 removed BuilderFlag.INT8/FP16: precision comes from the graph's Q/DQ nodes (strong typing).
        return {"strongly_typed": True}, config
    # 8.5 and 10.x: explicit Q/DQ still needs the INT8 flag; FP16 lets the non-quantized layers use half.
    config.update(int8=True, fp16=settings.fp16)
    return {}, config


def _build_monitor(trt: Any, progress: Callable[[str], None]) -> Any:
    """An IProgressMonitor (TensorRT >= 10) that forwards the builder's phases as progress lines."""

    class Monitor(trt.IProgressMonitor):  # type: ignore[misc]
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            progress(f"phase {phase_name} ({num_steps} steps)")

        def step_complete(self, phase_name: str, step: int) -> bool:
            return True  # never cancel

        def phase_finish(self, phase_name: str) -> None:
            progress(f"phase {phase_name} done")

    return Monitor()


class PolygraphyBackend:
    """TensorRT through Polygraphy's loaders (network, config, timing cache) and one v3 execution path."""

    def __init__(self) -> None:
        try:
            import tensorrt as trt
            from polygraphy.backend import trt as poly_trt
        except ImportError as e:
            raise RuntimeLoadError(
                f"TensorRT is not usable here: {e}",
                hint="install TensorRT >= 8.5 and polygraphy; on JetPack 5 TensorRT is the system Python 3.8's: "
                "set system_python (edgedeploy agent install does, or edgedeploy-agent init --system-python)",
            ) from None
        self._trt, self._poly = trt, poly_trt
        self.version = str(trt.__version__)
        self.python = f"{platform.python_version()} ({sys.executable}, in process {os.getpid()})"

    def build(
        self, onnx: Path, settings: TensorRTSettings, timing_cache: Path | None, progress: Callable[[str], None]
    ) -> bytes:
        trt, poly = self._trt, self._poly
        net_opts, cfg_opts = build_options(self.version, settings)
        profiles = []
        for entries in settings.profiles:
            p = poly.Profile()
            for e in entries:
                p.add(e.input, e.min, e.opt, e.max)
            profiles.append(p)
        if hasattr(trt, "IProgressMonitor"):
            cfg_opts["progress_monitor"] = _build_monitor(trt, progress)
        config = poly.CreateConfig(
            profiles=profiles,
            memory_pool_limits={trt.MemoryPoolType.WORKSPACE: settings.workspace_bytes},
            load_timing_cache=str(timing_cache) if timing_cache is not None and timing_cache.exists() else None,
            **cfg_opts,
        )
        network = poly.NetworkFromOnnxPath(str(onnx), **net_opts)
        try:
            plan = self._build_saving_cache(network, config, timing_cache)
        except Exception as e:  # Polygraphy raises PolygraphyException with TensorRT's log
            raise RuntimeLoadError(
                f"TensorRT {self.version} could not build an engine from {onnx.name}: {e}",
                hint="likely causes: an op TensorRT does not support, asymmetric Q/DQ (zero point != 0), "
                "or too little workspace",
            ) from None
        return bytes(plan)

    def _build_saving_cache(self, network: Any, config: Any, timing_cache: Path | None) -> Any:
        """Build; the config's timing cache (the one loaded and this build's timings) replaces the old one
        whole: Polygraphy writes it in place, so it writes a new file that is then moved over the old one."""
        if timing_cache is None:
            return self._poly.EngineBytesFromNetwork(network, config)()
        new = timing_cache.with_name(f".{timing_cache.name}.new")
        try:
            plan = self._poly.EngineBytesFromNetwork(network, config, save_timing_cache=str(new))()
            move_durably(new, timing_cache)
            return plan
        finally:  # with Polygraphy's lock file (the engine cache's lock is held: no one else waits on it)
            for left in (new, Path(f"{new}.lock")):
                left.unlink(missing_ok=True)

    def close(self) -> None:
        """Nothing beyond what Python frees: engines and contexts go with their last reference."""

    def load(self, plan: bytes) -> Engine | None:
        runtime = self._trt.Runtime(self._trt.Logger(self._trt.Logger.WARNING))
        engine = runtime.deserialize_cuda_engine(plan)
        if engine is None:  # wrong TensorRT build or GPU: TensorRT logs why and returns None
            return None
        return NamedTensorEngine(self._trt, engine)


class NamedTensorEngine:
    """One execution context; inputs and outputs by tensor name, device buffers from polygraphy.cuda."""

    def __init__(self, trt: Any, engine: Any) -> None:
        from polygraphy import cuda

        self._cuda, self._engine = cuda, engine
        self._context = engine.create_execution_context()
        self._stream = cuda.Stream()
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self.inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if n not in self.inputs]
        self._dtypes = {n: np.dtype(trt.nptype(engine.get_tensor_dtype(n))) for n in names}
        self._buffers: dict[str, Any] = {}

    def _buffer(self, name: str, shape: tuple[int, ...]) -> Any:
        buf = self._buffers.get(name)
        if buf is None:
            buf = self._buffers[name] = self._cuda.DeviceArray(shape=shape, dtype=self._dtypes[name])
        else:
            buf.resize(shape)
        self._context.set_tensor_address(name, buf.ptr)
        return buf

    def run(self, inputs: list[np.ndarray], allocate: Allocate = new_arrays) -> list[np.ndarray]:
        for name, x in zip(self.inputs, inputs):
            host = np.ascontiguousarray(x, dtype=self._dtypes[name])
            self._context.set_input_shape(name, host.shape)
            self._buffer(name, host.shape).copy_from(host, self._stream)
        shapes = [(tuple(self._context.get_tensor_shape(name)), self._dtypes[name]) for name in self.outputs]
        hosts = allocate(shapes)
        buffers = [self._buffer(name, shape) for name, (shape, _) in zip(self.outputs, shapes)]
        if not self._context.execute_async_v3(self._stream.ptr):
            raise RuntimeLoadError("TensorRT execute_async_v3 failed (see the agent log for TensorRT's message)")
        for buf, host in zip(buffers, hosts):
            buf.copy_to(host, self._stream)
        self._stream.synchronize()
        return hosts

"""TensorRT in the sidecar worker, behind the same TrtBackend interface as in-process TensorRT.

The runtime (runtime/tensorrt.py) keeps the engine cache, the key and the acceptance check in the agent; the
worker builds, deserializes and runs. An input is copied once, into shared memory, where the worker hands it
to TensorRT; TensorRT copies each output into shared memory, and the agent copies it out once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from .channel import end_of, place
from .cuda_probe import CudaDevice
from .process import Sidecar
from .trt_backend import Allocate, new_arrays

START_TIMEOUT_S = 120.0  # importing TensorRT, or deserializing a large engine, on a loaded Jetson


class SidecarEngine:
    def __init__(self, sidecar: Sidecar, engine: int) -> None:
        self._sidecar, self._engine = sidecar, engine
        self.engine_ms = 0.0  # the last run's time inside the worker: the rest of run() is the sidecar's cost

    def run(self, inputs: list[np.ndarray], allocate: Allocate = new_arrays) -> list[np.ndarray]:
        shm = self._sidecar.shm
        specs = place(inputs)
        shm.ensure(end_of(specs))
        for spec, x in zip(specs, inputs):
            np.copyto(shm.array(spec), x, casting="no")
        reply = self._sidecar.request("run", engine=self._engine, inputs=specs)
        self.engine_ms = float(reply.get("engine_ms") or 0.0)
        views = [shm.array(s) for s in reply["outputs"]]
        outs = allocate([(v.shape, v.dtype) for v in views])
        for out, view in zip(outs, views):
            np.copyto(out, view)
        return outs


class SidecarTrtBackend:
    """TensorRT under another Python (JetPack's 3.8), reached through one worker process."""

    def __init__(self, python: str, timeout_s: float = 10.0) -> None:
        self.sidecar = Sidecar(python, "tensorrt", timeout_s)
        hello = self.sidecar.hello
        self.python = f"{hello.get('python')} ({hello.get('executable')}, worker pid {self.sidecar.pid})"
        self.version = ""

    def probe(self) -> CudaDevice:
        """The CUDA device as the worker sees it, asked before TensorRT is imported there."""
        return CudaDevice(**self.sidecar.request("probe")["device"])

    def open(self) -> SidecarTrtBackend:
        """Import TensorRT in the worker (the runtime's backend factory)."""
        self.version = str(self.sidecar.request("open", timeout=START_TIMEOUT_S)["version"])
        return self

    def build(self, onnx: Path, settings: Any, timing_cache: Path | None, progress: Callable[[str], None]) -> bytes:
        reply = self.sidecar.request(
            "build",
            timeout=0,
            on_event=lambda event: progress(str(event.get("message"))),
            onnx=str(onnx),
            settings=settings.model_dump(mode="json"),
            timing_cache=str(timing_cache) if timing_cache is not None else None,
        )
        where = reply["plan"]
        return self.sidecar.shm.bytes_at(int(where["offset"]), int(where["size"]))

    def load(self, plan: bytes) -> SidecarEngine | None:
        reply = self.sidecar.request("load", timeout=START_TIMEOUT_S, plan=self.sidecar.shm.put_bytes(plan))
        engine = reply.get("engine")
        return None if engine is None else SidecarEngine(self.sidecar, int(engine))

    def close(self) -> None:
        self.sidecar.close()

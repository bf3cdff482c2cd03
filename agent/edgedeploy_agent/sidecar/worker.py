"""The sidecar worker: TensorRT or camera capture, run under the Python that has them (JetPack's 3.8).

    python3.8 -m edgedeploy_agent.sidecar.worker --role tensorrt|capture --fds IN,OUT,SHM

The agent starts it (sidecar/process.py) with two pipe ends and a memfd; it answers one request at a time
until the agent sends `exit` or closes the pipe. TensorRT, Polygraphy and OpenCV print to this process's
stdout and stderr, which are the agent's log; the protocol has its own pipes (channel.py).

TensorRT requests: `probe` (the CUDA device, asked of the driver before TensorRT is imported), `open`
(import TensorRT: its version), `build` (ONNX path -> plan in shared memory, with progress events), `load`
(plan in shared memory -> engine id), `run` (inputs in shared memory -> outputs written there by the engine).
Capture requests: `open` (a cv2.VideoCapture), `read` (one frame decoded into shared memory), `release`.
Both: `info` (Python, OpenCV and GStreamer here) and `exit`.

`EDGEDEPLOY_TENSORRT_DOUBLE=module:factory` replaces TensorRT with a test double (tests/agent/trt_double.py):
the factory returns an object with `probe()` and `backend()`. Devices never set it.

Python 3.8, standard library and numpy (plus TensorRT or OpenCV, imported on request): `vermin -t=3.8`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Dict

import numpy as np

from ..errors import AgentError
from .channel import Channel, ChannelClosed, SharedMemory, end_of, place
from .python_facts import python_facts

DOUBLE_ENV = "EDGEDEPLOY_TENSORRT_DOUBLE"
Handler = Callable[[Dict[str, Any]], Dict[str, Any]]  # evaluated at run time, under 3.8 too


def _namespace(value: Any) -> Any:
    """JSON settings as attribute objects (what the TensorRT backend reads from the manifest's model)."""
    if isinstance(value, dict):
        return SimpleNamespace(**{k: _namespace(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_namespace(v) for v in value]
    return value


class TensorRTRole:
    def __init__(self, shm: SharedMemory, send: Callable[[dict[str, Any]], None]) -> None:
        self.shm, self.send = shm, send
        self.backend: Any = None
        self.engines: list[Any] = []
        spec = os.environ.get(DOUBLE_ENV)
        if spec:
            module, _, attr = spec.partition(":")
            double = getattr(importlib.import_module(module), attr)()
            self._probe, self._backend = double.probe, double.backend
        else:
            from . import cuda_probe, trt_backend

            self._probe, self._backend = cuda_probe.probe_cuda, trt_backend.PolygraphyBackend

    def handlers(self) -> dict[str, Handler]:
        return {"probe": self.probe, "open": self.open, "build": self.build, "load": self.load, "run": self.run}

    def probe(self, request: dict[str, Any]) -> dict[str, Any]:
        device = self._probe()
        return {"device": vars(device)}

    def open(self, request: dict[str, Any]) -> dict[str, Any]:
        if self.backend is None:
            self.backend = self._backend()
        return {"version": self.backend.version}

    def build(self, request: dict[str, Any]) -> dict[str, Any]:
        timing = request.get("timing_cache")
        plan = self.backend.build(
            Path(request["onnx"]),
            _namespace(request["settings"]),
            Path(timing) if timing else None,
            lambda message: self.send({"event": "progress", "message": str(message)}),
        )
        return {"plan": self.shm.put_bytes(plan)}

    def load(self, request: dict[str, Any]) -> dict[str, Any]:
        where = request["plan"]
        engine = self.backend.load(self.shm.bytes_at(int(where["offset"]), int(where["size"])))
        if engine is None:
            return {"engine": None}
        self.engines.append(engine)
        return {"engine": len(self.engines) - 1}

    def run(self, request: dict[str, Any]) -> dict[str, Any]:
        engine = self.engines[int(request["engine"])]
        inputs = [self.shm.array(s) for s in request["inputs"]]
        placed: list[dict[str, Any]] = []

        def allocate(outputs: list[Any]) -> list[np.ndarray]:
            """Host arrays for the engine's outputs, in shared memory after the inputs."""
            placed.extend(place(outputs, end_of(request["inputs"])))
            return [self.shm.array(s) for s in placed]

        started = time.perf_counter()
        engine.run(inputs, allocate)
        return {"outputs": placed, "engine_ms": (time.perf_counter() - started) * 1e3}


class CaptureRole:
    def __init__(self, shm: SharedMemory, send: Callable[[dict[str, Any]], None]) -> None:
        import cv2

        self.cv2, self.shm = cv2, shm
        self.cap: Any | None = None
        self.frame: np.ndarray | None = None  # the shared-memory view the next frame is decoded into
        self.copies = 0  # frames OpenCV could not decode in place (a size change), copied once more

    def handlers(self) -> dict[str, Handler]:
        return {"open": self.open, "read": self.read, "release": self.release}

    def open(self, request: dict[str, Any]) -> dict[str, Any]:
        self.release({})
        cap = self.cv2.VideoCapture(str(request["target"]), int(request["backend"]))
        if not cap.isOpened():
            cap.release()
            return {"opened": False}
        for prop, value in dict(request.get("props") or {}).items():
            cap.set(int(prop), float(value))
        self.cap = cap
        return {"opened": True}

    def read(self, request: dict[str, Any]) -> dict[str, Any]:
        if self.cap is None:
            return {"frame": None}
        started = time.perf_counter()
        ok, image = self.cap.read(self.frame) if self.frame is not None else self.cap.read()
        read_ms = (time.perf_counter() - started) * 1e3
        if not ok or image is None:
            return {"frame": None}
        if self.frame is None or image.ctypes.data != self.frame.ctypes.data:
            # the first frame, or a new size: place it, and decode the next ones into that place
            (spec,) = place([image])
            self.frame = self.shm.array(spec)
            np.copyto(self.frame, image)
            self.copies += 1
        frame = {"offset": 0, "shape": list(self.frame.shape), "dtype": self.frame.dtype.str}
        return {"frame": frame, "read_ms": read_ms}

    def release(self, request: dict[str, Any]) -> dict[str, Any]:
        if self.cap is not None:
            self.cap.release()
            self.cap = None
        self.frame = None
        return {"released": True, "copies": self.copies}


def serve(role: str, channel: Channel, shm: SharedMemory) -> int:
    worker = (TensorRTRole if role == "tensorrt" else CaptureRole)(shm, channel.send)
    handlers = worker.handlers()
    handlers["info"] = lambda request: python_facts()
    channel.send(
        {"event": "hello", "pid": os.getpid(), "python": platform.python_version(), "executable": sys.executable}
    )
    while True:
        try:
            request = channel.recv()
        except ChannelClosed:
            return 0  # the agent went away
        op = request.get("op")
        if op == "exit":
            return 0
        handler = handlers.get(str(op))
        try:
            if handler is None:
                raise AgentError(f"the {role} worker has no request {op!r}")
            reply = handler(request)
        except AgentError as e:
            reply = {"error": e.to_dict()}
        except Exception as e:  # TensorRT and OpenCV fail with any error type: the agent reports it
            traceback.print_exc()
            reply = {"error": {"code": "sidecar-error", "message": f"{type(e).__name__}: {e}", "hint": None}}
        try:
            channel.send(reply)
        except ChannelClosed:
            return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="edgedeploy_agent.sidecar.worker")
    parser.add_argument("--role", choices=("tensorrt", "capture"), required=True)
    parser.add_argument("--fds", required=True, help="IN,OUT,SHM: the request pipe, the reply pipe, the memfd")
    args = parser.parse_args(argv)
    read_fd, write_fd, shm_fd = (int(x) for x in args.fds.split(","))
    channel, shm = Channel(read_fd, write_fd), SharedMemory(shm_fd)
    try:
        return serve(args.role, channel, shm)
    finally:
        shm.close()
        channel.close()


if __name__ == "__main__":
    sys.exit(main())

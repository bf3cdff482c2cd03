"""A test double for TensorRT, which cannot be installed here (docs/tensorrt.md): same TrtBackend interface.

It behaves like the real thing where the runtime's logic depends on it:
  * `build` checks the builder options with the production `build_options` (so a too-old TensorRT
    fails as it would), reports phases, and writes/extends the timing cache file it is given;
  * a plan records the TensorRT version and GPU it was built for, and `load` returns None for a plan of
    another version or GPU, or for garbage, as `deserialize_cuda_engine` does;
  * the "engine" runs the bundle's Q/DQ ONNX with onnxruntime, graph optimizations off (Q/DQ as float32
    ops: like an engine, it rounds differently from the exact reference the bundle ships, and unlike
    onnxruntime's optimized INT8 kernels it computes the same on every CPU), optionally perturbed to act
    like a broken engine.

The same double serves TensorRT's sidecar worker under Python 3.8 (tests/agent/test_sidecar.py): the worker
imports `sidecar_double` when EDGEDEPLOY_TENSORRT_DOUBLE names it, so this module is Python 3.8 and imports no
pydantic model at run time.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime as ort

from edgedeploy_agent.sidecar.cuda_probe import CudaDevice
from edgedeploy_agent.sidecar.trt_backend import Allocate, build_options, new_arrays

if TYPE_CHECKING:
    from edgedeploy_agent.bundle import TensorRTSettings

T4 = CudaDevice(name="Tesla T4", compute_capability="7.5", driver_version="13.0", runtime_version="13.0")
XAVIER = CudaDevice(name="Xavier", compute_capability="7.2", driver_version="11.4", runtime_version="11.4")
_MAGIC = b"FAKE-TRT-PLAN\n"


class FakeEngine:
    def __init__(
        self, onnx: bytes, perturb: float, hang_after_runs: int | None = None, hang_file: str | None = None
    ) -> None:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        # one thread that sleeps when idle: onnxruntime's pool spins between runs, which a GPU engine does not,
        # and on a 2-core machine that spinning would be charged to whatever runs next (the sidecar's pipe)
        so.intra_op_num_threads = 1
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(onnx, so, providers=["CPUExecutionProvider"])
        self.perturb, self.hang_after_runs, self.hang_file = perturb, hang_after_runs, hang_file
        self.batches: list[int] = []

    def run(self, inputs: list[np.ndarray], allocate: Allocate = new_arrays) -> list[np.ndarray]:
        hang = self.hang_after_runs is not None and len(self.batches) >= self.hang_after_runs
        if hang and (self.hang_file is None or os.path.exists(self.hang_file)):
            time.sleep(3600)  # a hung engine (a GPU fault, a deadlock in the driver)
        self.batches.append(int(inputs[0].shape[0]))
        feed = {i.name: x for i, x in zip(self.session.get_inputs(), inputs)}
        outs = [np.asarray(o) for o in self.session.run(None, feed)]
        if self.perturb:
            # a broken engine: scores shuffled across classes
            outs[0] = np.roll(outs[0], 7, axis=-1) + self.perturb
        hosts = allocate([(o.shape, o.dtype) for o in outs])  # like TensorRT's copies to the host
        for host, o in zip(hosts, outs):
            np.copyto(host, o)
        return hosts


class FakeTensorRT:
    """Stands in for PolygraphyBackend; counts builds and loads."""

    def __init__(
        self,
        version: str = "10.16.1.11",
        gpu: CudaDevice = T4,
        perturb: float = 0.0,
        hang_after_runs: int | None = None,
        hang_file: str | None = None,
    ) -> None:
        """`hang_after_runs`: an engine that hangs on that run and later ones (while `hang_file` exists, if given)."""
        self.version, self.gpu, self.perturb = version, gpu, perturb
        self.hang_after_runs, self.hang_file = hang_after_runs, hang_file
        self.python = f"{platform.python_version()} (the TensorRT double, pid {os.getpid()})"
        self.builds: list[dict[str, object]] = []
        self.loads = 0
        self.engines: list[FakeEngine] = []

    def __call__(self) -> FakeTensorRT:  # used as the runtime's backend factory
        return self

    def build(
        self, onnx: Path, settings: TensorRTSettings, timing_cache: Path | None, progress: Callable[[str], None]
    ) -> bytes:
        network, config = build_options(self.version, settings)
        reused = timing_cache is not None and timing_cache.exists()
        for phase in ("Building engine", "Tactic selection"):
            progress(f"phase {phase}")
        if timing_cache is not None:
            with open(timing_cache, "ab") as f:
                f.write(f"{self.version} {self.gpu.name}\n".encode())
        self.builds.append({"network": network, "config": config, "timing_cache_reused": reused})
        header = {"version": self.version, "gpu": self.gpu.name}
        return _MAGIC + json.dumps(header).encode() + b"\n" + onnx.read_bytes()  # self-contained, like a plan

    def close(self) -> None: ...

    def load(self, plan: bytes) -> FakeEngine | None:
        self.loads += 1
        if not plan.startswith(_MAGIC):
            return None
        head, _, onnx = plan[len(_MAGIC) :].partition(b"\n")
        header = json.loads(head)
        if header["version"] != self.version or header["gpu"] != self.gpu.name:
            return None  # "Serialization assertion stdVersionRead == serializationVersion failed"
        engine = FakeEngine(onnx, self.perturb, self.hang_after_runs, self.hang_file)
        self.engines.append(engine)
        return engine


OPTIONS_ENV = "EDGEDEPLOY_TRT_DOUBLE_OPTIONS"


class SidecarDouble:
    """What the sidecar worker asks of its TensorRT: the device probe and the backend (EDGEDEPLOY_TENSORRT_DOUBLE)."""

    def __init__(self) -> None:
        options = json.loads(os.environ.get(OPTIONS_ENV, "{}"))
        gpu = {"T4": T4, "Xavier": XAVIER}[options.pop("gpu", "Xavier")]
        self.trt = FakeTensorRT(gpu=gpu, **{"version": "8.5.2.2", **options})

    def probe(self) -> CudaDevice:
        return self.trt.gpu

    def backend(self) -> FakeTensorRT:
        return self.trt


def sidecar_double() -> SidecarDouble:
    return SidecarDouble()

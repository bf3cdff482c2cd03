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
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edgedeploy_agent.bundle import TensorRTSettings
from edgedeploy_agent.runtime.cuda_probe import CudaDevice
from edgedeploy_agent.runtime.trt_backend import build_options

T4 = CudaDevice(name="Tesla T4", compute_capability="7.5", driver_version="13.0", runtime_version="13.0")
XAVIER = CudaDevice(name="Xavier", compute_capability="7.2", driver_version="11.4", runtime_version="11.4")
_MAGIC = b"FAKE-TRT-PLAN\n"


class FakeEngine:
    def __init__(self, onnx: bytes, perturb: float) -> None:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        self.session = ort.InferenceSession(onnx, so, providers=["CPUExecutionProvider"])
        self.perturb = perturb
        self.batches: list[int] = []

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        self.batches.append(int(inputs[0].shape[0]))
        feed = {i.name: x for i, x in zip(self.session.get_inputs(), inputs, strict=True)}
        outs = [np.asarray(o) for o in self.session.run(None, feed)]
        if self.perturb:
            # a broken engine: scores shuffled across classes
            outs[0] = np.roll(outs[0], 7, axis=-1) + self.perturb
        return outs


class FakeTensorRT:
    """Stands in for PolygraphyBackend; counts builds and loads."""

    def __init__(self, version: str = "10.16.1.11", gpu: CudaDevice = T4, perturb: float = 0.0) -> None:
        self.version, self.gpu, self.perturb = version, gpu, perturb
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

    def load(self, plan: bytes) -> FakeEngine | None:
        self.loads += 1
        if not plan.startswith(_MAGIC):
            return None
        head, _, onnx = plan[len(_MAGIC) :].partition(b"\n")
        header = json.loads(head)
        if header["version"] != self.version or header["gpu"] != self.gpu.name:
            return None  # "Serialization assertion stdVersionRead == serializationVersion failed"
        engine = FakeEngine(onnx, self.perturb)
        self.engines.append(engine)
        return engine

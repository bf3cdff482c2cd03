"""What a compile stage is: a function `(ctx: BuildContext) -> None` registered by name with `@stage(name)`.

The stage modules (tvm_backend.py, int8/rewrite.py, cuda/nhwc.py, tuning/apply.py, frontends/*) import this module
and register themselves; it imports none of them. pipeline.py says which stages run for a target, in which order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgedeploy_agent.bundle import TensorSpec

from ..profiles import DeviceProfile
from .config import CudaConfig, TuneRequest


@dataclass
class BuildContext:
    # OnnxModel, or frontends.ForeignModel (TFLite, PyTorch) whose own import stage reads it. Not a typed
    # union: the ONNX stages (int8/rewrite.py among them) read `.proto`, and only ONNX pipelines run them.
    model: Any
    profile: DeviceProfile
    work_dir: Path
    progress: Callable[[str], None] = lambda step: None
    precision: str = "fp32"  # fp32 | fp16 (GPU: mixed-precision stage) | int8 (the model is a QDQ ONNX model)
    cuda_graph: bool = True
    cuda: CudaConfig = field(default_factory=CudaConfig)  # the CUDA schedule configuration (config.py)
    ir: Any = None  # the Relax IRModule as stages transform it
    executable: Any = None
    library: Path | None = None
    outputs: list[TensorSpec] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    device_code: list[str] = field(default_factory=list)  # e.g. ["sm_75 sass (fatbin, 132704 B)"]
    host_machine: str | None = None  # ELF machine of the exported library
    ptx: Path | None = None  # nvrtc-11 builds: the PTX of the library's CUDA module (the bundle's model.ptx)
    cuda_source_sha256: str = ""  # nvrtc-11 builds: of TVM's CUDA source (a twin's equals its original's)
    float_left: list[str] = field(default_factory=list)  # int8 builds: layers TVM still computes in float
    tuning_key: str = ""  # names the stored MetaSchedule database: "<graph digest[:16]>-<precision>" (tuning_key)
    tuning_db: Path | None = None  # the database apply-tuning applies (tuning.find_database), if any
    tune: TuneRequest | None = None  # `edgedeploy tune`: tune (or export the tuning module) in apply-tuning
    tuned_kernels: list[str] = field(default_factory=list)  # kernels whose schedule came from the database
    kernel_count: int = 0  # all kernels, when a database was applied
    gemm_tuning: str = ""  # CUDA: how many tensor-core kernels took a tuned configuration, from which file
    stop: bool = False  # a stage ended the build early (tuning export: nothing left to compile)


StageFn = Callable[[BuildContext], None]


STAGES: dict[str, StageFn] = {}


def stage(name: str) -> Callable[[StageFn], StageFn]:
    def register(fn: StageFn) -> StageFn:
        STAGES[name] = fn
        return fn

    return register

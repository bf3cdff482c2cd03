"""Compile pipelines: registries of named stages per target kind.

A stage is a function `(ctx: BuildContext) -> None` registered with `@stage(name)`. A pipeline is a
tuple of stage names in PIPELINES[target kind]. An unknown target kind or stage is an error that lists
the valid names, so adding a target means adding data here, not `if` chains elsewhere.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgedeploy_agent.bundle import TensorSpec

from ..errors import BuildError
from ..profiles import DeviceProfile
from .onnx_model import OnnxModel


@dataclass
class BuildContext:
    model: OnnxModel
    profile: DeviceProfile
    work_dir: Path
    progress: Callable[[str], None] = lambda step: None
    precision: str = "fp32"  # fp32 | fp16
    cuda_graph: bool = True
    ir: Any = None  # the Relax IRModule as stages transform it
    executable: Any = None
    library: Path | None = None
    outputs: list[TensorSpec] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    device_code: list[str] = field(default_factory=list)  # e.g. ["sm_75 sass (fatbin, 132704 B)"]
    host_machine: str | None = None  # ELF machine of the exported library


StageFn = Callable[[BuildContext], None]
STAGES: dict[str, StageFn] = {}


def stage(name: str) -> Callable[[StageFn], StageFn]:
    def register(fn: StageFn) -> StageFn:
        STAGES[name] = fn
        return fn

    return register


# Part of every build-cache key, with the stage names: bump it when a stage changes what it produces.
PIPELINE_REVISION = 3

PIPELINES: dict[str, tuple[str, ...]] = {
    "cpu": ("import-onnx", "decompose-for-inference", "compile-llvm", "export-library", "check-library"),
    # CUDA builds run in a worker process whose environment holds the CUDA toolchain (cuda_worker.py)
    "cuda": (
        "import-onnx",
        "decompose-for-inference",
        "clip-as-relax-ops",
        "mixed-precision",
        "compile-cuda",
        "export-library",
        "check-library",
    ),
}


def pipeline_for(profile: DeviceProfile) -> tuple[str, ...]:
    if profile.device not in PIPELINES:
        raise BuildError(
            f"profile {profile.name} targets {profile.device}, which has no compile pipeline yet",
            hint=f"pipelines exist for: {', '.join(sorted(PIPELINES))} (GPU builds land with the GPU-profile work)",
        )
    return PIPELINES[profile.device]


def run_pipeline(ctx: BuildContext) -> BuildContext:
    from . import tvm_backend  # noqa: F401  (registers the TVM stages)

    for name in pipeline_for(ctx.profile):
        if name not in STAGES:
            raise BuildError(f"unknown compile stage {name!r}", hint=f"known stages: {', '.join(sorted(STAGES))}")
        ctx.progress(name)
        t = time.perf_counter()
        STAGES[name](ctx)
        ctx.timings[name] = round(time.perf_counter() - t, 3)
    return ctx

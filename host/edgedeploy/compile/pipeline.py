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
    ir: Any = None  # the Relax IRModule as stages transform it
    executable: Any = None
    library: Path | None = None
    outputs: list[TensorSpec] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    precision: str = "fp32"  # "int8": the model is a QDQ ONNX model and the int8 pipeline runs
    float_left: list[str] = field(default_factory=list)  # int8 builds: layers TVM still computes in float
    tuning_key: str = ""  # names the stored MetaSchedule database: "<source model sha[:16]>-<precision>"
    tune_trials: int = 0  # > 0: tune (and extend the stored database) before compiling


StageFn = Callable[[BuildContext], None]
STAGES: dict[str, StageFn] = {}


def stage(name: str) -> Callable[[StageFn], StageFn]:
    def register(fn: StageFn) -> StageFn:
        STAGES[name] = fn
        return fn

    return register


PIPELINES: dict[str, tuple[str, ...]] = {
    "cpu": ("import-onnx", "decompose-for-inference", "apply-tuning", "compile-llvm", "export-library"),
    "cpu-int8": (
        "import-onnx",
        "decompose-for-inference",
        "int8-rewrite",
        "apply-tuning",
        "compile-llvm",
        "export-library",
    ),
}


def pipeline_for(profile: DeviceProfile, precision: str = "fp32") -> tuple[str, ...]:
    key = profile.device if precision == "fp32" else f"{profile.device}-{precision}"
    if key not in PIPELINES and profile.device in PIPELINES:
        raise BuildError(
            f"profile {profile.name} has no {precision} compile pipeline yet",
            hint=f"pipelines exist for: {', '.join(sorted(PIPELINES))}",
        )
    if profile.device not in PIPELINES:
        raise BuildError(
            f"profile {profile.name} targets {profile.device}, which has no compile pipeline yet",
            hint=f"pipelines exist for: {', '.join(sorted(PIPELINES))} (GPU builds land with the GPU-profile work)",
        )
    return PIPELINES[key]


def run_pipeline(ctx: BuildContext) -> BuildContext:
    from . import int8_rewrite, tuning, tvm_backend  # noqa: F401  (register the TVM stages)

    for name in pipeline_for(ctx.profile, ctx.precision):
        if name not in STAGES:
            raise BuildError(f"unknown compile stage {name!r}", hint=f"known stages: {', '.join(sorted(STAGES))}")
        ctx.progress(name)
        t = time.perf_counter()
        STAGES[name](ctx)
        ctx.timings[name] = round(time.perf_counter() - t, 3)
    return ctx

"""Compile pipelines: the named stages (stage.py) each target kind runs, in order.

A pipeline is a tuple of stage names in PIPELINES[target kind]; run_pipeline imports the stage modules, which
register themselves in stage.STAGES. An unknown target kind or stage is an error that lists
the valid names, so adding a target means adding data here, not `if` chains elsewhere.
"""

from __future__ import annotations

import functools
import hashlib
import time
from pathlib import Path

from ..errors import BuildError, InputError
from ..profiles import DeviceProfile
from .stage import STAGES, BuildContext


@functools.cache
def compiler_digest() -> str:
    """Part of every build-cache key: the sha256 of this package's sources, so that any change to a stage,
    a schedule rule or a rewrite rebuilds instead of serving a library compiled by the old code (a
    hand-bumped revision number was forgotten once and a benchmark measured stale kernels)."""
    h = hashlib.sha256()
    root = Path(__file__).parent
    for f in sorted(root.rglob("*.py")):
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


PIPELINES: dict[str, tuple[str, ...]] = {
    "cpu": (
        "import-onnx",
        "decompose-for-inference",
        "cpu-direct-conv",
        "apply-tuning",
        "compile-llvm",
        "export-library",
        "check-library",
    ),
    # a TFLite model through TVM's Relax TFLite frontend; a quantized (QAT) one keeps the model's own scales and
    # runs its convolutions in integer arithmetic with TFLite's requantization (tflite_integer.py)
    "cpu-tflite": (
        "import-tflite",
        "tflite-integer",
        "decompose-for-inference",
        "apply-tuning",
        "compile-llvm",
        "export-library",
        "check-library",
    ),
    # a PyTorch ExportedProgram (torch.export) through TVM's from_exported_program (torch_model.py)
    "cpu-torch": (
        "import-torch",
        "decompose-for-inference",
        "apply-tuning",
        "compile-llvm",
        "export-library",
        "check-library",
    ),
    "cpu-int8": (
        "import-onnx",
        "decompose-for-inference",
        "int8-rewrite",
        "apply-tuning",
        "compile-llvm",
        "export-library",
        "check-library",
    ),
    # CUDA builds run in a worker process whose environment holds the CUDA toolchain (cuda_worker.py);
    # fp16 is the mixed-precision stage (a no-op for fp32)
    "cuda": (
        "import-onnx",
        "decompose-for-inference",
        "clip-as-relax-ops",
        "nhwc-layout",
        "mixed-precision",
        "apply-tuning",
        "compile-cuda",
        "export-library",
        "check-library",
    ),
    # the QDQ -> integer rewrite, then the same CUDA stages: int8 convolutions on IMMA tensor cores
    # (cuda/tensorcore.py) with NHWC activations (nhwc.py); what cannot use them (depthwise) gets dp4a
    # from nvcc (SASS IDP.4A)
    "cuda-int8": (
        "import-onnx",
        "decompose-for-inference",
        "int8-rewrite",
        "clip-as-relax-ops",
        "nhwc-layout",
        "apply-tuning",
        "compile-cuda",
        "export-library",
        "check-library",
    ),
}


def pipeline_for(profile: DeviceProfile, precision: str = "fp32", frontend: str = "onnx") -> tuple[str, ...]:
    """The stages for a profile, a precision and the frontend that reads the model (onnx, tflite, torch); a
    combination without a pipeline is the user's choice of options or profile: InputError (exit 2)."""
    if profile.device not in PIPELINES:
        raise InputError(
            f"profile {profile.name} targets {profile.device}, which has no compile pipeline",
            hint=f"pipelines exist for: {', '.join(sorted(PIPELINES))}",
        )
    if precision == "fp16" and profile.device != "cuda":
        raise InputError(
            f"--precision fp16 is for GPU profiles; {profile.name} builds fp32 or int8",
            hint="leave --precision out (fp32), or pick a CUDA profile (edgedeploy profiles list)",
        )
    key = f"{profile.device}-{precision}" if precision == "int8" else profile.device
    if frontend != "onnx":
        if precision != "fp32":
            raise InputError(
                f"{frontend} models build as they are: {precision} needs an ONNX model",
                hint="a quantized (QAT) TFLite model keeps its own INT8 scales without --int8; for calibration "
                "export to ONNX (see docs/troubleshooting.md#models)",
            )
        key = f"{profile.device}-{frontend}"
    if key not in PIPELINES:
        what = f"{frontend} " if frontend != "onnx" else f"{precision} "
        raise InputError(
            f"profile {profile.name} has no {what}compile pipeline yet",
            hint=f"pipelines exist for: {', '.join(sorted(PIPELINES))}",
        )
    return PIPELINES[key]


def run_pipeline(ctx: BuildContext, stop_before: str | None = None) -> BuildContext:
    """Run the profile's stages on `ctx` (up to, not including, `stop_before` when given)."""
    from . import cpu_conv, tvm_backend  # noqa: F401  (register the TVM stages)
    from .cuda import nhwc  # noqa: F401
    from .frontends.load import frontend_name
    from .int8 import rewrite  # noqa: F401
    from .tuning import apply  # noqa: F401

    frontend = frontend_name(ctx.model)
    if frontend == "tflite":
        from .frontends import tflite_integer, tflite_model  # noqa: F401
    elif frontend == "torch":
        from .frontends import torch_model  # noqa: F401

    for name in pipeline_for(ctx.profile, ctx.precision, frontend):
        if name == stop_before:
            break
        if name not in STAGES:
            raise BuildError(f"unknown compile stage {name!r}", hint=f"known stages: {', '.join(sorted(STAGES))}")
        ctx.progress(name)
        t = time.perf_counter()
        STAGES[name](ctx)
        ctx.timings[name] = round(time.perf_counter() - t, 3)
        if ctx.stop:
            break
    return ctx

"""What `edgedeploy build` asks for, checked, then given to the TVM writer (package.py) or the TensorRT
writer (tensorrt_artifacts.py): the runtime, its batch, and what a TensorRT bundle needs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..errors import InputError
from ..profiles import DeviceProfile
from .cards import ModelCard
from .int8_build import Int8Config
from .manifest import BuildResult
from .package import build_bundle
from .tensorrt_artifacts import TensorRTOptions, build_tensorrt_bundle, parse_batch

RUNTIMES = ("tvm", "tensorrt")


def tvm_batch(batch: int | str | None) -> int:
    """TVM compiles for one static batch size (default 1)."""
    if batch is None:
        return 1
    if isinstance(batch, int) and batch >= 1:
        return batch
    if not str(batch).isdigit() or int(batch) < 1:
        raise InputError(
            f"--batch for TVM is one static batch size, got {batch!r}",
            hint="batch ranges (MIN:OPT:MAX) are for --runtime tensorrt",
        )
    return int(batch)


def tensorrt_int8(cfg: Int8Config | None) -> Int8Config:
    if cfg is None:
        raise InputError(
            "--runtime tensorrt ships an INT8 Q/DQ model: add --int8 --calibration DATA",
            hint="TensorRT 11 removed implicit INT8 calibration; the host quantizes, the device builds the engine",
        )
    if cfg.eval_data is not None:
        raise InputError(
            "--eval is not supported with --runtime tensorrt yet",
            hint="measure the same symmetric Q/DQ model with `edgedeploy build --int8 --symmetric --eval ...`",
        )
    return cfg


def build_for_runtime(
    model: Path,
    profile: DeviceProfile,
    out: Path,
    card: ModelCard,
    *,
    runtime: str = "tvm",
    batch: int | str | None = None,
    precision: str = "fp32",
    cuda_graph: bool = True,
    use_cache: bool = True,
    int8: Int8Config | None = None,
    workspace_mib: int = 1024,
    progress: Callable[[str], None] = lambda s: None,
) -> BuildResult:
    """`runtime` tvm: a compiled library (batch: one size); tensorrt: INT8 Q/DQ ONNX (batch: MIN:OPT:MAX)."""
    if runtime not in RUNTIMES:
        raise InputError(f"unknown runtime {runtime!r}", hint="choose tvm or tensorrt")
    if runtime == "tensorrt":
        options = TensorRTOptions(batch=parse_batch(str(batch or "1")), workspace_mib=workspace_mib)
        return build_tensorrt_bundle(model, profile, out, card, tensorrt_int8(int8), options, progress=progress)
    return build_bundle(
        model,
        profile,
        out,
        card,
        progress=progress,
        use_cache=use_cache,
        precision="fp32" if precision == "int8" else precision,
        cuda_graph=cuda_graph,
        batch=tvm_batch(batch),
        int8=int8,
    )

"""What `edgedeploy build` asks for, checked, then given to the TVM writer (package.py) or the TensorRT
writer (tensorrt_artifacts.py): the runtime, its batch, and what a TensorRT bundle needs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..errors import InputError
from ..profiles import DeviceProfile
from .cards import ModelCard
from .config import CudaConfig
from .frontends.load import frontend_of
from .int8.build import Int8Config
from .manifest import BuildResult
from .package import build_bundle
from .pipeline import pipeline_for
from .tensorrt_artifacts import TensorRTOptions, build_tensorrt_bundle, parse_batch

RUNTIMES = ("tvm", "tensorrt")
PRECISIONS = ("fp32", "fp16", "int8")
PRECISION_HINT = "choose fp32 (the default), fp16 (GPU profiles) or int8 (needs --calibration DATA)"


def check_options(
    model: Path, profile: DeviceProfile, runtime: str, precision: str, batch: int | str | None, int8: bool
) -> tuple[str, str, int | tuple[int, int, int]]:
    """Everything `edgedeploy build` can be told about the runtime, precision and batch, checked before any
    file is read or anything compiled (one line, exit 2, with the valid choices): (runtime, precision,
    batch), the names in lower case, `batch` a TVM size or TensorRT's (MIN, OPT, MAX)."""
    runtime, precision = runtime.strip().lower(), precision.strip().lower()
    if runtime not in RUNTIMES:
        raise InputError(f"unknown runtime {runtime!r}", hint="choose tvm or tensorrt")
    if precision not in PRECISIONS:
        raise InputError(f"--precision {precision!r} is not a precision edgedeploy builds", hint=PRECISION_HINT)
    if int8 and precision == "fp16":
        raise InputError("--int8 builds int8, --precision fp16 asks for fp16", hint="give one of them")
    if precision == "int8" or int8:
        precision = "int8"
    if precision == "fp16" and profile.device != "cuda":
        raise InputError(
            f"--precision fp16 is for GPU profiles; {profile.name} is a {profile.device} profile",
            hint="build fp32 (the default) or int8 (--int8 --calibration DATA) for it, or pick a CUDA profile "
            "(edgedeploy profiles list)",
        )
    if runtime == "tensorrt":
        if profile.device != "cuda":
            raise InputError(f"--runtime tensorrt needs a CUDA profile, {profile.name} is {profile.device}")
        if precision != "int8":
            tensorrt_int8(None)  # the one message: add --int8 --calibration
        return runtime, precision, parse_batch(str(batch or "1"))
    pipeline_for(profile, precision, frontend_of(model))  # a frontend or device without this pipeline
    return runtime, precision, tvm_batch(batch)


def tvm_batch(batch: int | str | None) -> int:
    """TVM compiles for one static batch size (default 1)."""
    if batch is None:
        return 1
    text = str(batch).strip()
    if ":" in text:
        raise InputError(
            f"--batch for TVM is one static batch size, got {text!r}",
            hint="batch ranges (MIN:OPT:MAX) are for --runtime tensorrt",
        )
    try:
        size = int(text)
    except ValueError:
        raise InputError(f"--batch takes a whole number of inputs per run, got {text!r}") from None
    if size < 1:
        raise InputError(f"--batch must be at least 1, got {size}", hint="see edgedeploy build --help")
    return size


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
    cuda: CudaConfig = CudaConfig(),
    progress: Callable[[str], None] = lambda s: None,
) -> BuildResult:
    """`runtime` tvm: a compiled library (batch: one size); tensorrt: INT8 Q/DQ ONNX (batch: MIN:OPT:MAX).
    The options are checked (check_options) before anything is read."""
    runtime, precision, sizes = check_options(model, profile, runtime, precision, batch, int8 is not None)
    if runtime == "tensorrt":
        assert isinstance(sizes, tuple)
        options = TensorRTOptions(batch=sizes, workspace_mib=workspace_mib)
        return build_tensorrt_bundle(model, profile, out, card, tensorrt_int8(int8), options, progress=progress)
    if precision == "int8" and int8 is None:
        raise InputError("--precision int8 needs --calibration (an image folder, a video file or .npy batches)")
    assert isinstance(sizes, int)
    return build_bundle(
        model,
        profile,
        out,
        card,
        progress=progress,
        use_cache=use_cache,
        precision="fp32" if precision == "int8" else precision,
        cuda_graph=cuda_graph,
        batch=sizes,
        int8=int8,
        cuda=cuda,
    )

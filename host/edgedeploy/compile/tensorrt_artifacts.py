"""`edgedeploy build --runtime tensorrt`: a bundle the device turns into its own TensorRT engine.

No engine is built here (TensorRT engines depend on the exact TensorRT build, GPU and CUDA; the host
has none of them). The bundle carries what the device needs to build, cache and accept one:
  model.qdq.onnx   the symmetric INT8 Q/DQ model from `quantize.tensorrt_qdq` (zero points 0)
  reference.npz    `input:<name>` / `output:<name>`: a few calibration samples and onnxruntime's
                   outputs of the same Q/DQ model on them (the device's acceptance check)
plus `manifest.tensorrt`: optimisation profiles (min/opt/max per input, from `--batch`), workspace,
builder settings and acceptance tolerances. The bundle carries TensorRT artifacts only (no TVM library);
the FP32 source stays in the host's build store (`manifest.host_files`, written by `card_manifest`).
"""

from __future__ import annotations

import dataclasses
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

from edgedeploy_agent.bundle import (
    Provenance,
    Quantization,
    ShapeProfile,
    TensorRTSettings,
    TensorSpec,
    write_bundle,
)

from .. import __version__
from ..errors import InputError
from ..profiles import DeviceProfile
from .int8_build import Int8Config, calibration_inputs
from .onnx_model import OnnxModel, load_onnx
from .package import BuildResult, ModelCard, _default_name, card_manifest, profile_target, write_labels
from .quantize import tensorrt_qdq

REFERENCE_SAMPLES = 8


@dataclasses.dataclass(frozen=True)
class TensorRTOptions:
    batch: tuple[int, int, int] = (1, 1, 1)
    workspace_mib: int = 1024
    fp16: bool = True
    builder_optimization_level: int = 3
    reference_samples: int = REFERENCE_SAMPLES
    min_top1_agreement: float = 0.9
    atol: float = 0.05


def parse_batch(text: str) -> tuple[int, int, int]:
    """`--batch MIN:OPT:MAX` (or one number N for a fixed batch) as (min, opt, max)."""
    try:
        parts = [int(p) for p in text.split(":")]
    except ValueError:
        raise InputError(f"--batch takes MIN:OPT:MAX (e.g. 1:8:32) or N, got {text!r}") from None
    if len(parts) == 1:
        parts *= 3
    if len(parts) != 3 or not 1 <= parts[0] <= parts[1] <= parts[2]:
        raise InputError(f"--batch {text!r}: need 1 <= MIN <= OPT <= MAX")
    return parts[0], parts[1], parts[2]


def shape_profiles(inputs: list[TensorSpec], batch: tuple[int, int, int]) -> list[list[ShapeProfile]]:
    """One optimisation profile: the batch dimension ranges over `batch`, the other dimensions are fixed."""
    lo, opt, hi = batch
    return [
        [
            ShapeProfile(input=s.name, min=[lo, *s.shape[1:]], opt=[opt, *s.shape[1:]], max=[hi, *s.shape[1:]])
            for s in inputs
        ]
    ]


def _check_dynamic_batch(qdq: onnx.ModelProto, batch: tuple[int, int, int]) -> None:
    if batch == (1, 1, 1):
        return
    for value in qdq.graph.input:
        d = value.type.tensor_type.shape.dim[0]
        if d.HasField("dim_value") and d.dim_value > 0:
            raise InputError(
                f"--batch {batch[0]}:{batch[1]}:{batch[2]}: input {value.name} has a fixed batch of {d.dim_value}",
                hint="export the model with a dynamic batch dimension, or use --batch 1",
            )


def build_tensorrt_bundle(
    model_path: Path,
    profile: DeviceProfile,
    out: Path,
    card: ModelCard,
    int8: Int8Config,
    options: TensorRTOptions,
    progress: Callable[[str], None] = lambda step: None,
) -> BuildResult:
    """Quantize for TensorRT, compute the reference outputs and write the bundle; builds no engine."""
    if profile.device != "cuda":
        raise InputError(f"--runtime tensorrt needs a CUDA profile, {profile.name} is {profile.device}")
    progress("load-model")
    model = load_onnx(model_path)
    timings: dict[str, float] = {}
    t = time.perf_counter()
    progress("calibration-data")
    calib, split = calibration_inputs(model, card.preprocess, int8)
    progress("quantize")
    report = tensorrt_qdq(model.proto, calib, int8.options)
    _check_dynamic_batch(report.model, options.batch)
    timings["quantize_s"] = time.perf_counter() - t
    progress("reference-outputs")
    # Stored as float16 (half the bytes); the outputs are computed on exactly the values the device reads.
    ref_inputs = calib[: options.reference_samples].astype(np.float16).astype(calib.dtype)
    out_names = [o.name for o in report.model.graph.output]
    ref_outputs = _ort_outputs(report.model, model.inputs[0].name, ref_inputs)
    outputs = [
        TensorSpec(name=n, shape=[1, *o.shape[1:]], dtype=str(o.dtype))
        for n, o in zip(out_names, ref_outputs, strict=False)
    ]
    progress("package")
    with tempfile.TemporaryDirectory(prefix="edgedeploy-trt-") as tmp:
        work = Path(tmp)
        files = _write_artifacts(work, model, report.model, ref_inputs, ref_outputs, out_names, card)
        settings = TensorRTSettings(
            onnx="model.qdq.onnx",
            fp16=options.fp16,
            profiles=shape_profiles(model.inputs, options.batch),
            workspace_bytes=options.workspace_mib << 20,
            builder_optimization_level=options.builder_optimization_level,
            reference="reference.npz",
            min_top1_agreement=options.min_top1_agreement,
            atol=options.atol,
        )
        o = report.options
        manifest = card_manifest(
            card,
            model,
            card.name or _default_name(model_path),
            profile,
            profile_target(profile, runtime="tensorrt", runtime_abi=f"tensorrt-{profile.platform.tensorrt or 'any'}"),
            outputs,
            files,
            Quantization(
                precision="int8",
                method=o.method + (f"(percentile={o.percentile})" if o.method == "percentile" else ""),
                calibration_samples=report.samples,
                float_layers=report.float_layers,
                calibration=f"{int8.calibration.resolve()} (split: {split})",
                options={"symmetric_activations": "true", "per_channel": "true", "producer": "tensorrt_qdq"},
            ),
            Provenance(
                tools={
                    "edgedeploy": __version__,
                    "python": platform.python_version(),
                    "onnx": onnx.__version__,
                    "onnxruntime": _ort_version(),
                },
                build_host=f"{platform.node()} ({platform.machine()})",
                options={"runtime": "tensorrt", "batch": ":".join(map(str, options.batch))},
            ),
            tensorrt=settings,
        )
        write_bundle(out, manifest, files)
    timings["total_s"] = time.perf_counter() - t
    return BuildResult(out, manifest, cached=False, timings={k: round(v, 3) for k, v in timings.items()})


def _write_artifacts(
    work: Path,
    model: OnnxModel,
    qdq: onnx.ModelProto,
    ref_inputs: np.ndarray,
    ref_outputs: list[np.ndarray],
    out_names: list[str],
    card: ModelCard,
) -> dict[str, Path]:
    files = {"model.qdq.onnx": work / "model.qdq.onnx", "reference.npz": work / "reference.npz"}
    onnx.save(qdq, files["model.qdq.onnx"])
    arrays = {f"input:{model.inputs[0].name}": ref_inputs.astype(np.float16)}
    arrays.update({f"output:{n}": o for n, o in zip(out_names, ref_outputs, strict=False)})
    with open(files["reference.npz"], "wb") as f:
        # numpy's stub types **kwds as the allow_pickle flag; the arrays are plain float arrays
        np.savez_compressed(f, **arrays)  # type: ignore[arg-type]
    write_labels(work, card, files)
    return files


def _ort_outputs(qdq: onnx.ModelProto, input_name: str, x: np.ndarray) -> list[np.ndarray]:
    """onnxruntime with its default graph optimizations: Q/DQ pairs fuse into integer kernels
    (QLinearConv), which is closer to what a TensorRT INT8 engine computes than float fake-quant."""
    import onnxruntime as ort

    sess = ort.InferenceSession(qdq.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.asarray(o) for o in sess.run(None, {input_name: x})]


def _ort_version() -> str:
    import onnxruntime

    return str(onnxruntime.__version__)

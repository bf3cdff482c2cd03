"""`edgedeploy build --runtime tensorrt`: a bundle the device turns into its own TensorRT engine.

No engine is built here (TensorRT engines depend on the exact TensorRT build, GPU and CUDA; the host
has none of them). The bundle carries what the device needs to build, cache and accept one:
  model.qdq.onnx   the symmetric INT8 Q/DQ model from `quantize.tensorrt_qdq` (zero points 0)
  reference.npz    `input:<name>` / `output:<name>`: a few calibration samples and the exact INT8
                   reference outputs of the same Q/DQ model on them (qdq_reference.py; the device's
                   acceptance check: a TensorRT engine computes integer arithmetic, so it is compared
                   with exact integer arithmetic, never with onnxruntime's CPU-dependent INT8 kernels)
plus `manifest.tensorrt`: optimisation profiles (min/opt/max per input, from `--batch`), workspace,
builder settings and acceptance tolerances. The bundle carries TensorRT artifacts only (no TVM library);
the FP32 source stays in the host's build store (`manifest.host_files`, written by `card_manifest`).

The build refuses a bundle whose reference outputs are not a usable INT8 version of the model: their top-1
must agree with the FP32 model's on at least `min_reference_agreement` of up to 64 calibration samples, and
the manifest records what it measured (`tensorrt.reference_fp32_top1_agreement`, `reference_fp32_samples`).
The device accepts an engine whose top-1 agrees with the reference on `min_top1_agreement` of the shipped
samples and whose outputs stay within `atol` of it: the distance of the FP32 model from the reference on
those samples (the thresholds and the measurements behind them are next to their definitions below).
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
from ..errors import InputError, ModelError
from ..profiles import DeviceProfile
from .cards import ModelCard, default_name
from .frontends.onnx_model import OnnxModel, check_preprocess, implied_color, load_onnx
from .int8.build import Int8Config, calibration_inputs
from .int8.qdq_reference import reference_outputs
from .int8.quantize import run_tensors, tensorrt_qdq
from .manifest import BuildResult, card_manifest, profile_target, write_labels

REFERENCE_SAMPLES = 8
# The build-time gate, on up to GATE_SAMPLES calibration samples: the exact INT8 reference must give the FP32
# model's top-1 on at least MIN_REFERENCE_AGREEMENT of them. bench/int8_reference_spread.py measured 72-86 %
# exact-vs-FP32 agreement for MobileNetV1-0.25 (symmetric and asymmetric recipes), a small network that loses
# much to INT8, with chunks of 8 images as low as 37.5-50 % (hence more samples than the 8 shipped); a model
# with activations clipped at their median is refused (tests/host/test_tensorrt_artifacts.py).
GATE_SAMPLES = 64
MIN_REFERENCE_AGREEMENT = 0.6
# The device's acceptance of an engine (agent runtime/acceptance.py) on the 8 shipped samples. Measured
# against the exact reference on 500 images: an integer INT8 engine (onnxruntime's VNNI kernels) agrees on
# 98.3-100 % of the images, a float32 fake-quant run on 95.7-97.8 %. Binomial arithmetic on those rates (not
# a measurement): a correct engine misses 0.75 (3 of 8 wrong) with probability below 0.5 %, while 0.9 (any
# miss) would reject about one correct engine in ten. A broken engine agrees on about 0 %.
MIN_ENGINE_AGREEMENT = 0.75


class ReferenceGateError(ModelError):
    """The INT8 reference outputs disagree with the FP32 model: the Q/DQ model is not worth shipping."""


@dataclasses.dataclass(frozen=True)
class TensorRTOptions:
    batch: tuple[int, int, int] = (1, 1, 1)
    workspace_mib: int = 1024
    fp16: bool = True
    builder_optimization_level: int = 3
    reference_samples: int = REFERENCE_SAMPLES
    min_top1_agreement: float = MIN_ENGINE_AGREEMENT
    min_reference_agreement: float = MIN_REFERENCE_AGREEMENT


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
    card = card.model_copy(update={"preprocess": implied_color(model, card.preprocess)})
    check_preprocess(model, card.preprocess)
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
    gate_inputs = calib[:GATE_SAMPLES].astype(np.float16).astype(calib.dtype)
    exact = reference_outputs(report.model, gate_inputs)
    fp32 = run_tensors(model.proto, gate_inputs, [o.name for o in model.proto.graph.output])
    gate = _reference_gate(exact[0], fp32[0], options.min_reference_agreement)
    n = options.reference_samples
    ref_inputs, ref_outputs = gate_inputs[:n], [o[:n] for o in exact]
    out_names = [o.name for o in report.model.graph.output]
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
            atol=_acceptance_atol(ref_outputs, [o[:n] for o in fp32]),
            reference_fp32_top1_agreement=gate,
            reference_fp32_samples=len(gate_inputs),
        )
        o = report.options
        manifest = card_manifest(
            card,
            model,
            card.name or default_name(model_path),
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


def _reference_gate(exact: np.ndarray, fp32: np.ndarray, minimum: float) -> float:
    """Top-1 agreement of the exact INT8 outputs with the FP32 model's; below `minimum` the build stops
    (ReferenceGateError, exit 2) before anything is written."""
    n = len(exact)
    same = int(np.sum(np.argmax(fp32.reshape(n, -1), axis=1) == np.argmax(exact.reshape(n, -1), axis=1)))
    agreement = same / n
    if agreement < minimum:
        raise ReferenceGateError(
            f"the INT8 model's top-1 agrees with the FP32 model's on only {same} of {n} reference samples "
            f"({agreement:.0%}, the build needs {minimum:.0%}): a TensorRT engine of it would be wrong",
            hint="calibrate on images like the deployment's (--calibration, with the model's preprocessing), "
            "try --method percentile or entropy, or keep sensitive layers in float (--keep-float first-last)",
        )
    return round(agreement, 4)


def _acceptance_atol(exact: list[np.ndarray], fp32: list[np.ndarray]) -> float:
    """The engine may differ from the exact INT8 outputs by as much as the FP32 model does on the reference
    samples (an engine further off is not computing this model), and by at least 1 % of the outputs' range.
    Measured on MobileNetV1-0.25 softmax outputs over 500 images: an integer engine stays within 0.065 of the
    exact reference, FP32 is up to 0.23-0.34 away (bench/int8_reference_spread.py)."""
    gap = max(float(np.abs(e.astype(np.float64) - f).max()) for e, f in zip(exact, fp32, strict=True))
    floor = 0.01 * max(float(np.abs(e).max()) for e in exact)
    return round(max(gap, floor), 6)


def _ort_version() -> str:
    import onnxruntime

    return str(onnxruntime.__version__)

"""The INT8 part of a build: calibrate, quantize to QDQ, measure, gate, and fall back layer by layer.

INT8 accuracy is that of the exact reference of the Q/DQ model (qdq_reference.py), never onnxruntime's
INT8 kernels, whose results depend on the build host's CPU.
Calibration and evaluation never share an image: when both come from one folder, calibration uses the
`calibration` half and evaluation the `evaluation` half of `datasets.split_of` (a hash of the file name).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from edgedeploy_agent.bundle import Preprocess

from ...errors import BuildError
from ..frontends.onnx_model import OnnxModel
from .datasets import LabeledSet, Split, load_calibration, load_labeled
from .evaluate import Comparison, OrtClassifier, compare
from .qdq_reference import QdqReference
from .quantize import QuantizeOptions, QuantizeReport, quantize_qdq, run_tensors


class AccuracyGateError(BuildError):
    """The INT8 model loses more top-1 accuracy than the build allows."""


@dataclass(frozen=True)
class Int8Config:
    calibration: Path
    options: QuantizeOptions = field(default_factory=QuantizeOptions)
    eval_data: Path | None = None
    eval_limit: int | None = None
    synsets: Path | None = None
    max_top1_drop: float | None = None
    auto_fallback: bool = False
    label_offset: int = 0

    def splits(self) -> tuple[Split, Split]:
        """(calibration split, evaluation split): calibration always reads the calibration half (all of a
        source without halves), so a later `edgedeploy eval` on the same folder, which skips that half, scores
        only photos the build never saw; evaluation reads the other half of the same folder, or all of
        another."""
        same = self.eval_data is not None and self.eval_data.resolve() == self.calibration.resolve()
        return ("calibration", "evaluation" if same else "all")

    def describe(self) -> dict[str, Any]:
        o = self.options
        return {
            "method": o.method + (f"({o.percentile})" if o.method == "percentile" else ""),
            "per_channel": o.per_channel,
            "symmetric_activations": o.symmetric_activations,
            "power_of_two": o.power_of_two,
            "equalize": o.equalize,
            "bias_correction": o.bias_correction,
            "refine": o.refines,
            "keep_float": list(o.keep_float),
            "samples": o.samples,
            "calibration": str(self.calibration),
            "eval": str(self.eval_data) if self.eval_data else None,
            "max_top1_drop": self.max_top1_drop,
            "auto_fallback": self.auto_fallback,
        }


@dataclass
class Int8Result:
    qdq: onnx.ModelProto
    report: QuantizeReport
    calibration_sha256: str
    calibration_split: str
    comparison: Comparison | None = None
    eval_split: str | None = None
    fallback_tried: list[str] = field(default_factory=list)

    def accuracy(self) -> dict[str, float]:
        if self.comparison is None:
            return {}
        c = self.comparison.as_dict()
        return {
            "fp32_top1": c["fp32"]["top1"],
            "fp32_top5": c["fp32"]["top5"],
            "int8_top1": c["int8"]["top1"],
            "int8_top5": c["int8"]["top5"],
            "top1_drop": c["top1_drop"],
            "top1_agreement": c["top1_agreement"],
            "eval_images": float(c["images"]),
        }


def calibration_inputs(model: OnnxModel, pp: Preprocess, cfg: Int8Config) -> tuple[np.ndarray, str]:
    split, _ = cfg.splits()
    return load_calibration(cfg.calibration, pp, model.inputs[0], cfg.options.samples, split), split


def quantize_model(
    model: OnnxModel,
    pp: Preprocess,
    cfg: Int8Config,
    calib: np.ndarray,
    progress: Callable[[str], None] = lambda s: None,
) -> Int8Result:
    """QDQ model for `model`; measured and gated when `cfg.eval_data` is set."""
    calib_split, eval_split = cfg.splits()
    progress("quantize")
    report = quantize_qdq(model.proto, calib, cfg.options, progress)
    result = Int8Result(report.model, report, hashlib.sha256(calib.tobytes()).hexdigest(), calib_split)
    if cfg.eval_data is None:
        return result
    progress("evaluate")
    data = load_labeled(cfg.eval_data, pp, model.inputs[0], eval_split, cfg.eval_limit, cfg.synsets)
    fp32 = OrtClassifier(model.proto)
    result.comparison = compare(fp32, QdqReference(report.model), data, cfg.label_offset)
    result.eval_split = eval_split
    if result.comparison.fp32.top1 == 0.0:  # a gate measured on nonsense would pass every time
        raise AccuracyGateError(
            f"the FP32 model scores 0% top-1 on {len(data)} images of {cfg.eval_data}: its preprocessing or label "
            "offset does not match these labels, so INT8 accuracy cannot be judged",
            hint="give --card (preprocessing, label_offset) or the preprocessing flags",
        )
    if cfg.max_top1_drop is None or result.comparison.drop <= cfg.max_top1_drop:
        return result
    if not cfg.auto_fallback:
        raise _gate_error(result.comparison, cfg, data)
    return _fallback(model, cfg, calib, data, fp32, result, progress)


def _gate_error(c: Comparison, cfg: Int8Config, data: LabeledSet) -> AccuracyGateError:
    return AccuracyGateError(
        f"INT8 top-1 drops {c.drop:.2f} points (FP32 {c.fp32.top1:.2f}%, INT8 {c.int8.top1:.2f}% on {len(data)} "
        f"images of {cfg.eval_data}), more than the allowed {cfg.max_top1_drop}",
        hint="add --auto-fallback to keep the most sensitive layers in float, or --keep-float LAYER, "
        "or try --method entropy|percentile",
    )


def layer_sensitivity(model: OnnxModel, cfg: Int8Config, calib: np.ndarray) -> list[tuple[str, float]]:
    """Each quantized layer with the output error left when it alone stays float (lower = more sensitive)."""
    sample = calib[:32]
    out_name = model.proto.graph.output[0].name
    ref = run_tensors(model.proto, sample, [out_name])[0]
    # ranked without the layer-wise refinement, which would take minutes per layer; the fallback itself refines
    plain = replace(cfg.options, refine=False)
    base = quantize_qdq(model.proto, calib, plain)
    errors = []
    for layer in base.quantized_layers:
        opts = replace(plain, keep_float=(*plain.keep_float, layer))
        q = quantize_qdq(model.proto, calib, opts).model
        got = run_tensors(q, sample, [out_name])[0]
        errors.append((layer, float(np.mean((got - ref) ** 2))))
    return sorted(errors, key=lambda e: e[1])


def _fallback(
    model: OnnxModel,
    cfg: Int8Config,
    calib: np.ndarray,
    data: LabeledSet,
    fp32: OrtClassifier,
    result: Int8Result,
    progress: Callable[[str], None],
) -> Int8Result:
    """Keep the fewest most-sensitive layers in float until the gate passes."""
    progress("sensitivity")
    ranked = [name for name, _ in layer_sensitivity(model, cfg, calib)]
    kept: list[str] = []
    for layer in ranked:
        kept.append(layer)
        progress(f"fallback: {len(kept)} float layer(s)")
        opts = QuantizeOptions(**{**cfg.options.__dict__, "keep_float": (*cfg.options.keep_float, *kept)})
        report = quantize_qdq(model.proto, calib, opts)
        cmp = compare(fp32, QdqReference(report.model), data, cfg.label_offset)
        if cfg.max_top1_drop is not None and cmp.drop <= cfg.max_top1_drop:
            result.qdq, result.report, result.comparison, result.fallback_tried = report.model, report, cmp, list(kept)
            return result
    raise AccuracyGateError(
        f"INT8 top-1 drop stays above {cfg.max_top1_drop} points even with all {len(ranked)} layers in float",
        hint="check the preprocessing (--card) and the labels of the evaluation set",
    )

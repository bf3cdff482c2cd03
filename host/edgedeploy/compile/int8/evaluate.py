"""Accuracy on a labeled set: top-1, top-5 and top-1 agreement between runtimes of one model.

A classifier is anything with `predict(batch) -> scores`: onnxruntime on an FP32 ONNX model, the exact
INT8 reference of a Q/DQ model (compile/int8/qdq_reference.py: the same on every build host, unlike
onnxruntime's CPU-dependent INT8 kernels), or the TVM library of a bundle, run through the agent's own runtime.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnx

from edgedeploy_agent.bundle import Manifest, Preprocess, extract_bundle

from ...build_store import has_file, host_file
from ...errors import InputError, ModelError, agent_input
from .datasets import LabeledSet


class Classifier(Protocol):
    def predict(self, batch: np.ndarray) -> np.ndarray: ...


class OrtClassifier:
    """onnxruntime on the CPU; the model's first input and first output."""

    def __init__(self, model: onnx.ModelProto | Path, threads: int = 0) -> None:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.log_severity_level = 3
        data = model.read_bytes() if isinstance(model, Path) else model.SerializeToString()
        try:
            self.session = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime raises its own Fail/InvalidGraph types
            raise ModelError(f"onnxruntime cannot load the model: {str(e).splitlines()[0]}") from None
        self.input = self.session.get_inputs()[0].name
        dims = self.session.get_inputs()[0].shape
        self.batch = dims[0] if isinstance(dims[0], int) else 32

    def predict(self, batch: np.ndarray) -> np.ndarray:
        outs = [
            self.session.run(None, {self.input: batch[i : i + self.batch]})[0] for i in range(0, len(batch), self.batch)
        ]
        return np.concatenate(outs).reshape(len(batch), -1)


class TvmBundleClassifier:
    """The bundle's TVM library through the agent runtime (the code a device runs), batch 1."""

    def __init__(self, release_dir: Path, manifest: Manifest) -> None:
        from edgedeploy_agent.runtime.tvm import TvmRuntime

        with agent_input():
            self.runtime = TvmRuntime(release_dir, manifest)

    def predict(self, batch: np.ndarray) -> np.ndarray:
        return np.concatenate([self.runtime.run([batch[i : i + 1]])[0].reshape(1, -1) for i in range(len(batch))])


@contextmanager
def unpacked(bundle: Path) -> Iterator[tuple[Path, Manifest]]:
    with tempfile.TemporaryDirectory(prefix="edgedeploy-eval-") as tmp:
        with agent_input():
            manifest = extract_bundle(bundle, Path(tmp) / "release")
        yield Path(tmp) / "release", manifest


@dataclass
class Scores:
    top1: float
    top5: float
    predictions: np.ndarray
    outputs: np.ndarray | None = None  # the raw first outputs, [N, -1]

    def as_dict(self) -> dict[str, float]:
        return {"top1": round(self.top1, 2), "top5": round(self.top5, 2)}


def score(clf: Classifier, data: LabeledSet, label_offset: int = 0) -> Scores:
    """Top-1/top-5 in percent; output index minus `label_offset` is the class index."""
    if len(data) == 0:
        raise InputError(f"evaluation set {data.name} is empty")
    raw = clf.predict(data.inputs)
    data.check_fits(raw.shape[1], label_offset, "the model")
    out = raw.astype(np.float64)  # -x of a uint8 output (a quantized TFLite model's) would wrap around
    top5 = np.argsort(-out, axis=1, kind="stable")[:, :5] - label_offset
    hits1 = top5[:, 0] == data.labels
    hits5 = (top5 == data.labels[:, None]).any(axis=1)
    return Scores(float(hits1.mean() * 100), float(hits5.mean() * 100), top5[:, 0], raw)


def agreement(a: Scores, b: Scores) -> float:
    """Percent of samples where both give the same top-1 class."""
    return float((a.predictions == b.predictions).mean() * 100)


@dataclass
class Comparison:
    """FP32 reference against an INT8 candidate on one labeled set."""

    images: int
    fp32: Scores
    int8: Scores

    @property
    def drop(self) -> float:
        return self.fp32.top1 - self.int8.top1

    def as_dict(self) -> dict[str, Any]:
        return {
            "images": self.images,
            "fp32": self.fp32.as_dict(),
            "int8": self.int8.as_dict(),
            "top1_drop": round(self.drop, 2),
            "top1_agreement": round(agreement(self.fp32, self.int8), 2),
        }


def compare(fp32: Classifier, int8: Classifier, data: LabeledSet, label_offset: int) -> Comparison:
    return Comparison(len(data), score(fp32, data, label_offset), score(int8, data, label_offset))


def evaluate_target(
    target: Path,
    data: Path,
    card_pre: Any = None,
    label_offset: int = 0,
    split: str = "auto",
    limit: int | None = None,
    synsets: Path | None = None,
    sources: Sequence[Path] = (),
) -> dict[str, Any]:
    """Accuracy of a bundle (its TVM library, its FP32 source via onnxruntime and, for INT8, the exact
    reference of its Q/DQ model) or of an ONNX model. A bundle's source and QDQ model come from the build
    store, or `sources` (build_store.host_file)."""
    from ..frontends.onnx_model import check_preprocess, implied_color, load_onnx
    from .datasets import load_labeled
    from .qdq_reference import QdqReference

    if not target.is_file():
        raise InputError(f"{target} does not exist")
    if target.suffix == ".onnx":
        model = load_onnx(target)
        pp = implied_color(model, card_pre if card_pre is not None else Preprocess())
        check_preprocess(model, pp)
        chosen = "all" if split == "auto" else split
        labeled = load_labeled(data, pp, model.inputs[0], chosen, limit, synsets)  # type: ignore[arg-type]
        width = _width([d.dim_value if d.HasField("dim_value") else 0 for d in _output_dims(model.proto)])
        if width:
            labeled.check_fits(width, label_offset, target.name)  # before anything is run
        s = score(OrtClassifier(model.proto), labeled, label_offset)
        return {
            "model": str(target),
            "data": str(data),
            "split": chosen,
            "images": len(labeled),
            "onnxruntime": s.as_dict(),
        }
    with unpacked(target) as (release, manifest):
        q = manifest.quantization
        chosen = split
        if split == "auto":
            calibrated_here = q.calibration is not None and q.calibration.rsplit(" (split", 1)[0] == str(data.resolve())
            chosen = "evaluation" if calibrated_here else "all"
        labeled = load_labeled(data, manifest.preprocess, manifest.inputs[0], chosen, limit, synsets)  # type: ignore[arg-type]
        offset = manifest.postprocess.label_offset
        width = _width(manifest.outputs[0].shape) if manifest.outputs else None
        if width:
            labeled.check_fits(width, offset, f"bundle {target.name}")  # before the library runs
        tvm = score(TvmBundleClassifier(release, manifest), labeled, offset)
        out: dict[str, Any] = {
            "bundle": str(target),
            "precision": q.precision,
            "data": str(data),
            "split": chosen,
            "images": len(labeled),
            "tvm_bundle": tvm.as_dict(),
        }
        foreign = next((h for h in manifest.host_files if h.role in ("tflite-model", "torch-program")), None)
        if foreign is not None:
            source = host_file(manifest, foreign.role, release, sources)
            return out | _foreign_reference(foreign.role, source, tvm, labeled, offset)
        fp32 = score(OrtClassifier(host_file(manifest, "onnx-model", release, sources)), labeled, offset)
        out |= {
            "fp32_onnxruntime": fp32.as_dict(),
            "top1_drop": round(fp32.top1 - tvm.top1, 2),
            "top1_agreement_fp32_vs_bundle": round(agreement(fp32, tvm), 2),
        }
        if has_file(manifest, "qdq-onnx"):
            qdq_model = onnx.load(host_file(manifest, "qdq-onnx", release, sources))
            qdq = score(QdqReference(qdq_model), labeled, offset)
            out["int8_reference"] = qdq.as_dict()
            out["top1_agreement_fp32_vs_int8_reference"] = round(agreement(fp32, qdq), 2)
            out["top1_agreement_bundle_vs_int8_reference"] = round(agreement(tvm, qdq), 2)
            out["float_layers"] = q.float_layers
            out["float_in_runtime"] = q.float_in_runtime
        return out


def _output_dims(proto: onnx.ModelProto) -> list[Any]:
    return list(proto.graph.output[0].type.tensor_type.shape.dim) if proto.graph.output else []


def _width(shape: Sequence[int]) -> int | None:
    """Scores per sample of a [N, ...] output; None where a dimension is not static."""
    dims = list(shape[1:]) if len(shape) > 1 else list(shape)
    if not dims or any(d <= 0 for d in dims):
        return None
    return int(np.prod(dims))


def _foreign_reference(role: str, source: Path, tvm: Scores, labeled: LabeledSet, offset: int) -> dict[str, Any]:
    """The bundle against its source's own runtime (TFLite interpreter, PyTorch) on the same inputs: top-1,
    top-1 agreement, and how far the outputs are apart (for a quantized model: identical bytes or not)."""
    from ...references import reference_for

    clf, why = reference_for(role, source)
    if clf is None:
        return {"reference": None, "reference_missing": why}
    ref = score(clf, labeled, offset)
    assert ref.outputs is not None and tvm.outputs is not None
    diff = np.abs(ref.outputs.astype(np.float64) - tvm.outputs.astype(np.float64)).reshape(len(labeled), -1)
    return {
        "reference": clf.name,
        clf.name: ref.as_dict(),
        "top1_agreement_bundle_vs_reference": round(agreement(tvm, ref), 2),
        "outputs_identical_images": int((diff.max(axis=1) == 0).sum()),
        "max_abs_output_difference": float(diff.max()),
    }

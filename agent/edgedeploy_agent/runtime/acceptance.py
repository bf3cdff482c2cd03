"""Acceptance of a new TensorRT engine: its outputs on the bundle's reference samples vs the exact INT8 reference.

The reference file (`TensorRTSettings.reference`) is an .npz written by the host with `input:<name>` and
`output:<name>` arrays, one row per sample. The check is plain numpy rather than Polygraphy's Comparator
because it needs top-1 agreement (which the Comparator does not compute) and must run the same with any
runtime, including the test double that stands in for TensorRT where it cannot be installed.
"""

from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..bundle import Manifest, TensorRTSettings
from ..errors import BundleError


class References:
    """Reference inputs and exact INT8 reference outputs, in the manifest's input/output order."""

    def __init__(self, inputs: list[np.ndarray], outputs: list[np.ndarray]) -> None:
        self.inputs, self.outputs = inputs, outputs

    @property
    def samples(self) -> int:
        return int(self.inputs[0].shape[0])


def load_references(path: Path, manifest: Manifest) -> References:
    try:
        with np.load(path, allow_pickle=False) as z:
            inputs = [z[f"input:{s.name}"].astype(s.dtype) for s in manifest.inputs]
            outputs = [z[f"output:{s.name}"] for s in manifest.outputs]
    except (OSError, KeyError, ValueError) as e:
        raise BundleError(f"reference samples {path.name} are unreadable: {e}") from None
    return References(inputs, outputs)


def run_references(
    run: Callable[[list[np.ndarray]], list[np.ndarray]], refs: References, batch: int
) -> list[np.ndarray]:
    """Run every reference sample, `batch` rows at a time, and stack the outputs."""
    chunks: list[list[np.ndarray]] = []
    for start in range(0, refs.samples, batch):
        chunks.append(run([x[start : start + batch] for x in refs.inputs]))
    return [np.concatenate([c[i] for c in chunks]) for i in range(len(refs.outputs))]


def compare(got: list[np.ndarray], refs: References, settings: TensorRTSettings) -> dict[str, Any]:
    """Top-1 agreement on the first output and the worst |got - want| over all outputs, with a verdict."""
    want = refs.outputs
    n = refs.samples
    g0, w0 = got[0].reshape(n, -1), want[0].reshape(n, -1)
    agreement = float(np.mean(np.argmax(g0, axis=1) == np.argmax(w0, axis=1))) if n else 0.0
    worst, within = 0.0, True
    for g, w in zip(got, want):
        if g.shape != w.shape:
            return {"passed": False, "reason": f"output shape {list(g.shape)} != reference {list(w.shape)}"}
        diff = np.abs(g.astype(np.float64) - w.astype(np.float64))
        worst = max(worst, float(diff.max()) if diff.size else 0.0)
        within = within and bool(np.all(diff <= settings.atol + settings.rtol * np.abs(w)))
    result: dict[str, Any] = {
        "samples": n,
        "top1_agreement": round(agreement, 4),
        "max_abs_error": round(worst, 6),
        "atol": settings.atol,
        "rtol": settings.rtol,
        "min_top1_agreement": settings.min_top1_agreement,
    }
    reasons = []
    if agreement < settings.min_top1_agreement:
        reasons.append(f"top-1 agreement {agreement:.3f} < {settings.min_top1_agreement}")
    if not within:
        reasons.append(f"max |error| {worst:.4g} exceeds atol {settings.atol} + rtol {settings.rtol}")
    result["passed"] = not reasons
    if reasons:
        result["reason"] = "; ".join(reasons)
    return result

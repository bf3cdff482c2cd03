"""What every frontend shares: the model types other than ONNX, file suffixes and source roles, output specs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgedeploy_agent.bundle import TensorSpec

from ...errors import ModelError

# file suffix -> frontend name (the pipeline key suffix and the import stage's name)
FRONTENDS = {".onnx": "onnx", ".tflite": "tflite", ".pt2": "torch"}


# frontend -> the build-store role of the source file (manifest.host_files)
SOURCE_ROLES = {"onnx": "onnx-model", "tflite": "tflite-model", "torch": "torch-program"}


FRONTEND_HINT = (
    "edgedeploy build takes .onnx, .tflite, or .pt2 (torch.export.save of an ExportedProgram); "
    "see docs/troubleshooting.md#models"
)


@dataclass(frozen=True)
class ForeignModel:
    """A source model that is not ONNX: its bytes, digest and input specs; its import stage reads `path`."""

    path: Path
    sha256: str
    inputs: list[TensorSpec]
    frontend: str  # "tflite" | "torch"
    quantized: bool = False  # a pre-quantized (QAT) model: its own INT8 scales, no calibration

    @property
    def graph_sha256(self) -> str:
        """Names its tuning databases: the file's digest (its weights are not told apart from its graph here,
        as onnx_model.graph_digest does for ONNX; a retrained TFLite or PyTorch model is tuned again)."""
        return self.sha256


def import_failure(e: Exception) -> str:
    """The last non-empty line of a TVM frontend's exception (they raise many types, with long traces)."""
    lines = [line for line in str(e).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(e).__name__


def output_specs(mod: Any, names: list[str]) -> list[TensorSpec]:
    """The outputs of `mod["main"]` with static shapes, named after the source model's outputs."""
    from tvm import relax

    ret = mod["main"].ret_ty
    infos = list(ret.fields) if isinstance(ret, relax.TupleType) else [ret]
    specs = []
    for i, info in enumerate(infos):
        name = names[i] if i < len(names) else f"output{i}"
        if not isinstance(info, relax.TensorType) or info.shape is None:
            raise ModelError(f"output {name} of the model has no static tensor shape")
        try:
            shape = [int(d) for d in info.shape.values]
        except TypeError:
            raise ModelError(f"output {name} has a symbolic shape") from None
        specs.append(TensorSpec(name=name, shape=shape, dtype=str(info.dtype), layout=guess_layout(shape)))
    return specs


def guess_layout(shape: list[int]) -> str | None:
    if len(shape) != 4:
        return None
    if shape[1] in (1, 3) and shape[3] not in (1, 3):
        return "NCHW"
    if shape[3] in (1, 3):
        return "NHWC"
    return "NCHW"

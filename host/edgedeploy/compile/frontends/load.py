"""Which frontend reads a model file: chosen by its type, each giving the inputs the rest of the build needs.

ONNX models are `onnx_model.OnnxModel` (the INT8 calibration, TensorRT and the exact INT8 reference work on
them). TFLite flatbuffers (`tflite_model.py`) and PyTorch `torch.export` programs (`torch_model.py`) are
`ForeignModel`s: their own import stage turns them into Relax, and the rest of the pipeline is shared.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgedeploy_agent.bundle import TensorSpec

from ...errors import ModelError
from .onnx_model import OnnxModel, guess_layout, load_onnx

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


def frontend_of(path: Path) -> str:
    """The frontend for a model file, from its suffix; unknown types are one line listing the known ones."""
    frontend = FRONTENDS.get(path.suffix.lower())
    if frontend is None:
        raise ModelError(f"{path}: unknown model type {path.suffix or '(no suffix)'!r}", hint=FRONTEND_HINT)
    return frontend


def load_model(path: Path, batch: int = 1, frontend: str | None = None) -> OnnxModel | ForeignModel:
    """Read a model file with the frontend its type names (ONNX, TFLite or a PyTorch ExportedProgram), or
    with `frontend` (a build-store file has no suffix)."""
    if not path.is_file():
        raise ModelError(f"model file {path} does not exist")
    frontend = frontend or frontend_of(path)
    if frontend == "tflite":
        from .tflite_model import load_tflite

        return load_tflite(path, batch)
    if frontend == "torch":
        from .torch_model import load_exported_program

        return load_exported_program(path, batch)
    return load_onnx(path, batch)


def frontend_name(model: OnnxModel | ForeignModel) -> str:
    return model.frontend if isinstance(model, ForeignModel) else "onnx"


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

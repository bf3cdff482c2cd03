"""Which frontend reads a model file: chosen by its type, each giving the inputs the rest of the build needs.

ONNX models are `onnx_model.OnnxModel` (the INT8 calibration, TensorRT and the exact INT8 reference work on
them). TFLite flatbuffers (`tflite_model.py`) and PyTorch `torch.export` programs (`torch_model.py`) are
`ForeignModel`s: their own import stage turns them into Relax, and the rest of the pipeline is shared.
"""

from __future__ import annotations

from pathlib import Path

from ...errors import ModelError
from .model import FRONTEND_HINT, FRONTENDS, ForeignModel
from .onnx_model import OnnxModel, load_onnx


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

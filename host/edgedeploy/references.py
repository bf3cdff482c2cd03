"""Reference runtimes for bundles built from non-ONNX sources: the TFLite interpreter and PyTorch itself.

Both are optional host-side packages (`pip install 'edgedeploy[litert]'`, `'edgedeploy[torch]'`), never the
agent's. `reference_for(role, path)` gives the classifier for a bundle's source file, or None (with the
reason) when the package is missing, so `edgedeploy eval` still reports the bundle's own accuracy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .errors import ModelError


class TfliteInterpreterClassifier:
    """ai-edge-litert's interpreter with TFLite's reference kernels (BUILTIN_REF: the arithmetic the TFLite
    spec defines; the default XNNPACK delegate requantizes its own way), batch 1, first input and output."""

    name = "tflite_interpreter"

    def __init__(self, path: Path) -> None:
        from ai_edge_litert.interpreter import Interpreter, OpResolverType

        try:
            self.interpreter = Interpreter(
                model_path=str(path), experimental_op_resolver_type=OpResolverType.BUILTIN_REF
            )
            self.interpreter.allocate_tensors()
        except Exception as e:  # the interpreter raises ValueError/RuntimeError with multi-line text
            raise ModelError(f"the TFLite interpreter cannot load {path}: {str(e).splitlines()[0]}") from None
        self.input = self.interpreter.get_input_details()[0]["index"]
        self.output = self.interpreter.get_output_details()[0]["index"]

    def predict(self, batch: np.ndarray) -> np.ndarray:
        outs = []
        for i in range(len(batch)):
            self.interpreter.set_tensor(self.input, batch[i : i + 1])
            self.interpreter.invoke()
            outs.append(self.interpreter.get_tensor(self.output).reshape(1, -1).copy())
        return np.concatenate(outs)


class TorchProgramClassifier:
    """The ExportedProgram run by PyTorch on the CPU, batch 1, first output."""

    name = "pytorch"

    def __init__(self, path: Path) -> None:
        import torch

        self.torch = torch
        self.module = torch.export.load(str(path)).module()

    def predict(self, batch: np.ndarray) -> np.ndarray:
        outs = []
        with self.torch.no_grad():
            for i in range(len(batch)):
                out = self.module(self.torch.from_numpy(np.ascontiguousarray(batch[i : i + 1])))
                first = out[0] if isinstance(out, (tuple, list)) else out
                outs.append(first.numpy().reshape(1, -1))
        return np.concatenate(outs)


_PACKAGES = {"tflite-model": ("ai_edge_litert", "litert"), "torch-program": ("torch", "torch")}


def reference_for(role: str, path: Path) -> tuple[Any | None, str | None]:
    """(classifier, None), or (None, why not) when the reference runtime is not installed."""
    import importlib.util

    module, extra = _PACKAGES[role]
    if importlib.util.find_spec(module) is None:
        return None, f"{module} is not installed: pip install 'edgedeploy[{extra}]' to compare against it"
    if role == "tflite-model":
        return TfliteInterpreterClassifier(path), None
    return TorchProgramClassifier(path), None

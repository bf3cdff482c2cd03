"""The PyTorch peer of the GPU benchmark (bench/onnx_torch.py) compiles into one graph and computes what
onnxruntime computes; the ResNet-18 generator's file loads back into the same architecture. Needs torch
(not a dependency of edgedeploy: skipped without it); runs on the CPU with dynamo's eager backend."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from onnx_torch import OnnxModule  # noqa: E402
from resnet18_onnx import export, torchvision_from_onnx  # noqa: E402


def _ort(path: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {session.get_inputs()[0].name: x})[0])


def test_peer_is_one_graph_and_equals_onnxruntime(data_dir: Path) -> None:
    path = data_dir / "models" / "mobilenet_v1_0.25_224.onnx"
    x = np.random.default_rng(0).uniform(-1, 1, (2, 3, 224, 224)).astype(np.float32)
    torch._dynamo.reset()
    compiled = torch.compile(OnnxModule(str(path)).eval(), backend="eager", fullgraph=True)  # a break raises
    with torch.no_grad():
        got = compiled(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, _ort(path, x), atol=1e-5)


def test_fullgraph_catches_a_graph_break() -> None:
    class Breaks(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            torch._dynamo.graph_break()
            return x + 1

    torch._dynamo.reset()
    with pytest.raises(Exception, match="(?i)graph.?break"):
        torch.compile(Breaks(), backend="eager", fullgraph=True)(torch.zeros(1))


def test_resnet18_export_loads_back(tmp_path: Path) -> None:
    path = tmp_path / "resnet18.onnx"
    export(path, seed=0, tiled=True)  # checks the file against onnxruntime itself
    model, _ = torchvision_from_onnx(str(path))
    x = np.random.default_rng(1).uniform(-2, 2, (1, 3, 224, 224)).astype(np.float32)
    with torch.no_grad():
        want = _ort(path, x)
        for m in (model, OnnxModule(str(path)).eval()):
            got = m(torch.from_numpy(x)).numpy()
            assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()

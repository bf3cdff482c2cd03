"""The PyTorch peer of the GPU benchmark (bench/onnx_torch.py) compiles into one graph and computes what
onnxruntime computes; the ResNet-18 generator's file loads back into the same architecture. Needs torch
(.[dev] installs it; without it the module skips, or fails under EDGEDEPLOY_REQUIRE_DEV_PACKAGES=1); runs on the
CPU with dynamo's eager backend."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from tests.helpers import require_module

torch = require_module("torch", "DEV_PACKAGES", "pip install torch==2.13.0, the CPU build")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from onnx_torch import OnnxModule  # noqa: E402
from resnet18_onnx import export, torchvision_from_onnx  # noqa: E402

pytestmark = pytest.mark.bench


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


def test_resnet18_export_finds_its_databases_whatever_the_weights(tmp_path: Path) -> None:
    """The committed GEMM databases (profiles/tuning/h200/<graph digest[:16]>-*) serve the file the generator
    writes on this CPU, on another (torch's scalar kernels, ATEN_CPU_CAPABILITY=default, stand in for another
    CPU's: three kinds of build host wrote three files, docs/tuning.md), and with other weights."""
    import os
    import subprocess

    from edgedeploy.compile.frontends.onnx_model import load_onnx
    from edgedeploy.compile.tuning.key import tuning_key

    repo = Path(__file__).resolve().parents[2]
    keys = []
    for capability, weights in ((None, "tiled"), ("default", "tiled"), (None, "random")):
        out = tmp_path / f"r-{capability}-{weights}.onnx"
        env = {**os.environ, **({"ATEN_CPU_CAPABILITY": capability} if capability else {})}
        cmd = [sys.executable, "-W", "ignore::DeprecationWarning", str(repo / "bench/resnet18_onnx.py"), str(out)]
        subprocess.run([*cmd, "--weights", weights], env=env, check=True, capture_output=True)
        keys.append(tuning_key(load_onnx(out), "int8").removesuffix("-int8"))
    assert len(set(keys)) == 1, keys
    for precision in ("int8", "fp16"):
        assert (repo / "profiles/tuning/h200" / f"{keys[0]}-{precision}" / "gemm_configs.json").is_file(), keys[0]


def test_a_fault_while_timing_names_its_case_and_the_groups_to_run_again() -> None:
    """A CUDA error is sticky: once a case's call raises while timing, the process's context is lost.
    gpu_vs_torch.measure names that case (CaseFault), and bench/gpu_bench.sh reruns the faulting group and the
    later ones in a new process (gpu_bench_rerun.groups_to_rerun)."""
    from gpu_bench_rerun import groups_to_rerun
    from gpu_vs_torch import Case, CaseFault, measure, ratio_range

    def fault() -> None:
        raise RuntimeError("CUDA Runtime Error: cudaErrorIllegalAddress (700)")

    ok = Case("edgedeploy int8", "edgedeploy")
    ok.call = lambda: None
    bad = Case("torch.compile max-autotune", "torch")
    bad.call = fault
    with pytest.raises(CaseFault) as caught:
        measure([ok, bad], n=10, rounds=2)
    assert caught.value.case == "torch.compile max-autotune" and "IllegalAddress" in caught.value.error
    assert len(ok.samples) == 5 and len(ok.round_medians) == 1  # the case before it was timed in round 1
    assert ratio_range([1.0, 1.2, 0.9], [1.0, 1.0, 1.0]) == [0.9, 1.2]

    models, batches = ["resnet18", "mobilenet_v1_0.25_224"], ["1", "64"]
    assert groups_to_rerun({"groups": []}, models, batches) == []
    assert groups_to_rerun({"fault": {"model": "mobilenet_v1_0.25_224", "batch": 64}}, models, batches) == [
        ("mobilenet_v1_0.25_224", "64")
    ]
    assert groups_to_rerun({"fault": {"model": "resnet18", "batch": 1}}, models, batches) == [
        ("resnet18", "1,64"),
        ("mobilenet_v1_0.25_224", "1,64"),
    ]


def test_ncu_summary_reads_the_committed_report() -> None:
    """bench/ncu_summary.py on run17's Nsight Compute report (real ncu 2025.3 output, tests/fixtures): one entry per
    profiled kernel, with its metrics and ncu's memory-access findings."""
    from ncu_summary import parse, read

    report = Path(__file__).resolve().parents[2] / "tests/fixtures/ncu.resnet18.int8.bs64.epi.txt.xz"
    kernels = parse(read(report))
    assert len(kernels) == 20 and all({"us", "sm", "l1", "occ", "regs"} <= k.values.keys() for k in kernels)
    stem = kernels[0]
    assert stem.name.startswith("fused_conv2d_add") and stem.grid == (6272, 1, 1) and stem.block == (32, 2, 1)
    assert stem.values["us"] == 157.38 and stem.values["regs"] == 230
    assert stem.flags == ["loads 17.1/32 B", "shared stores 2.6-way (50.13%)"]

"""xavier-cpu INT8 bundles give the exact INT8 reference's outputs on the emulated arm64 root.

Carmel (the Jetson Xavier CPU) has no 8-bit dot product, so its INT8 convolutions take the float32-exact form
(compile/int8/rewrite.py) where x86 profiles use their tensorized kernels (compile/int8/x86_int8.py). Here the
agent's own TvmRuntime runs the aarch64 library under QEMU user-mode emulation in the cached Debian
bullseye root (tests/integration/arm64root.py; chrooted on an overlay, not booted) and its outputs are
compared with compile/int8/qdq_reference.py on the same preprocessed inputs: every output within one
quantization step of the model's last quantized tensor (softmax and reshapes after it do not widen that).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from edgedeploy.api import build
from edgedeploy.build_store import host_file
from edgedeploy.compile.int8.build import Int8Config
from edgedeploy.compile.int8.datasets import load_calibration
from edgedeploy.compile.int8.qdq_reference import reference_outputs
from edgedeploy.compile.int8.quantize import QuantizeOptions
from edgedeploy.compile.package import load_card
from edgedeploy_agent.bundle import extract_bundle
from tests.integration.arm64root import CLEAN_ENV, CPUINFO, VENV, Container, PreparedRoot

pytestmark = [pytest.mark.integration, pytest.mark.compile]

REPO = Path(__file__).resolve().parents[2]
MODELS = {  # model file, calibration and input images, card, images run (emulation is slow)
    "mnist": ("mnist-8_opset13.onnx", "mnist", "mnist-8.toml", 8),
    "mobilenet": ("mobilenet_v1_0.25_224.onnx", "imagenet-sample", "mobilenet_v1_0.25_224.toml", 4),
}
# run in the root by its Python 3.9: the agent's runtime on the bundle, inputs and outputs as .npy files
RUNNER = """
import sys
from pathlib import Path
import numpy as np
from edgedeploy_agent.bundle import extract_bundle
from edgedeploy_agent.runtime.tvm import TvmRuntime
work = Path(sys.argv[1])
manifest = extract_bundle(work / "bundle.edb", work / "release")
runtime = TvmRuntime(work / "release", manifest, runtime_lib=str(work / "libtvm_runtime.so"))
x = np.load(work / "inputs.npy")
np.save(work / "outputs.npy", np.stack([runtime.run([x[i : i + 1]])[0][0] for i in range(len(x))]))
"""


def last_quantization_step(qdq: onnx.ModelProto) -> float:
    """The scale of the last QuantizeLinear in the graph (nodes are in topological order)."""
    scales = {i.name: numpy_helper.to_array(i) for i in qdq.graph.initializer}
    q = [n for n in qdq.graph.node if n.op_type == "QuantizeLinear"][-1]
    return float(np.max(scales[q.input[1]]))


def run_in_root(root: PreparedRoot, bundle: Path, inputs: np.ndarray, work: Path) -> np.ndarray:
    """The bundle's outputs for `inputs`, computed by the agent's TvmRuntime inside the arm64 root."""
    box = Container(lower=root.root, work=work, port=0)
    box.mount()
    try:
        inner = box.merged / "tmp" / "int8-reference"
        inner.mkdir(parents=True)
        shutil.copytree(REPO / "agent" / "edgedeploy_agent", inner / "edgedeploy_agent")
        shutil.copy(bundle, inner / "bundle.edb")
        shutil.copy(root.runtime_lib, inner / "libtvm_runtime.so")
        np.save(inner / "inputs.npy", inputs)
        (inner / "run.py").write_text(RUNNER)
        # the agent checks the bundle's CPU features against /proc/cpuinfo: an AGX Xavier's (no asimddp)
        (box.merged / "proc" / "cpuinfo").write_text(CPUINFO.read_text())
        argv = ["chroot", str(box.merged), *CLEAN_ENV, "PYTHONPATH=/tmp/int8-reference"]
        p = subprocess.run(
            [*argv, f"{VENV}/bin/python", "/tmp/int8-reference/run.py", "/tmp/int8-reference"],
            capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert p.returncode == 0, p.stderr[-3000:]
        return np.load(inner / "outputs.npy")
    finally:
        subprocess.run(["umount", str(box.merged)], check=False)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_xavier_cpu_int8_bundle_gives_the_exact_reference_outputs_on_arm64(
    arm64_root: PreparedRoot, data_dir: Path, model: str, tmp_path: Path
) -> None:
    file, images, card_file, count = MODELS[model]
    card = load_card(REPO / "examples" / "cards" / card_file)
    cfg = Int8Config(calibration=data_dir / images, options=QuantizeOptions(samples=32))
    built = build(data_dir / "models" / file, "xavier-cpu", tmp_path / "b.edb", card, int8=cfg)
    manifest = extract_bundle(built.bundle, tmp_path / "host-release")
    assert manifest.target.arch == "aarch64"
    qdq = onnx.load(str(host_file(manifest, "qdq-onnx", tmp_path / "host-release")))
    x = load_calibration(data_dir / images, card.preprocess, manifest.inputs[0], count, "evaluation")
    want = np.stack([reference_outputs(qdq, x[i : i + 1])[0][0] for i in range(count)])
    got = run_in_root(arm64_root, built.bundle, x, tmp_path / "root")
    step = last_quantization_step(qdq)
    err = np.abs(got - want).max()
    assert err <= step * 1.001, f"max error {err} against one quantization step {step}"
    assert (got.argmax(axis=1) == want.argmax(axis=1)).all()

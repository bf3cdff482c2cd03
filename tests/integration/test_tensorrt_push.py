"""`edgedeploy push --prebuild` of a TensorRT bundle over a real sshd to a real agent process.

This machine has no GPU, so the agent's activation stops at the CUDA probe (before TensorRT is touched),
reports why, and the device rolls back: the whole path up to the engine build, for real.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import Cli, assert_one_line_error, require
from tests.integration.conftest import add_device

pytestmark = [pytest.mark.integration, pytest.mark.compile]


def test_prebuild_push_without_a_gpu_is_refused_with_the_reason(cli: Cli, sshd, data_dir: Path, tmp_path: Path) -> None:
    gpu = Path("/dev/nvidia0").exists()
    require("NO_NVIDIA", "this machine has an NVIDIA GPU: the activation would go on to TensorRT" if gpu else None)
    bundle = tmp_path / "m.t4-trt.edb"
    r = cli(
        "build", str(data_dir / "models" / "mobilenet_v1_0.25_224.onnx"), "--profile", "t4", "--runtime", "tensorrt",
        "--int8", "--calibration", str(data_dir / "imagenet-sample"), "--samples", "16", "--batch", "1:8:32",
        "-o", str(bundle),
    )  # fmt: skip
    assert r.code == 0, r.err
    dev = add_device(cli, sshd, tmp_path / "fleet" / "devices.toml", tmp_path / "root", name="t4-01", profile="t4")
    assert cli("devices", "enroll", dev.name, "--yes", *dev.args()).code == 0
    r = cli("push", dev.name, str(bundle), "--prebuild", "--build-timeout", "120", *dev.args())
    # the agent checks the device before unpacking: nothing was activated, nothing to roll back
    assert_one_line_error(r, 4, "needs a CUDA GPU (sm_75): no CUDA driver")
    state = json.loads((dev.root / "models" / "default" / "state.json").read_text())
    assert (
        state["current"] is None
        and state["pending"] is None
        and not list((dev.root / "models" / "default" / "releases").iterdir())
    )

"""Fixtures for agent tests that need a real TensorRT bundle (built once per session by the host code,
imported only here: the other agent tests run where only the agent is installed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import require_host


@pytest.fixture(scope="session")
def trt_bundle(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`edgedeploy build --runtime tensorrt --batch 1:8:32` of MobileNet (16 calibration samples)."""
    require_host()
    from edgedeploy.api import build_tensorrt
    from edgedeploy.compile.cards import ModelCard
    from edgedeploy.compile.int8.build import Int8Config
    from edgedeploy.compile.int8.quantize import QuantizeOptions
    from edgedeploy.compile.tensorrt_artifacts import TensorRTOptions

    int8 = Int8Config(calibration=data_dir / "imagenet-sample", options=QuantizeOptions(samples=16))
    res = build_tensorrt(
        data_dir / "models" / "mobilenet_v1_0.25_224.onnx",
        "t4",
        tmp_path_factory.mktemp("trt-bundle") / "mobilenet.t4-trt.edb",
        ModelCard(name="mobilenet"),
        int8,
        TensorRTOptions(batch=(1, 8, 32)),
    )
    return res.bundle

"""The first real frames are the health check: their outputs must have the declared shapes and be finite.

The runtime here is a small class behind the Runtime interface that behaves like a model whose numerics
break on real pixels (a zero tensor, the warm-up's input, is fine): what no real TVM model here does
on purpose. The frames are real: a video file read through OpenCV by the agent's capture code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgedeploy_agent.bundle import read_manifest
from edgedeploy_agent.config import AgentConfig
from edgedeploy_agent.errors import FrameFailed
from edgedeploy_agent.loop import InferenceLoop, warm_up
from edgedeploy_agent.sources.capture import open_source
from edgedeploy_agent.sources.power import NoPowerSensor
from edgedeploy_agent.spool import Spool, pending_reports
from edgedeploy_agent.store import DeviceStore
from tests.agent.bundles import make_bundle
from tests.agent.clips import write_clip


class NanOnRealPixels:
    """Outputs of the declared shape [1, 10]: finite for an all-zero input, NaN for anything else."""

    name = "nan-on-real-pixels"

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        value = 0.0 if not np.any(inputs[0]) else float("nan")
        return [np.full((1, 10), value, dtype=np.float32)]

    def describe(self) -> dict[str, Any]:
        return {"runtime": self.name}


def serve(tmp_path: Path, health_frames: int) -> tuple[InferenceLoop, int]:
    store = DeviceStore(tmp_path / "device")
    cfg = AgentConfig(device_name="t", report_interval_s=60)
    store.init(cfg)
    manifest = read_manifest(make_bundle(tmp_path / "b"))  # input [1, 1, 8, 8] gray, output [1, 10]
    runtime = NanOnRealPixels()
    assert warm_up(runtime, manifest) >= 0  # the warm-up cannot see it
    source = open_source(f"file:{write_clip(tmp_path / 'clip.avi', 5, 200)}")
    loop = InferenceLoop(runtime, manifest, [], cfg, Spool(store), NoPowerSensor(), "id", health_frames=health_frames)
    try:
        return loop, loop.run(source)
    finally:
        source.close()


def test_non_finite_outputs_on_the_first_real_frame_fail_the_health_check(tmp_path: Path) -> None:
    with pytest.raises(FrameFailed, match=r"frame 0 from file:.*clip.avi: output y is not finite"):
        serve(tmp_path, health_frames=3)


def test_after_the_health_frames_outputs_are_not_checked_again(tmp_path: Path) -> None:
    loop, _ = serve(tmp_path, health_frames=0)  # without the check the same bundle "serves" NaN
    assert loop.stats()["inferences"] == 5
    # the one-source loop's report says each frame's capture-to-prediction latency too (report schema 2)
    ((_, report),) = pending_reports(DeviceStore(tmp_path / "device"))
    assert report["frames"] == 5 and report["frame_latency_ms"]["p50"] >= report["latency_ms"]["infer"]["p50"]

"""The stages of frames whose input a GPU runtime loads apart from the model, and the model's own GPU time in their
reports (`model_gpu_ms`).

load_frames (the GPU path: the frame's copy and preprocessing) and load_inputs (the CPU path of a GPU bundle
without a preprocessing kernel: the input preprocess.py wrote, copied) only queue; the model's call then waits for
them and for the model. The runtime tells the loops when the GPU finished the load (`preprocessed`, a CUDA event
after it: runtime/cuda_copy.py QueueMark), so the preprocess stage ends there and the infer stage is the model's;
without that event both are the host's queueing and waiting, as before. The runtime's model clock (CUDA events on a
sample of the frames: ModelClock) says what of it the model took; both loops report it beside the stages. No GPU
here, so the runtime is a small class behind the same interface whose model call waits as a GPU's would (the load
still queued, then the model), says where the load ended where it `marks`, and whose clock reads the model's share
on every other frame; the frames are real, decoded from video files by the agent's capture.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from edgedeploy_agent.batcher import MultiSourceLoop
from edgedeploy_agent.bundle import Manifest, TensorSpec, read_manifest
from edgedeploy_agent.config import AgentConfig
from edgedeploy_agent.loop import InferenceLoop
from edgedeploy_agent.preprocess import preprocess
from edgedeploy_agent.sources.capture import open_source
from edgedeploy_agent.sources.power import NoPowerSensor
from edgedeploy_agent.spool import Spool, pending_reports
from edgedeploy_agent.store import DeviceStore
from tests.agent.bundles import make_bundle
from tests.agent.clips import write_clip

PREPROCESS_S, MODEL_S = 0.030, 0.005  # what the GPU still has to do when the model's call starts waiting


class QueuedGpu:
    """A GPU runtime's loads: load_frames (`frames`) or load_inputs (not `frames`: a bundle without a preprocessing
    kernel) returns at once, run_loaded waits PREPROCESS_S, calls `preprocessed` (with `mark=False`, as without the
    driver's events: at once), then waits MODEL_S; `model_gpu_ms` is MODEL_S on every other call (the sampled
    frames), None on the others and always with `clock=False`. run(), from the host, is counted."""

    name = "queued-gpu"
    TOP = [[0.75, 0.25], [3, 7]]  # the device's top 2: scores, then classes

    def __init__(self, batch: int, clock: bool, mark: bool, frames: bool = True, top: bool = False) -> None:
        self.batch, self.clock, self.mark = batch, clock, mark
        self.frames_on_device, self.loads_inputs, self.top_k_on_device = frames, not frames, top
        self.whole: list[tuple[np.ndarray, bool]] = []  # run_frames_top's frames and `outputs`
        self.model_gpu_ms: float | None = None
        self.loaded = self.calls = self.runs = 0
        self.inputs: list[np.ndarray] = []  # what load_inputs was given

    def frame_batch(self, height: int, width: int) -> np.ndarray:
        return np.zeros((self.batch, height, width, 3), np.uint8)

    def load_frames(self, frames: np.ndarray) -> None:
        assert self.frames_on_device
        self.loaded += 1

    def load_inputs(self, inputs: list[np.ndarray]) -> None:
        assert self.loads_inputs
        self.inputs.append(inputs[0].copy())
        self.loaded += 1

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:  # the warm-up's, from the host
        self.model_gpu_ms = None
        self.runs += 1
        return [np.zeros((self.batch, 10), np.float32)]

    def run_loaded(self, preprocessed: Callable[[], None] | None = None) -> list[np.ndarray]:
        if preprocessed is not None and not self.mark:
            preprocessed()
        time.sleep(PREPROCESS_S)
        if preprocessed is not None and self.mark:
            preprocessed()
        time.sleep(MODEL_S)
        self.model_gpu_ms = MODEL_S * 1e3 if self.clock and self.calls % 2 == 0 else None
        self.calls += 1
        return [np.zeros((self.batch, 10), np.float32)]

    def run_frames_top(
        self, frames: np.ndarray, outputs: bool = False, preprocessed: Callable[[], None] | None = None
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """With the device's top k (`top`): the frame's load, preprocessing, model and top k in one call."""
        assert self.frames_on_device and self.top_k_on_device
        self.whole.append((frames.copy(), outputs))
        self.loaded += 1
        outs = self.run_loaded(preprocessed)
        return np.array([self.TOP] * self.batch, np.float64), outs if outputs else []

    def describe(self) -> dict[str, Any]:
        return {"runtime": self.name}


def clip_frames(uris: list[str]) -> list[np.ndarray]:
    """Every frame of the clips, decoded as the capture decodes them."""
    frames = []
    for uri in uris:
        cap = cv2.VideoCapture(uri.removeprefix("file:"))
        ok, frame = cap.read()
        while ok:
            frames.append(frame)
            ok, frame = cap.read()
        cap.release()
    return frames


def manifest_of(tmp_path: Path, batch: int) -> Manifest:
    inputs = [TensorSpec(name="x", shape=[batch, 1, 8, 8], layout="NCHW")]
    return read_manifest(make_bundle(tmp_path / "b", inputs=inputs, outputs=[TensorSpec(name="y", shape=[batch, 10])]))


def reports(tmp_path: Path, clock: bool, sources: int, mark: bool = True, frames: bool = True) -> list[dict[str, Any]]:
    """Serve `sources` clips of 4 frames (one: InferenceLoop; more: MultiSourceLoop with a batch of them) through
    load_frames (`frames`) or preprocess.py and load_inputs; each source's report."""
    store = DeviceStore(tmp_path / "device")
    uris = [f"file:{write_clip(tmp_path / f'c{i}.avi', 4, 60 + 40 * i)}" for i in range(sources)]
    cfg = AgentConfig(device_name="t", report_interval_s=60, sources=uris, max_batch_wait_ms=2000)
    store.init(cfg)
    runtime = QueuedGpu(sources, clock, mark, frames)
    opened = [open_source(u) for u in uris]
    kind = InferenceLoop if sources == 1 else MultiSourceLoop
    manifest = manifest_of(tmp_path, sources)
    loop = kind(runtime, manifest, [], cfg, Spool(store), NoPowerSensor(), "id")
    try:
        loop.serve(opened)
    finally:
        for s in opened:
            s.close()
    assert runtime.loaded >= 4 and runtime.runs == 0  # every frame was loaded, none run from the host
    if not frames:  # what preprocess.py made of the frames (8x8 grey, normalised), each frame in its row
        want = [preprocess(f, manifest.preprocess, manifest.inputs[0])[0] for f in clip_frames(uris)]
        got = [row for x in runtime.inputs for row in x]
        assert len(got) >= len(want)
        for row in want:  # (a batch's rows in the order its sources were taken: compare as a set of rows)
            assert any(np.array_equal(row, g) for g in got)
    served = [r for _, r in pending_reports(store)]
    assert len(served) == sources and all(r["frames"] == 4 for r in served)
    return served


@pytest.mark.parametrize("sources", [1, 2], ids=["one source", "two sources batched"])
@pytest.mark.parametrize("frames", [True, False], ids=["frames loaded", "inputs loaded"])
def test_the_reports_carry_the_models_gpu_time_beside_the_stages(tmp_path: Path, sources: int, frames: bool) -> None:
    for r in reports(tmp_path, clock=True, sources=sources, frames=frames):
        assert r["model_gpu_ms"]["p50"] == r["model_gpu_ms"]["max"] == MODEL_S * 1e3  # the sampled frames only


@pytest.mark.parametrize("sources", [1, 2], ids=["one source", "two sources batched"])
def test_without_the_clock_there_is_no_model_gpu_time(tmp_path: Path, sources: int) -> None:
    for r in reports(tmp_path, clock=False, sources=sources):
        assert r.get("model_gpu_ms") is None


@pytest.mark.parametrize("sources", [1, 2], ids=["one source", "two sources batched"])
@pytest.mark.parametrize("frames", [True, False], ids=["frames loaded", "inputs loaded"])
def test_the_preprocess_stage_ends_where_the_gpus_load_did(tmp_path: Path, sources: int, frames: bool) -> None:
    """With the runtime's mark the GPU's copy (and preprocessing) is the preprocess stage's and the infer stage is
    the model's (the sleeps are lower bounds; the upper one on infer is the load it no longer carries)."""
    for r in reports(tmp_path, clock=False, sources=sources, mark=True, frames=frames):
        stages = r["latency_ms"]
        assert stages["preprocess"]["p50"] >= PREPROCESS_S * 1e3
        assert MODEL_S * 1e3 <= stages["infer"]["p50"] < PREPROCESS_S * 1e3


@pytest.mark.parametrize("sources", [1, 2], ids=["one source", "two sources batched"])
def test_without_the_mark_the_infer_stage_carries_the_queued_preprocessing(tmp_path: Path, sources: int) -> None:
    for r in reports(tmp_path, clock=False, sources=sources, mark=False):
        stages = r["latency_ms"]
        assert stages["preprocess"]["p50"] < PREPROCESS_S * 1e3
        assert stages["infer"]["p50"] >= (PREPROCESS_S + MODEL_S) * 1e3


@pytest.mark.parametrize("sources", [1, 2], ids=["one source", "two sources batched"])
def test_frames_on_the_device_go_in_one_call_with_their_top_k(tmp_path: Path, sources: int) -> None:
    """A bundle that preprocesses and ranks on the device: both loops hand each decoded frame (the batcher: its batch
    of them) to one call (run_frames_top: the runtime's whole-frame graph), ask for the outputs on the health check's
    frames only, report the device's top k, and their preprocess stage still ends where the runtime's mark said."""
    store = DeviceStore(tmp_path / "device")
    uris = [f"file:{write_clip(tmp_path / f'c{i}.avi', 4, 60 + 40 * i)}" for i in range(sources)]
    cfg = AgentConfig(device_name="t", report_interval_s=60, sources=uris, max_batch_wait_ms=2000)
    store.init(cfg)
    runtime = QueuedGpu(sources, clock=False, mark=True, top=True)
    opened = [open_source(u) for u in uris]
    kind = InferenceLoop if sources == 1 else MultiSourceLoop
    loop = kind(runtime, manifest_of(tmp_path, sources), [], cfg, Spool(store), NoPowerSensor(), "id", health_frames=2)
    try:
        loop.serve(opened)
    finally:
        for s in opened:
            s.close()
    got = [image for frames, _ in runtime.whole for image in (frames if frames.ndim == 4 else [frames])]
    for frame in clip_frames(uris):  # (a batch's rows in the order its sources were taken)
        assert any(np.array_equal(frame, g) for g in got)
    assert len(runtime.whole) == runtime.calls >= 4 and runtime.runs == 0
    asked = [outputs for _, outputs in runtime.whole]  # the health check's calls, then none (batched: a call holds 2)
    assert asked == sorted(asked, reverse=True) and asked[0] and not asked[-1]
    assert asked.count(True) == 2 if sources == 1 else 1 <= asked.count(True) <= 2
    for _, report in pending_reports(store):
        assert report["frames"] == 4
        assert [p["top"] for p in report["predictions"]] == [[[3, "3", 0.75], [7, "7", 0.25]]] * 4
        assert report["latency_ms"]["preprocess"]["p50"] >= PREPROCESS_S * 1e3 > report["latency_ms"]["infer"]["p50"]

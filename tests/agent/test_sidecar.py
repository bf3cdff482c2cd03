"""TensorRT and GStreamer capture under another Python than the agent's (JetPack 5: the system Python 3.8 has
TensorRT's bindings and NVIDIA's OpenCV; the agent runs in a 3.9 venv).

Here the stand-in for JetPack's Python is a real CPython 3.8 (pyenv's, with numpy and onnxruntime: the
`jetpack_python` fixture) running the TensorRT double, and Debian's /usr/bin/python3 with its GStreamer-enabled
python3-opencv running a videotestsrc pipeline, while the agent runs in this venv (pip OpenCV, no GStreamer).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from edgedeploy_agent.bundle import read_manifest
from edgedeploy_agent.config import AgentConfig
from edgedeploy_agent.errors import HealthCheckFailed, SidecarFailed
from edgedeploy_agent.lifecycle import Deployment
from edgedeploy_agent.loop import run_agent
from edgedeploy_agent.service import ProcessService, read_health
from edgedeploy_agent.sidecar.channel import MAX_MESSAGE, Channel, ChannelClosed, SharedMemory, place
from edgedeploy_agent.sidecar.process import Sidecar
from edgedeploy_agent.sidecar.tensorrt_client import SidecarTrtBackend
from edgedeploy_agent.sidecar.worker import DOUBLE_ENV
from edgedeploy_agent.sources.capture import open_source
from edgedeploy_agent.sources.frames import opencv_has_gstreamer
from edgedeploy_agent.spool import pending_reports
from edgedeploy_agent.store import DeviceStore
from tests.agent.bundles import copy, reference_runs, with_version
from tests.agent.trt_double import OPTIONS_ENV
from tests.helpers import looped, require_gstreamer_python, wait_for

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def double(monkeypatch: pytest.MonkeyPatch) -> None:
    """The TensorRT double in every worker started from now on (TensorRT 8.5.2 on a T4, the bundle's profile);
    `_set_options` changes it for the workers started after."""
    monkeypatch.setenv(DOUBLE_ENV, "tests.agent.trt_double:sidecar_double")
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the worker imports tests.agent.trt_double
    _set_options(monkeypatch)


def _set_options(monkeypatch: pytest.MonkeyPatch, **options: object) -> None:
    monkeypatch.setenv(OPTIONS_ENV, json.dumps({"gpu": "T4", **options}))


# --- the wire -------------------------------------------------------------------------------------------


def test_channel_refuses_oversized_and_non_object_messages() -> None:
    r, w = os.pipe()
    ch = Channel(r, w)
    with pytest.raises(ValueError, match="exceeds"):
        ch.send({"x": "a" * MAX_MESSAGE})
    os.write(w, (MAX_MESSAGE + 1).to_bytes(4, "big"))
    with pytest.raises(ChannelClosed, match="limit"):
        ch.recv(timeout=1)
    r2, w2 = os.pipe()
    ch2 = Channel(r2, w2)
    os.write(w2, (2).to_bytes(4, "big") + b"[]")
    with pytest.raises(ChannelClosed, match="JSON object"):
        ch2.recv(timeout=1)
    ch.close()
    ch2.close()


def test_closing_twice_leaves_files_opened_since_alone() -> None:
    """A second close() must not close what now has the same numbers (a double close could be what left the
    test process's multiprocessing resource tracker pipe dead mid-run, twice under load; not proven)."""
    ch, shm = Channel(*os.pipe()), SharedMemory.create("test")
    numbers = {ch.read_fd, ch.write_fd, shm.fd}
    ch.close()
    shm.close()
    opened: list[int] = []
    while not numbers <= set(opened):  # the lowest free numbers come first: the ones just closed
        opened.append(os.open(os.devnull, os.O_RDONLY))
        assert len(opened) < 64
    ch.close()
    shm.close()
    for fd in opened:
        os.fstat(fd)  # still open
        os.close(fd)


def test_shared_memory_grown_by_one_side_is_seen_by_the_other() -> None:
    a = SharedMemory.create("test")
    b = SharedMemory(os.dup(a.fd))
    (spec,) = place([((1000, 1000), np.float32)], start=100)
    assert spec["offset"] % 64 == 0
    a.array(spec)[:] = 7.0  # grows the memfd to 4 MB
    assert b.array(spec).sum() == 7.0 * 1e6  # mapped again on the other side
    a.close()
    b.close()


# --- TensorRT under Python 3.8 --------------------------------------------------------------------------


def _store(tmp_path: Path, python: Path, source: str | None, **cfg: object) -> DeviceStore:
    store = DeviceStore(tmp_path / "root")
    store.init(AgentConfig(device_name="xavier-01", source=source, system_python=str(python), **cfg))  # type: ignore[arg-type]
    return store


def test_tensorrt_bundle_builds_accepts_and_serves_frames_in_the_python38_worker(
    mnist_trt_bundle: Path, jetpack_python: Path, double: None, data_dir: Path, tmp_path: Path
) -> None:
    store = _store(tmp_path, jetpack_python, f"file:{data_dir / 'video' / 'bikes.mp4'}")
    m = store.stage(mnist_trt_bundle)
    store.activate(m.release_name)
    assert run_agent(store, max_frames=5) == 0, read_health(store)
    health = read_health(store)
    assert health is not None and health["state"] == "finished"
    runtime = health["runtime"]
    # built and accepted over there: TensorRT 8.5 (the double) under 3.8, the cache and the check here
    assert runtime["runtime"] == "tensorrt" and runtime["tensorrt"] == "8.5.2.2" and runtime["engine"] == "built"
    assert runtime["tensorrt_python"].startswith("3.8.") and "worker pid" in runtime["tensorrt_python"]
    assert runtime["acceptance"]["passed"] and runtime["acceptance"]["top1_agreement"] >= 0.99
    assert list((store.root / "engines").glob("*/plan"))
    reports = [r for _, r in pending_reports(store)]
    assert sum(r["frames"] for r in reports) == 5 and reports[-1]["runtime"] == "tensorrt"
    assert all(p["top"] for r in reports for p in r["predictions"])

    # a restart finds the engine in the cache (the worker deserializes it)
    assert run_agent(store, max_frames=1) == 0
    assert read_health(store)["runtime"]["engine"] == "cached"  # type: ignore[index]


def test_outputs_through_the_worker_equal_the_engine_in_process(
    mnist_trt_bundle: Path, jetpack_python: Path, double: None, tmp_path: Path
) -> None:
    """Shared memory carries inputs and outputs unchanged: the 3.8 worker's engine and the same double in this
    process give the same scores for the same inputs."""
    from edgedeploy_agent.sidecar.trt_backend import TrtBackend
    from edgedeploy_agent.store import DeviceStore as Store
    from tests.agent.trt_double import FakeTensorRT

    store = Store(tmp_path / "root")
    store.init(AgentConfig())
    m = store.stage(mnist_trt_bundle)
    onnx = store.release_dir(m.release_name) / m.tensorrt.onnx  # type: ignore[union-attr]
    side = SidecarTrtBackend(str(jetpack_python))
    backends: list[TrtBackend] = [side.open(), FakeTensorRT(version="8.5.2.2")]
    x = np.random.default_rng(0).uniform(0, 255, (3, 1, 28, 28)).astype(np.float32)
    outs = []
    for b in backends:
        plan = b.build(onnx, m.tensorrt, None, lambda msg: None)  # type: ignore[arg-type]
        engine = b.load(plan)
        assert engine is not None
        outs.append(engine.run([x])[0])
    side.close()
    assert outs[0].shape == (3, 10) and np.allclose(outs[0], outs[1], rtol=1e-5, atol=1e-5)


def test_a_hung_worker_is_killed_and_reported(
    mnist_trt_bundle: Path,
    jetpack_python: Path,
    double: None,
    monkeypatch: pytest.MonkeyPatch,
    data_dir: Path,
    tmp_path: Path,
) -> None:
    # the first camera frame hangs the engine
    _set_options(monkeypatch, hang_after_runs=reference_runs(mnist_trt_bundle))
    store = _store(tmp_path, jetpack_python, f"file:{data_dir / 'video' / 'bikes.mp4'}")
    store.init(store.config().model_copy(update={"sidecar_timeout_s": 1.0}))
    m = store.stage(mnist_trt_bundle)
    store.activate(m.release_name)
    t = time.monotonic()
    assert run_agent(store, max_frames=3) != 0
    health = read_health(store)
    assert health is not None and health["state"] == "failed", health
    assert health["error"]["code"] == "sidecar-failed" and "within 1 s: killed" in health["error"]["message"]
    assert time.monotonic() - t < 60


def test_a_dead_worker_before_loading_is_a_clear_runtime_error(jetpack_python: Path, double: None) -> None:
    side = SidecarTrtBackend(str(jetpack_python))
    os.kill(side.sidecar.pid, signal.SIGKILL)
    with pytest.raises(SidecarFailed, match=r"Python 3\.8\.\d+, pid \d+\) killed by SIGKILL during 'probe'"):
        side.probe()
    side.close()


def test_a_missing_system_python_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(SidecarFailed, match="cannot start the tensorrt worker with /nonexistent/python3.8"):
        Sidecar("/nonexistent/python3.8", "tensorrt")


def test_deploy_serves_through_python38_and_rolls_back_when_the_worker_is_killed(
    mnist_trt_bundle: Path,
    jetpack_python: Path,
    double: None,
    monkeypatch: pytest.MonkeyPatch,
    data_dir: Path,
    tmp_path: Path,
) -> None:
    """A real agent process (process service) runs the 3.8 worker: deploy v1 (healthy on real frames), then
    deploy v2 and kill its worker while v2 is checking frames: the deploy fails and v1 serves again.
    (This machine has no GPU: the deploy's own driver check, in this process, sees the double's T4; the agent
    process asks the worker, as on a device.)"""
    from edgedeploy_agent import lifecycle
    from tests.agent.trt_double import T4

    monkeypatch.setattr(lifecycle, "probe_cuda", lambda: (T4.as_gpu(), ""))
    clip = data_dir / "video" / "bikes.mp4"
    store = _store(tmp_path, jetpack_python, looped(clip), health_frames=5, idle_baseline_s=0)
    service = ProcessService(store)
    v1 = copy(mnist_trt_bundle, tmp_path / "v1")
    v2 = with_version(mnist_trt_bundle, tmp_path / "v2.edb", "2")
    v1_name, v2_name = read_manifest(v1).release_name, read_manifest(v2).release_name
    assert v1_name != v2_name
    try:
        Deployment(store, service).deploy(copy(v1, store.incoming), timeout=120, build_timeout=120)
        health = read_health(store)
        assert health is not None and health["release"] == v1_name and health["state"] == "ready"
        assert health["runtime"]["tensorrt_python"].startswith("3.8.")

        # v2's engine hangs on its third camera frame; it is killed from outside while the deploy waits for five
        _set_options(monkeypatch, hang_after_runs=reference_runs(v2) + 2)
        failure: list[BaseException] = []

        def deploy_v2() -> None:
            try:
                Deployment(store, service).deploy(copy(v2, store.incoming), timeout=60, build_timeout=120)
            except BaseException as e:  # noqa: BLE001 - handed to the test thread
                failure.append(e)

        t = threading.Thread(target=deploy_v2)
        t.start()

        def worker_of_v2() -> int | None:
            h = read_health(store) or {}
            if h.get("release") != v2_name or h.get("state") != "checking-frames":
                return None
            return int(str(h["runtime"]["tensorrt_python"]).rsplit("pid ", 1)[1].rstrip(")"))

        wait_for("v2 checking frames", lambda: worker_of_v2() is not None, 120, every=0.05)
        os.kill(worker_of_v2(), signal.SIGKILL)  # type: ignore[arg-type]
        _set_options(monkeypatch)  # v1's engine, restarted by the rollback, does not hang
        t.join(timeout=180)
        assert not t.is_alive()
        assert failure and isinstance(failure[0], HealthCheckFailed), failure
        assert "sidecar-failed" in str(failure[0]) or "killed by SIGKILL" in str(failure[0])
        st = store.state()
        assert st["current"] == v1_name and st["history"][-1]["event"] == "rolled-back"
        wait_for("v1 ready again", lambda: (read_health(store) or {}).get("state") == "ready", 60, every=0.05)
        assert read_health(store)["release"] == v1_name  # type: ignore[index]
    finally:
        service.stop()


# --- capture under the system Python --------------------------------------------------------------------


@pytest.fixture
def gst_python() -> str:
    return require_gstreamer_python()


def test_gst_source_is_captured_by_the_system_pythons_opencv(gst_python: str) -> None:
    assert not opencv_has_gstreamer()  # the agent's own (pip) OpenCV could not open it
    src = open_source(
        "gst:videotestsrc is-live=true ! video/x-raw,width=64,height=48,framerate=30/1", system_python=gst_python
    )
    try:
        assert src.where["sidecar"] and src.where["gstreamer"] and src.where["executable"] == gst_python
        frames = [src.read(timeout=10) for _ in range(10)]
        assert all(f is not None and f.image.shape == (48, 64, 3) for f in frames)
        # each frame is the agent's own copy: a later frame does not change an earlier one
        first = frames[0].image.copy()  # type: ignore[union-attr]
        src.read(timeout=10)
        assert np.array_equal(first, frames[0].image)  # type: ignore[union-attr]
        assert src.state().camera_up
    finally:
        src.close()


def test_a_killed_capture_worker_is_a_lost_camera_that_comes_back(gst_python: str) -> None:
    src = open_source(
        "gst:videotestsrc is-live=true ! video/x-raw,width=64,height=48,framerate=30/1",
        system_python=gst_python,
        backoff_start_s=0.1,
    )
    try:
        assert src.read(timeout=10) is not None
        capture = src._capture  # the SidecarCapture
        os.kill(capture._sidecar.pid, signal.SIGKILL)  # type: ignore[attr-defined]
        wait_for("a reconnect", lambda: src.state().reconnects >= 1, 30, every=0.05)
        assert src.read(timeout=10) is not None and src.state().camera_up
        assert capture.restarts + src.state().reconnects >= 1  # type: ignore[attr-defined]
    finally:
        src.close()


def test_agent_serves_a_videotestsrc_pipeline_through_the_system_python(
    gst_python: str, tmp_path: Path, mnist_trt_bundle: Path
) -> None:
    """The agent in this venv, capture under /usr/bin/python3 (the TensorRT double in this process here: one
    system_python serves both on a Jetson, and no single Python here has both OpenCV+GStreamer and 3.8)."""
    from tests.agent.trt_double import T4, FakeTensorRT

    store = DeviceStore(tmp_path / "root")
    source = "gst:videotestsrc is-live=true ! video/x-raw,width=320,height=240,framerate=30/1"
    store.init(AgentConfig(device_name="xavier-01", source=source, system_python=gst_python, idle_baseline_s=0))
    m = store.stage(mnist_trt_bundle)
    store.activate(m.release_name)
    rc = run_agent(store, max_frames=10, tensorrt_options={"backend": FakeTensorRT(), "probe": lambda: T4})
    assert rc == 0, read_health(store)
    health = read_health(store)
    assert health is not None and health["capture"]["sidecar"] and health["capture"]["gstreamer"]
    assert health["capture"]["executable"] == gst_python
    reports = [r for _, r in pending_reports(store)]
    assert sum(r["frames"] for r in reports) == 10 and reports[-1]["camera_up"]


# --- the self-test says which Python does what -----------------------------------------------------------


def test_selftest_names_each_python_and_where_capture_runs(gst_python: str) -> None:
    from edgedeploy_agent.selftest import FAILED, OK
    from edgedeploy_agent.selftest_hardware import check_camera, check_pythons

    gst = "gst:videotestsrc is-live=true ! video/x-raw,width=64,height=48,framerate=30/1"
    alone = check_pythons(None, None, gst)
    assert alone.status == FAILED and "GStreamer capture in neither" in alone.detail
    assert "--system-python" in (alone.fix or "")
    both = check_pythons(gst_python, None, gst)
    assert both.status == OK, both
    assert "system: Python 3." in both.detail and f"({gst_python}): OpenCV" in both.detail
    assert "GStreamer capture in the sidecar" in both.detail and both.data["gstreamer_in"] == "the sidecar"
    gone = check_pythons("/nonexistent/python3.8", None, gst)
    assert gone.status == FAILED and "cannot start" in gone.detail

    camera = check_camera(gst, serving=False, report=None, seconds=10, system_python=gst_python)
    assert camera.status == OK and "through the sidecar's Python" in camera.detail, camera


def test_the_capture_worker_decodes_frames_into_shared_memory(gst_python: str) -> None:
    """OpenCV writes each frame into the shared-memory array it is given: after the first frame (placed once),
    no frame is copied in the worker; the agent's copy out is the only one."""
    import cv2

    worker = Sidecar(gst_python, "capture")
    try:
        pipeline = "videotestsrc ! video/x-raw,width=64,height=48 ! videoconvert ! video/x-raw,format=BGR ! appsink"
        assert worker.request("open", target=pipeline, backend=cv2.CAP_GSTREAMER, props={})["opened"]
        for _ in range(20):
            assert worker.request("read")["frame"]["shape"] == [48, 64, 3]
        assert worker.request("release")["copies"] == 1
    finally:
        worker.close()

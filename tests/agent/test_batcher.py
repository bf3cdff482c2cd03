"""Several sources in one agent: their frames batched into one call and split back per source.

The frames are real (video clips read through OpenCV by the agent's capture threads). The runtime is a small
class behind the Runtime interface that answers, per row of its batch, the row's mean pixel: the only way to see,
from the outside, which source's frame went into which row and what the padding rows held. A real TVM bundle with
two real videos: tests/integration/test_multi_source.py.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from edgedeploy_agent.batcher import MultiSourceLoop
from edgedeploy_agent.config import AgentConfig
from edgedeploy_agent.notify import Notifier
from edgedeploy_agent.report import BATCH_STAGES, REPORT_SCHEMA_VERSION
from edgedeploy_agent.selftest import FAILED, OK, run_selftest
from edgedeploy_agent.sources.capture import open_source
from edgedeploy_agent.sources.power import NoPowerSensor
from edgedeploy_agent.spool import Spool, pending_reports
from edgedeploy_agent.store import DeviceStore
from tests.agent.clips import write_clip
from tests.agent.doubles import RowMeans, batched_manifest
from tests.helpers import agent, assert_one_line_error


def serve(
    tmp_path: Path,
    batch: int,
    uris: list[str],
    max_frames: int | None = None,
    wait_ms: float = 2000,
    all_ready: bool = False,
) -> tuple[Any, ...]:
    """Serve `uris` to the end (or max_frames); a batch waits up to `wait_ms` for a source that is still playing.
    With `all_ready`, serving starts once every source has its first frame (a loaded machine may open one file
    long after the others, and a batch 1 loop rightly serves what is there)."""
    store = DeviceStore(tmp_path / "device")
    cfg = AgentConfig(device_name="t", report_interval_s=60, sources=uris, max_batch_wait_ms=wait_ms)
    store.init(cfg)
    manifest = batched_manifest(tmp_path, batch)
    runtime = RowMeans()
    sources = [open_source(u, backoff_start_s=0.05, backoff_max_s=0.1) for u in uris]
    loop = MultiSourceLoop(runtime, manifest, [], cfg, Spool(store), NoPowerSensor(), "id", health_frames=3)
    deadline = time.monotonic() + 30
    while all_ready and not all(s.captured for s in sources) and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        written = loop.serve(sources, max_frames=max_frames)
    finally:
        for s in sources:
            s.close()
    reports = {r["source"]: r for _, r in pending_reports(store)}
    assert written == len(reports)  # one report per source (the window outlasts the clips)
    return loop, runtime, reports


def test_two_sources_share_each_call_and_get_their_own_frames_back(tmp_path: Path) -> None:
    dark = f"file:{write_clip(tmp_path / 'dark.avi', 5, 40)}"
    bright = f"file:{write_clip(tmp_path / 'bright.avi', 8, 150)}"
    loop, runtime, reports = serve(tmp_path, 2, [dark, bright])
    # every frame of both clips, once, in order, each with its own source's pixels (40+i and 150+i, give or take
    # what JPEG moved)
    for uri, n, base in ((dark, 5, 40), (bright, 8, 150)):
        r = reports[uri]
        assert r["schema_version"] == REPORT_SCHEMA_VERSION == 3 and r["final"] and r["frames"] == n
        assert [p["frame"] for p in r["predictions"]] == list(range(n))
        means = [p["top"][0][2] for p in r["predictions"]]
        assert all(abs(m - (base + i)) < 2 for i, m in enumerate(means)) and means == sorted(means)
        assert set(r["latency_ms"]) == set(BATCH_STAGES) and r["frame_latency_ms"]["max"] > 0
        assert r["batch"]["size"] == 2 and r["batch"]["sources"] == 2
    # the calls: never two frames of one source in a call; once the dark clip ended, the bright frames go alone
    # and the second row is zero padding
    assert sum(len([m for m in c if m > 0]) for c in runtime.calls) == 13
    assert all(not (c[0] > 100 and c[1] > 100) and not (0 < c[0] < 100 and 0 < c[1] < 100) for c in runtime.calls)
    assert [c for c in runtime.calls if c[1] == 0.0][-3:] == [[c[0], 0.0] for c in runtime.calls[-3:]]
    assert len(runtime.calls) == 8 and reports[dark]["batch"]["mean_fill"] == 2.0
    health = {s["source"]: s for s in loop.stats()["sources"]}
    assert health[dark]["frames"] == 5 and health[bright]["frames"] == 8 and health[bright]["ended"]
    assert loop.stats()["inferences"] == 13


def test_a_lost_camera_does_not_stop_the_others(tmp_path: Path) -> None:
    gone = f"file:{tmp_path / 'unplugged.avi'}?live=1"  # a camera that is not there: it reconnects, never delivers
    clip = f"file:{write_clip(tmp_path / 'clip.avi', 6, 90)}"
    loop, runtime, reports = serve(tmp_path, 2, [gone, clip], max_frames=6)
    # no call waited its 2 s batch wait for the camera that is down
    assert reports[clip]["latency_ms"]["batch_wait"]["max"] < 1000
    assert reports[clip]["frames"] == 6 and [p["frame"] for p in reports[clip]["predictions"]] == list(range(6))
    lost = reports[gone]
    assert lost["frames"] == 0 and lost["camera_up"] is False and lost["latency_ms"] == {}
    assert all(c[1] == 0.0 for c in runtime.calls)  # one real frame per call, the camera's row padded
    health = {s["source"]: s for s in loop.stats()["sources"]}
    assert not health[gone]["camera_up"] and "unplugged.avi" in health[gone]["last_error"]


def test_a_batch_1_bundle_serves_the_sources_in_turn(tmp_path: Path) -> None:
    clips = [f"file:{write_clip(tmp_path / f'c{i}.avi', 4, 30 + 60 * i)}" for i in range(3)]
    loop, runtime, reports = serve(tmp_path, 1, clips, all_ready=True)
    assert [reports[c]["frames"] for c in clips] == [4, 4, 4]
    assert all(reports[c]["batch"]["mean_fill"] == 1.0 for c in clips)
    # no source waits for another's whole clip: each source's first frame is among the first calls
    first_calls = {int(c[0] // 60) for c in runtime.calls[:6]}  # 30+i -> 0, 90+i -> 1, 150+i -> 2 (i < 4)
    assert first_calls == {0, 1, 2}


def test_sources_in_the_config_and_on_the_command_line(tmp_path: Path) -> None:
    root = tmp_path / "root"
    # an agent.json as an agent before `sources` wrote it: one `source`, still valid
    DeviceStore(root).init(AgentConfig(device_name="cam-01", source="file:/data/a.mp4"))
    written = json.loads((root / "agent.json").read_text())
    del written["sources"], written["max_batch_wait_ms"]
    (root / "agent.json").write_text(json.dumps(written))
    old = DeviceStore(root).config()
    assert old.source_uris == ["file:/data/a.mp4"] and old.sources == [] and old.max_batch_wait_ms == 10.0
    r = agent("--root", str(root), "--json", "init", "--source", "v4l2:/dev/video0", "--source", "file:/data/b.mp4",
              "--max-batch-wait-ms", "4")  # fmt: skip
    cfg = json.loads(r.out)["config"]
    assert (cfg["source"], cfg["sources"], cfg["max_batch_wait_ms"]) == (
        None,
        ["v4l2:/dev/video0", "file:/data/b.mp4"],
        4,
    )
    facts = json.loads(agent("--root", str(root), "--json", "facts").out)
    assert facts["source"] is None and facts["sources"] == ["v4l2:/dev/video0", "file:/data/b.mp4"]
    r = agent("--root", str(root), "--json", "init", "--source", "file:/data/c.mp4")  # one again: `source`
    assert (json.loads(r.out)["config"]["source"], json.loads(r.out)["config"]["sources"]) == ("file:/data/c.mp4", [])
    # facts as a host from before `sources` reads them: no `sources` key for one source
    assert "sources" not in json.loads(agent("--root", str(root), "--json", "facts").out)
    assert_one_line_error(
        agent("--root", str(root), "init", "--source", "file:/x.mp4", "--source", "file:/x.mp4"),
        9,
        "names a source twice",
    )
    (root / "agent.json").write_text(json.dumps({**written, "sources": ["file:/b.mp4", "file:/c.mp4"]}))
    assert_one_line_error(agent("--root", str(root), "facts"), None, "give source (one camera) or sources")


def test_with_every_camera_down_the_loop_waits_instead_of_spinning(tmp_path: Path) -> None:
    uris = [f"file:{tmp_path / f'unplugged{i}.avi'}?live=1" for i in range(2)]
    store = DeviceStore(tmp_path / "device")
    cfg = AgentConfig(device_name="t", report_interval_s=60, sources=uris)
    store.init(cfg)
    manifest = batched_manifest(tmp_path, 2)
    turns: list[float] = []  # the loop pings the watchdog once per turn; the notifier reads its clock each time
    notifier = Notifier({"WATCHDOG_USEC": "1000000"}, clock=lambda: turns.append(0.0) or 0.0)
    sources = [open_source(u, backoff_start_s=0.05, backoff_max_s=0.1) for u in uris]
    loop = MultiSourceLoop(RowMeans(), manifest, [], cfg, Spool(store), NoPowerSensor(), "id", notifier=notifier)
    stop = threading.Timer(1.5, lambda: setattr(loop, "stop_requested", True))
    stop.start()
    try:
        assert loop.serve(sources) == 2  # each camera's report: down, no frames
    finally:
        stop.cancel()
        for s in sources:
            s.close()
    assert 2 <= len(turns) <= 10  # a turn per 0.5 s read timeout (a spinning loop: thousands)
    assert all(not s["camera_up"] for s in loop.stats()["sources"])


def test_the_selftest_checks_every_camera(tmp_path: Path) -> None:
    clip = f"file:{write_clip(tmp_path / 'clip.avi', 8, 90)}"
    gone = f"file:{tmp_path / 'unplugged.avi'}"
    store = DeviceStore(tmp_path / "root")
    store.init(AgentConfig(device_name="t", sources=[clip, gone]))
    cameras = [c for c in run_selftest(store, camera_seconds=1)["checks"] if c["name"] == "camera"]
    assert [c["status"] for c in cameras] == [OK, FAILED]
    assert "unplugged.avi" in cameras[1]["detail"] and "unplugged.avi" not in cameras[0]["detail"]

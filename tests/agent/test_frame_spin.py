"""frame_spin_ms: the agent's loop polls for its next frame that long before it sleeps on the capture's hand-over,
so that a frame that comes soon starts on a core that never went idle (on two H100 hosts of three, MobileNetV1-0.25's
720p frame cost 2.25x and 2.20x its kernel behind a sleeping loop, 1.90x and 1.98x behind a polling one:
docs/agent-service.md "Ninth session"). How the read spins is tests/agent/test_capture.py's; here: the setting, and
the loop honouring it."""

from __future__ import annotations

import ctypes
import json
import threading
import time
from pathlib import Path

from edgedeploy_agent.config import AgentConfig
from edgedeploy_agent.loop import InferenceLoop
from edgedeploy_agent.sources.capture import CapturedSource
from edgedeploy_agent.sources.frames import parse_source
from edgedeploy_agent.sources.power import NoPowerSensor
from edgedeploy_agent.spool import Spool, pending_reports
from edgedeploy_agent.store import DeviceStore
from tests.agent.doubles import PacedCapture, RowMeans, batched_manifest
from tests.helpers import agent, assert_one_line_error


def test_the_setting_defaults_to_sleeping_and_init_sets_it(tmp_path: Path) -> None:
    root = tmp_path / "root"
    # an agent.json written before the setting existed loads with the default
    DeviceStore(root).init(AgentConfig(device_name="cam-01", source="file:/data/a.mp4"))
    written = json.loads((root / "agent.json").read_text())
    del written["frame_spin_ms"]
    (root / "agent.json").write_text(json.dumps(written))
    assert DeviceStore(root).config().frame_spin_ms == 0
    r = agent("--root", str(root), "--json", "init", "--frame-spin-ms", "2")
    assert r.code == 0 and json.loads(r.out)["config"]["frame_spin_ms"] == 2
    bad = agent("--root", str(root), "init", "--frame-spin-ms", "-1")
    assert_one_line_error(bad, 9, "frame_spin_ms")
    assert DeviceStore(root).config().frame_spin_ms == 2  # the refused value changed nothing


def _loop_cpu(tmp_path: Path, spin_ms: float) -> tuple[int, float, int]:
    """The agent's loop, on a thread of its own, over 5 frames that come 50 ms apart: (frames reported, the share of
    the loop's wall time its thread spent on a CPU, its timer slack in ns after the loop)."""
    store = DeviceStore(tmp_path / f"spin{spin_ms:g}")
    cfg = AgentConfig(device_name="t", report_interval_s=60, source="file:paced", frame_spin_ms=spin_ms)
    store.init(cfg)
    loop = InferenceLoop(RowMeans(), batched_manifest(tmp_path, 1), [], cfg, Spool(store), NoPowerSensor(), "id")
    source = CapturedSource(parse_source("file:paced"), capture_factory=lambda _: PacedCapture(5, 0.05))
    seen: list[int] = []

    def serve() -> None:
        wall, cpu = time.perf_counter(), time.thread_time()
        loop.run(source)
        seen.extend(((time.thread_time() - cpu) / (time.perf_counter() - wall), timer_slack_ns()))

    try:
        thread = threading.Thread(target=serve)
        thread.start()
        thread.join(30)
    finally:
        source.close()
    return sum(r["frames"] for _, r in pending_reports(store)), seen[0], seen[1]


PR_GET_TIMERSLACK = 30  # linux/prctl.h


def timer_slack_ns() -> int:
    """The calling thread's timer slack (Linux prctl PR_GET_TIMERSLACK)."""
    return int(ctypes.CDLL(None).prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0))


def test_the_loop_polls_with_a_spin_and_sleeps_without(tmp_path: Path) -> None:
    """Polling, the loop's thread stays on its CPU through the gaps between frames, napping a few us between looks
    (its timer slack cut to 1 us: fine_naps); without, it sleeps until the capture thread wakes it, its timer slack
    left as it was."""
    frames, busy, slack = _loop_cpu(tmp_path, 1000.0)  # a spin longer than the gaps: the loop never sleeps
    assert frames == 5 and busy > 0.3 and slack == 1000, (busy, slack)
    frames, busy, slack = _loop_cpu(tmp_path, 0.0)
    assert frames == 5 and busy < 0.1 and slack == timer_slack_ns() != 1000, (busy, slack)

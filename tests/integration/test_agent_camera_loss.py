"""The agent survives a camera loss: it reports camera_up=false instead of dying, then reconnects."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from tests.helpers import agent

pytestmark = pytest.mark.integration


def _reports(root: Path) -> list[dict]:
    out = []
    for p in sorted((root / "spool").glob("*.jsonl")):
        out += [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    return sorted(out, key=lambda r: r["seq"])


def _wait_for(root: Path, check, timeout: float = 30.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reports = _reports(root)
        if check(reports):
            return reports
        time.sleep(0.2)
    raise AssertionError(f"condition not reached; reports: {[(r['seq'], r.get('camera_up')) for r in reports]}")


def test_camera_lost_and_back(tmp_path: Path, mnist_bundle: Path, mnist_video) -> None:
    camera = tmp_path / "camera.avi"
    shutil.copy(mnist_video.path, camera)
    root = tmp_path / "root"
    init = ["--root", str(root), "--json", "init", "--service", "process", "--report-interval", "0.5"]
    assert agent(*init, "--source", f"file:{camera}?live=1").code == 0
    staged = root / "incoming" / "b.edb"
    shutil.copy(mnist_bundle, staged)
    r = agent("--root", str(root), "--json", "deploy", str(staged), "--timeout", "60")
    try:
        assert json.loads(r.out.splitlines()[-1])["ok"], r.out
        _wait_for(root, lambda rs: any(x["camera_up"] and x["frames"] > 0 for x in rs))
        camera.unlink()  # unplugged
        down = _wait_for(root, lambda rs: any(x["camera_up"] is False and x["frames"] == 0 for x in rs))
        lost = next(x for x in down if x["camera_up"] is False and x["frames"] == 0)
        assert lost["latency_ms"] == {} and lost["fps"] == 0
        assert lost["power"]["status"] == "unavailable"  # nothing measured here: never a made-up number
        assert json.loads(agent("--root", str(root), "--json", "facts").out)["running"] is True  # still alive
        shutil.copy(mnist_video.path, camera)  # plugged back in

        def recovered(x: dict) -> bool:
            return x["reconnects"] >= 1 and x["camera_up"] and x["frames"] > 0

        last = next(x for x in _wait_for(root, lambda rs: any(map(recovered, rs))) if recovered(x))
        assert last["frame_age_ms"]["p50"] >= 0 and last["dropped_frames"] >= 0
    finally:
        agent("--root", str(root), "--json", "stop")

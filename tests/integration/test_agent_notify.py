"""The real agent process under a fake systemd: a NOTIFY_SOCKET datagram socket owned by the test.

READY=1 must arrive only once the bundle is loaded and warmed up (health.json already says `ready`
when it arrives without a source; with one, `checking-frames` until the first real frames were served:
systemd must not give up on a device whose camera is unplugged), and WATCHDOG=1 must keep arriving from
the main loop, idle or serving frames.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import BIN, agent, looped

pytestmark = pytest.mark.integration


def _deployed_root(tmp_path: Path, bundle: Path, source: str | None) -> Path:
    root = tmp_path / "root"
    args = ["--root", str(root), "--json", "init", "--service", "process", "--report-interval", "0.5"]
    assert agent(*args, *(["--source", source] if source else [])).code == 0
    staged = root / "incoming" / "b.edb"
    shutil.copy(bundle, staged)
    r = agent("--root", str(root), "--json", "deploy", str(staged), "--timeout", "60")
    agent("--root", str(root), "--json", "stop")  # the test runs the agent itself, as systemd would
    assert json.loads(r.out.splitlines()[-1])["ok"], r.out + r.err
    return root


def _run_under_fake_systemd(root: Path, tmp_path: Path, seconds: float) -> tuple[list[tuple[str, dict | None]], int]:
    """Start `edgedeploy-agent run`, record (message, health.json at arrival) for `seconds`, stop it."""
    sock_path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    sock.settimeout(0.1)
    env = {**os.environ, "NOTIFY_SOCKET": sock_path, "WATCHDOG_USEC": "400000"}
    with open(tmp_path / "agent-run.log", "wb") as log:
        proc = subprocess.Popen(
            [str(BIN / "edgedeploy-agent"), "--root", str(root), "run"], env=env, stdout=log, stderr=log
        )
    got: list[tuple[str, dict | None]] = []
    try:
        deadline = time.monotonic() + 60
        ready_at = None
        while time.monotonic() < deadline and (ready_at is None or time.monotonic() < ready_at + seconds):
            try:
                msg = sock.recv(4096).decode()
            except TimeoutError:
                if proc.poll() is not None:
                    break
                continue
            health = json.loads((root / "models" / "default" / "run" / "health.json").read_text())
            got.append((msg, health))
            if "READY=1" in msg.splitlines() and ready_at is None:
                ready_at = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=20)
        try:
            while True:
                got.append((sock.recv(4096).decode(), None))
        except TimeoutError:
            pass
    finally:
        if proc.poll() is None:
            proc.kill()
        sock.close()
    return got, code


def _check(got: list[tuple[str, dict | None]], at_ready: str = "ready") -> None:
    msgs = [m for m, _ in got]
    ready = [i for i, m in enumerate(msgs) if "READY=1" in m.splitlines()]
    assert len(ready) == 1, msgs
    i = ready[0]
    # before READY: only status lines (loading); at READY the bundle is loaded and the warm-up passed
    assert all("READY=1" not in m and "WATCHDOG=1" not in m for m in msgs[:i]), msgs
    assert any(m.startswith("STATUS=loading") for m in msgs[:i]), msgs
    health = got[i][1]
    assert health and health["state"] == at_ready and health["warmup_ms"] > 0, health
    pings = [m for m in msgs[i + 1 :] if m == "WATCHDOG=1"]
    assert len(pings) >= 3, msgs  # 2 s at a 200 ms ping period
    assert msgs[-1] == "STOPPING=1", msgs


def test_ready_after_load_then_watchdog_while_idle(tmp_path: Path, mnist_bundle: Path) -> None:
    root = _deployed_root(tmp_path, mnist_bundle, source=None)
    got, code = _run_under_fake_systemd(root, tmp_path, seconds=2.0)
    assert code == 0
    _check(got)


def test_ready_then_watchdog_while_serving_frames(tmp_path: Path, mnist_bundle: Path, mnist_video) -> None:
    root = _deployed_root(tmp_path, mnist_bundle, source=looped(mnist_video.path))
    got, code = _run_under_fake_systemd(root, tmp_path, seconds=2.0)
    assert code == 0
    _check(got, at_ready="checking-frames")
    assert any(h and h["state"] == "ready" and h["inferences"] >= 3 for _, h in got[1:]), got  # then serving
    statuses = [m for m, _ in got if m.startswith("STATUS=camera up")]
    assert statuses, [m for m, _ in got]
    assert list((root / "spool").glob("*.jsonl")), "the serving agent wrote no report"


def test_no_ready_when_the_bundle_cannot_load(tmp_path: Path, mnist_bundle: Path) -> None:
    root = _deployed_root(tmp_path, mnist_bundle, source=None)
    lib = next((root / "models" / "default" / "current").glob("*.so"))
    lib.write_bytes(b"not a library")  # a broken release: load fails, READY must never be sent
    got, code = _run_under_fake_systemd(root, tmp_path, seconds=0.5)
    assert code != 0
    assert not [m for m, _ in got if "READY=1" in m], got
    assert json.loads((root / "models" / "default" / "run" / "health.json").read_text())["state"] == "failed"

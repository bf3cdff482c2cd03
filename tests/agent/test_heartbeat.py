"""A health.json whose writer is gone or hung reads as `dead`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from edgedeploy_agent.heartbeat import STALE_AFTER_S, Heartbeat, liveness, present_health


def health(pid: int, state: str = "ready") -> dict:
    return {"release": "r", "state": state, "pid": pid}


def test_a_beating_agent_is_alive_and_a_finished_one_is_not_dead(tmp_path: Path) -> None:
    Heartbeat(tmp_path).beat()
    assert liveness(tmp_path, health(os.getpid())) is None
    assert present_health(tmp_path, health(os.getpid())) == health(os.getpid())
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert liveness(tmp_path, health(int(gone.stdout), "finished")) is None  # it ended as it said


def test_a_gone_process_is_dead(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(gone.stdout)
    shown = present_health(tmp_path, health(pid))
    assert shown is not None and shown["state"] == "dead" and shown["last_state"] == "ready"
    assert shown["dead_because"] == f"process {pid} is gone"
    assert liveness(tmp_path, health(pid, "loading")) == f"process {pid} is gone"


def test_a_hung_process_is_dead_once_its_heartbeat_is_stale(tmp_path: Path) -> None:
    Heartbeat(tmp_path).beat()
    now = time.time()
    assert liveness(tmp_path, health(os.getpid()), now=now + STALE_AFTER_S - 1) is None
    why = liveness(tmp_path, health(os.getpid()), now=now + STALE_AFTER_S + 5)
    assert why is not None and why.startswith(f"no heartbeat from process {os.getpid()} for 1")
    # loading can take minutes without a beat (a TensorRT engine build): only the pid counts then
    assert liveness(tmp_path, health(os.getpid(), "loading"), now=now + 3600) is None
    assert liveness(tmp_path / "none", health(os.getpid())) == f"process {os.getpid()} never sent a heartbeat"

"""Is the agent that wrote run/health.json still there? Its pid, and a heartbeat it rewrites every second.

A process killed with SIGKILL (or by the OOM killer, or hung in a driver) cannot update health.json,
so `ready` there proves nothing by itself. The serving agent rewrites run/heartbeat (`PID UNIX_TIME`)
from its main loop; a reader on the device calls `liveness()`: the pid gone, or no beat for
STALE_AFTER_S while serving, is `dead`.

The heartbeat is not fsync'd: it describes a live process, and a reboot ends that process anyway.
"""

import os
import time
from pathlib import Path
from typing import Any, Optional

from .durable import write_atomic

BEAT_INTERVAL_S = 1.0
STALE_AFTER_S = 10.0
# Reported while a TensorRT engine is built and accepted at activation (runtime/tensorrt.py).
BUILD_STATES = ("building-engine", "engine-built", "accepting", "fallback")
# health states written while the process runs; the others (finished, stopped, failed) are final
LIVE_STATES = ("loading", *BUILD_STATES, "checking-frames", "ready")
# states in which the main loop beats (loading and engine builds can take minutes without a beat)
BEATING_STATES = ("checking-frames", "ready")


def pid_alive(pid: int) -> bool:
    """True while `pid` runs; a zombie counts as dead; another user's process (EPERM) as alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return True


class Heartbeat:
    """Written by the running agent's main loop; `beat()` is cheap enough to call on every frame."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "heartbeat"
        self._last = 0.0

    def beat(self) -> None:
        now = time.monotonic()
        if now - self._last < BEAT_INTERVAL_S:
            return
        self._last = now
        write_atomic(self.path, f"{os.getpid()} {time.time():.3f}\n", sync=False)


def read_beat(run_dir: Path) -> Optional[tuple[int, float]]:
    """(pid, unix time) of the last beat, or None."""
    try:
        pid, when = (run_dir / "heartbeat").read_text(encoding="ascii").split()
        return int(pid), float(when)
    except (FileNotFoundError, ValueError):
        return None


def liveness(run_dir: Path, health: Optional[dict[str, Any]], now: Optional[float] = None) -> Optional[str]:
    """Why the agent that wrote `health` is dead although its last state says it runs; None if it is not."""
    if not health or health.get("state") not in LIVE_STATES:
        return None
    pid = health.get("pid")
    if isinstance(pid, int) and not pid_alive(pid):
        return f"process {pid} is gone"
    if health.get("state") in BEATING_STATES:
        beat = read_beat(run_dir)
        now = time.time() if now is None else now
        if beat is None or beat[0] != pid:
            return f"process {pid} never sent a heartbeat"
        if now - beat[1] > STALE_AFTER_S:
            return f"no heartbeat from process {pid} for {now - beat[1]:.0f} s (hung?)"
    return None


def present_health(run_dir: Path, health: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """health.json as readers should see it: `dead` (with the last state and why) when its writer is gone."""
    why = liveness(run_dir, health)
    if health is None or why is None:
        return health
    return {**health, "state": "dead", "last_state": health.get("state"), "dead_because": why}

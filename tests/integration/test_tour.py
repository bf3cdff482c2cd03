"""docs/tour.md's newcomer tour, as `examples/tour.py` runs it: every step's command works on a clean machine
(build, eval, INT8, a local device, push, status, verify, logs, rollback, the pull pilot) and its time is printed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from edgedeploy.fleet_servers import servers_available
from tests.helpers import require

pytestmark = [pytest.mark.integration, pytest.mark.compile, pytest.mark.fleet_servers]
REPO = Path(__file__).resolve().parents[2]
STEPS = ("build", "eval", "INT8", "a device", "push", "status", "verify", "logs", "rollback", "pull pilot")


def test_the_tour_runs_and_times_every_step(data_dir: Path) -> None:
    """In the script's own temporary folder (every account may enter it; the servers run as mosquitto as root)."""
    require("FLEET_SERVERS", servers_available())
    p = subprocess.run(
        [sys.executable, str(REPO / "examples" / "tour.py"), "--data", str(data_dir)],
        capture_output=True, text=True, timeout=1500,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    table = p.stdout.split("wall time per step:")[1]
    timed = re.findall(r"^\s+([\d.]+) s  (.+)$", table, re.M)
    assert len(timed) == len(STEPS) + 1 and timed[-1][1] == "in all", table
    assert all(name.startswith(step) for (_, name), step in zip(timed[:-1], STEPS, strict=True)), table
    assert "cam-01: rolled back to mobilenet_v1_025-1-" in p.stdout, p.stdout
    assert re.search(r"canary\s+pilot-01\s+committed", p.stdout), p.stdout


def test_the_tour_refuses_without_the_data(tmp_path: Path) -> None:
    p = subprocess.run(
        [sys.executable, str(REPO / "examples" / "tour.py"), "--data", str(tmp_path)], capture_output=True, text=True
    )
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "--data" in p.stderr, p.stderr

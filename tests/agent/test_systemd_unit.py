"""The shipped unit passes `systemd-analyze verify` silently and scores <= 4.0 on `security --offline`."""

import os
import re
import shutil
import subprocess
from importlib.resources import files
from pathlib import Path

import pytest

from edgedeploy_agent.unit import render_unit

MAX_EXPOSURE = 4.0


@pytest.fixture
def analyze() -> str:
    exe = shutil.which("systemd-analyze")
    if exe is None:
        if os.environ.get("EDGEDEPLOY_REQUIRE_SYSTEMD_ANALYZE") == "1":
            pytest.fail("systemd-analyze is required here (apt-get install systemd)")
        pytest.skip("systemd-analyze not installed (apt-get install systemd)")
    return exe


def _unit_for_analysis(tmp_path: Path) -> Path:
    # verify insists that ExecStart exists: point it at this machine's python3, nothing else changes
    text = render_unit(exec_start=f"{shutil.which('python3')} -m edgedeploy_agent --root /var/lib/edgedeploy run")
    path = tmp_path / "edgedeploy-agent.service"
    path.write_text(text)
    return path


def test_unit_ships_in_the_agent_package() -> None:
    text = files("edgedeploy_agent").joinpath("systemd/edgedeploy-agent.service").read_text()
    for line in ("Type=notify", "WatchdogSec=", "Restart=on-failure", "User=edgedeploy", "ProtectSystem=strict"):
        assert line in text


def test_verify_prints_nothing(analyze: str, tmp_path: Path) -> None:
    p = subprocess.run([analyze, "verify", str(_unit_for_analysis(tmp_path))], capture_output=True, text=True)
    # bad values are only warnings (exit 0): any output at all is a failure
    assert p.returncode == 0 and p.stdout == "" and p.stderr == "", p.stdout + p.stderr


def test_verify_catches_a_bad_value(analyze: str, tmp_path: Path) -> None:
    """The check above can fail: a wrong value produces output."""
    unit = _unit_for_analysis(tmp_path)
    unit.write_text(unit.read_text().replace("Restart=on-failure", "Restart=sometimes"))
    p = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    assert p.returncode == 0 and "sometimes" in p.stdout + p.stderr


def test_security_exposure_is_low(analyze: str, tmp_path: Path) -> None:
    p = subprocess.run(
        [analyze, "security", "--offline=yes", "--no-pager", str(_unit_for_analysis(tmp_path))],
        capture_output=True,
        text=True,
    )
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", p.stdout)
    assert m, p.stdout + p.stderr
    assert float(m.group(1)) <= MAX_EXPOSURE, p.stdout


def test_render_substitutes_paths_and_user() -> None:
    text = render_unit(exec_start="/opt/x/bin/edgedeploy-agent --root /srv/ed run", user="cam", root="/srv/ed")
    assert "ExecStart=/opt/x/bin/edgedeploy-agent --root /srv/ed run" in text
    assert "User=cam\nGroup=cam" in text
    assert "ReadWritePaths=/srv/ed" in text
    assert "StateDirectory=edgedeploy" not in text  # only for the default /var/lib/edgedeploy

"""README command 1: the demo prints a report with latency percentiles and the accuracy it reached."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import Cli, require_sshd

pytestmark = [pytest.mark.integration, pytest.mark.compile]


@pytest.mark.parametrize("transport", [pytest.param("ssh", marks=pytest.mark.sshd), "local"])
def test_demo(cli: Cli, transport: str, data_dir: Path) -> None:
    if transport == "ssh":
        require_sshd()
    r = cli("demo", "--transport", transport, "--data", str(data_dir), timeout=600)
    assert r.code == 0, r.out + r.err
    assert ("OpenSSH server on 127.0.0.1" in r.out) == (transport == "ssh")
    assert "MLP 784-64-10" in r.out and "committed digits-mlp-1-" in r.out
    for stage in ("capture", "preprocess", "infer", "postprocess"):
        assert re.search(rf"{stage}\s+│\s+[\d.]+\s+│\s+[\d.]+\s+│\s+[\d.]+", r.out), r.out
    found = re.search(r"on the device: ([\d.]+)% top-1 over 600 video frames.*before compiling: ([\d.]+)%", r.out)
    assert found, r.out
    device, host = float(found.group(1)), float(found.group(2))
    # the compiled model on the video's frames agrees with the NumPy model on the raw digits (MJPEG may flip one)
    assert host >= 90.0 and abs(device - host) <= 0.5, r.out
    assert "power unavailable" in r.out

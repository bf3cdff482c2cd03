"""README command 1: the demo prints a report with latency percentiles and the accuracy it reached."""

from __future__ import annotations

import re

import pytest

from tests.helpers import Cli, require_sshd

pytestmark = [pytest.mark.integration, pytest.mark.compile]


@pytest.mark.parametrize("transport", [pytest.param("ssh", marks=pytest.mark.sshd), "local"])
def test_demo(cli: Cli, transport: str) -> None:
    if transport == "ssh":
        require_sshd()
    r = cli("demo", "--transport", transport, timeout=600)
    assert r.code == 0, r.out + r.err
    assert ("OpenSSH server on 127.0.0.1" in r.out) == (transport == "ssh")
    assert "MLP 64-64-10" in r.out and "committed digits-mlp-1-" in r.out
    for stage in ("capture", "preprocess", "infer", "postprocess"):
        assert re.search(rf"{stage}\s+│\s+[\d.]+\s+│\s+[\d.]+\s+│\s+[\d.]+", r.out), r.out
    acc = float(re.search(r"accuracy on the device: ([\d.]+)% top-1 over 597 video frames", r.out).group(1))
    assert acc >= 95.0
    assert "power unavailable" in r.out

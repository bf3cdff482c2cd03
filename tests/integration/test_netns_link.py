"""The network-namespace test devices survive what a killed run leaves behind.

A run killed mid-test (SIGKILL, a CI timeout) skips every `finally`: its veth and namespace stay, holding
10.77.N.0/24 under another tag, and the next run's device address routes into the dead namespace. CI failed
that way once (sshd "did not start listening on 10.77.11.2:2222" on a machine a killed run had used).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from edgedeploy.errors import EdgeDeployError
from edgedeploy.localdevice import LoopbackSshd, NetnsLink
from tests.helpers import require_sshd

pytestmark = pytest.mark.integration

INDEX = 61  # no other test uses it


def _links(index: int) -> list[str]:
    cmd = ["ip", "-4", "-o", "addr", "show", "to", f"10.77.{index}.0/24"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    return [line.split()[1].split("@")[0] for line in out.stdout.splitlines()]


@pytest.mark.sshd
def test_a_link_left_by_a_killed_run_is_replaced(netns: None, tmp_path: Path) -> None:
    require_sshd()
    stale = NetnsLink(INDEX, tag="zk").up()  # a run that died without its teardown
    link = None
    try:
        link = NetnsLink(INDEX, tag="zn").up()
        assert _links(INDEX) == [link.outer]  # the dead run's link and namespace are gone
        assert stale.ns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        with LoopbackSshd(tmp_path / "sshd", host=link.device_ip, netns=link.ns):
            pass  # listening: the address routes into the new namespace
    finally:
        stale.down_all()
        if link:
            link.down_all()


def test_a_link_in_use_by_a_live_run_is_a_clear_error(netns: None) -> None:
    live = NetnsLink(INDEX, tag="zl").up()
    proc = subprocess.Popen(["ip", "netns", "exec", live.ns, "sleep", "60"])
    try:
        with pytest.raises(EdgeDeployError, match=rf"10\.77\.{INDEX}\.0/24 is in use by {live.outer}"):
            NetnsLink(INDEX, tag="zm").up()
        assert _links(INDEX) == [live.outer]  # not taken over
    finally:
        proc.kill()
        proc.wait()
        live.down_all()

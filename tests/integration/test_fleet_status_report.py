"""`edgedeploy status` over a fleet (one device answering over real sshd, one unreachable) and
`edgedeploy report --plot`: the PNG is drawn from the reports the device really wrote."""

from __future__ import annotations

import json
import time
from pathlib import Path

import cv2
import pytest

from tests.helpers import Cli
from tests.integration.conftest import Enrolled

pytestmark = pytest.mark.integration


def _add_dead_device(cli: Cli, dev: Enrolled, name: str, tag: str) -> None:
    args = ["devices", "add", name, "--host", "127.0.0.1", "--port", "1", "--profile", "cpu-x86_64"]
    r = cli(*args, "--tags", tag, *dev.args())
    assert r.code == 0, r.err


def _push_and_wait(cli: Cli, dev: Enrolled, bundle: Path) -> None:
    assert cli("push", dev.name, str(bundle), *dev.args()).code == 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        facts = json.loads(cli("devices", "facts", dev.name, "--json", *dev.args()).out)
        if facts["healthy_release"] and not facts["running"]:
            return
        time.sleep(0.3)
    raise AssertionError("agent did not finish the video")


def test_fleet_status_partial_failure_then_plot(cli: Cli, device: Enrolled, mnist_bundle: Path, tmp_path: Path) -> None:
    _push_and_wait(cli, device, mnist_bundle)
    _add_dead_device(cli, device, "dead1", "lab")

    r = cli("status", "--json", *device.args())
    assert r.code == 5, r.err  # one answered, one did not: partial
    fleet = json.loads(r.out)
    assert set(fleet["devices"]) == {device.name} and set(fleet["failed"]) == {"dead1"}
    latest = fleet["devices"][device.name]["latest"]
    assert latest["frames"] > 0 and latest["camera_up"] is True
    assert sum(latest["latency_hist"]["infer"]) == latest["frames"]
    assert "127.0.0.1" in fleet["failed"]["dead1"]["error"] or "dead1" in fleet["failed"]["dead1"]["error"]

    table = cli("status", *device.args())
    assert table.code == 5 and device.name in table.out and "UNREACHABLE" in table.out

    only_dead = cli("status", "--group", "lab", *device.args())
    assert only_dead.code == 1 and "dead1" in only_dead.out  # every selected device failed
    assert cli("status", "--group", "nope", *device.args()).code == 2  # no such devices: bad input

    png = tmp_path / "out" / "dev1.png"
    r = cli("report", device.name, "--plot", str(png), "--offline", "--json", *device.args())
    assert r.code == 0, r.err
    drawn = json.loads(r.out)
    assert drawn["frames"]["infer"] >= 300 and drawn["power_points"] == 0  # no sensor here: nothing drawn
    img = cv2.imread(str(png))
    assert img is not None and img.shape[0] > 500 and img.shape[1] > 500


def test_report_without_reports_is_one_clear_line(cli: Cli, device: Enrolled, tmp_path: Path) -> None:
    r = cli("report", device.name, "--plot", str(tmp_path / "x.png"), "--offline", *device.args())
    assert r.code == 2 and "no reports stored yet" in r.err and "Traceback" not in r.err

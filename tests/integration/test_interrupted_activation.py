"""A device finishes an activation its lost connection cut off, by itself, with no host contact (issue 40, item
10): the SSH session is killed (sshd SIGKILLed) during the health check of a push, and later a device "reboots"
with a transition left in `activating` and its service stopped. Each time the device ends committed (or rolled
back) with its service serving real frames, within a deadline, and sshd stays down throughout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from edgedeploy.errors import EdgeDeployError
from edgedeploy.inventory import Inventory
from edgedeploy.remote.connect import connected
from edgedeploy_agent.bundle import read_manifest
from edgedeploy_agent.store import DeviceStore
from tests.helpers import Cli
from tests.integration.conftest import AGENT, Enrolled
from tests.integration.netfleet import padded_bundle
from tests.integration.pushes import current, push_ok

pytestmark = pytest.mark.integration

DEADLINE_S = 120  # the service looks every 10 s; the finisher's health check on real frames takes seconds


def _state(dev: Enrolled) -> dict:
    return json.loads((dev.root / "models" / "default" / "state.json").read_text())


def _health(dev: Enrolled) -> dict:
    try:
        return json.loads((dev.root / "models" / "default" / "run" / "health.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}


def _settled_and_serving(dev: Enrolled, timeout: float) -> dict:
    """Wait until no transition is pending and the current release serves real frames."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        state, health = _state(dev), _health(dev)
        if (
            state["pending"] is None
            and state["current"]
            and health.get("release") == state["current"]
            and health.get("state") in ("ready", "finished")
            and (health.get("inferences") or 0) > 0
        ):
            return state
        time.sleep(0.5)
    log = (dev.root / "logs" / "agent.log").read_text(errors="replace")[-3000:]
    raise AssertionError(f"not settled within {timeout} s: {_state(dev)['pending']} {_health(dev)}\n{log}")


def _kill_deploy(upload: Path) -> None:
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"deploy" in argv and str(upload).encode() in argv:
            os.kill(int(proc.name), 9)
            end = time.monotonic() + 10
            while proc.exists() and time.monotonic() < end:  # gone, so its service is no child of sshd's
                time.sleep(0.01)
    time.sleep(0.5)


def test_a_session_killed_in_the_health_check_is_finished_by_the_device(
    cli: Cli, looping: Enrolled, mnist_bundle: Path, tmp_path: Path
) -> None:
    device = looping  # a camera-like source: its service keeps looking for an interrupted transition (10 s)
    push_ok(cli, device, mnist_bundle)
    new_bundle = padded_bundle(mnist_bundle, tmp_path / "new.edb", 4096, version="10")
    new = read_manifest(new_bundle).release_name
    upload = device.root / "incoming" / new_bundle.name
    shutil.copyfile(new_bundle, upload)  # the device is this machine: as if uploaded
    inv = Inventory.load(device.inventory)
    errors: list[Exception] = []

    def deploy_over_ssh() -> None:
        try:
            with connected(inv.get(device.name), inv.known_hosts) as t:
                # objectives the host asks for (and that would hold the health check a long time)
                t.run([AGENT, "--root", str(device.root), "--json", "deploy", str(upload), "--min-inferences",
                       "1000000", "--timeout", "120"], timeout=180)  # fmt: skip
        except EdgeDeployError as e:  # the session is killed under it
            errors.append(e)

    session = threading.Thread(target=deploy_over_ssh)
    session.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and session.is_alive():
        if (_state(device).get("pending") or {}).get("state") == "health-check":
            break
        time.sleep(0.005)
    # the deploy dies with its session (SIGKILL: nothing of it runs on); the service it restarted runs on, as a
    # systemd unit does (killing sshd's whole process tree would take the process-mode service along: that
    # case, the service stopped, is the next test); then sshd goes too: no host from here on
    _kill_deploy(upload)
    device.sshd.kill()
    session.join(timeout=60)
    assert (_state(device)["pending"] or {}).get("state") == "health-check", _state(device)["pending"]

    state = _settled_and_serving(device, DEADLINE_S)  # sshd stays down: no host contact
    events = [h["event"] for h in state["history"]]
    # the bundle sets no objectives of its own (the host's --min-inferences left with the host), and the
    # looping clip serves real frames: the device's own health check passes, so it commits the new release
    assert state["current"] == new and "committed-after-interruption" in events, (state["current"], events)
    assert current(device) == new


def test_a_device_that_boots_into_an_interrupted_activation_finishes_it(
    cli: Cli, device: Enrolled, mnist_bundle: Path, tmp_path: Path
) -> None:
    """As a push killed between `activating` and the restart leaves it: `current` switched, the transition
    pending, the service stopped. The service starting (as systemd starts it at boot) finishes it."""
    push_ok(cli, device, mnist_bundle)
    old = read_manifest(mnist_bundle).release_name
    new_bundle = padded_bundle(mnist_bundle, tmp_path / "new.edb", 4096, version="11")
    new = read_manifest(new_bundle).release_name
    push_ok(cli, device, new_bundle)  # both releases on the device
    device.sshd.kill()  # and no host from here on
    assert subprocess.run([AGENT, "--root", str(device.root), "--json", "stop"], capture_output=True).returncode == 0

    store = DeviceStore(device.root)
    state = store.state()
    state["pending"] = {"kind": "deploy", "release": old, "from": new, "state": "activating", "started": "x"}
    store.save_state(state)
    store.activate(old)

    # the boot: the service starts, as process mode starts it (systemd mode: its unit)
    boot = "import sys; from pathlib import Path; from edgedeploy_agent.service import ProcessService; "
    boot += "from edgedeploy_agent.store import DeviceStore; ProcessService(DeviceStore(Path(sys.argv[1]))).restart()"
    subprocess.run([sys.executable, "-c", boot, str(device.root)], check=True)
    state = _settled_and_serving(device, DEADLINE_S)
    assert state["current"] == old and current(device) == old
    assert "committed-after-interruption" in [h["event"] for h in state["history"]]

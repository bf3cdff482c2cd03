"""Healthy means serving (issue 18), against a real sshd and a real agent playing a real video: a bundle
that crashes on its first real frame is rolled back by a plain push, a silent source is named as such,
a refused push leaves no byte behind, a killed agent is `dead`, and an agent killed mid-deploy is
reported as killed, not as a lost connection."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from edgedeploy_agent.bundle import read_manifest
from tests.helpers import Cli, Ran, agent, assert_one_line_error
from tests.integration.bundles import crashing_on_real_frames
from tests.integration.conftest import Enrolled, add_device
from tests.integration.netfleet import padded_bundle

pytestmark = pytest.mark.integration


def push(cli: Cli, dev: Enrolled, bundle: Path, *args: str) -> Ran:
    return cli("push", dev.name, str(bundle), *args, *dev.args())


def current(dev: Enrolled) -> str:
    return (dev.root / "models" / "default" / "current").resolve().name


def facts(cli: Cli, dev: Enrolled) -> dict:
    r = cli("devices", "facts", dev.name, "--json", *dev.args())
    assert r.code == 0, r.err
    return json.loads(r.out)


def test_a_bundle_crashing_on_the_first_real_frame_is_rolled_back_by_a_plain_push(
    cli: Cli, device: Enrolled, mnist_bundle: Path, tmp_path: Path
) -> None:
    assert push(cli, device, mnist_bundle).code == 0
    good = read_manifest(mnist_bundle).release_name
    r = push(cli, device, crashing_on_real_frames(mnist_bundle, tmp_path / "crash.edb"))
    assert_one_line_error(r, 4, "failed its health check: frame 0 from file:")
    assert "preprocessing" in r.err or "inference" in r.err, r.err
    print(r.err)  # for the closing note: the line a technician sees
    assert "rolled back" in r.err and good in r.err
    assert current(device) == good
    f = facts(cli, device)
    assert f["healthy_release"] == good and f["health_state"] in ("ready", "finished"), f  # the clip plays once


def test_a_source_that_delivers_nothing_is_source_unavailable(
    cli: Cli, sshd, tmp_path: Path, mnist_bundle: Path
) -> None:
    silent = tmp_path / "no-camera.avi"  # a live source that is not there: reconnects, never a frame
    dev = add_device(cli, sshd, tmp_path / "f" / "devices.toml", tmp_path / "root", source=f"file:{silent}?live=1")
    assert cli("devices", "enroll", dev.name, "--yes", *dev.args()).code == 0
    try:
        r = push(cli, dev, mnist_bundle, "--timeout", "5")
        assert_one_line_error(r, 4, "could not be shown serving: source file:")
        assert "delivered 0 of the 3 frames" in r.err and "back on no bundle" in r.err
        assert "health check" not in r.err.split("hint:")[-1] and "camera" in r.err  # the hint names the source
        assert not (dev.root / "models" / "default" / "current").exists()
    finally:
        agent("--root", str(dev.root), "--json", "stop")


def test_a_killed_agent_shows_as_dead_at_once(cli: Cli, looping: Enrolled, mnist_bundle: Path) -> None:
    assert push(cli, looping, mnist_bundle).code == 0
    health = json.loads((looping.root / "models" / "default" / "run" / "health.json").read_text())
    assert health["state"] == "ready" and facts(cli, looping)["health_state"] == "ready"

    os.kill(health["pid"], signal.SIGKILL)
    f = facts(cli, looping)
    assert f["health_state"] == "dead" and f["healthy_release"] is None and f["running"] is False, f
    assert (
        json.loads((looping.root / "models" / "default" / "run" / "health.json").read_text())["state"] == "ready"
    )  # its last word
    r = cli("status", looping.name, *looping.args())
    assert r.code == 0 and "agent dead" in r.out, r.out + r.err


def disk_usage(root: Path) -> dict[str, int]:
    """Every file under the device root except the agent's log and its (empty) lock files, with its size."""
    return {
        str(p.relative_to(root)): p.stat().st_size
        for p in root.rglob("*")
        if p.is_file() and p.name != "agent.log" and not p.name.endswith(".lock")
    }


def test_a_refused_push_leaves_the_disk_as_it_was(
    cli: Cli, device: Enrolled, mnist_bundle: Path, tmp_path: Path
) -> None:
    r = cli("keys", "generate", "fleet-1")
    assert r.code == 0, r.err
    assert cli("keys", "install", device.name, *device.args()).code == 0  # the device pins a key
    signed = tmp_path / "signed.edb"
    assert cli("sign", str(mnist_bundle), "--key", "fleet-1", "-o", str(signed)).code == 0
    assert push(cli, device, signed).code == 0
    facts(cli, device)
    before = disk_usage(device.root)

    big = padded_bundle(mnist_bundle, tmp_path / "big.edb", 3 << 20, version="9")  # unsigned, 3 MB more
    assert_one_line_error(push(cli, device, big), 4, "is not signed")
    facts(cli, device)
    assert disk_usage(device.root) == before
    r = agent("--root", str(device.root), "--json", "deploy", str(copy_into(big, device.root / "incoming")))
    assert json.loads(r.out)["error"]["code"] == "unsigned-bundle"
    assert disk_usage(device.root) == before  # `deploy FILE`: the refused upload is gone too


def copy_into(src: Path, folder: Path) -> Path:
    out = folder / src.name
    out.write_bytes(src.read_bytes())
    return out


def _deploy_pid(root: Path) -> int | None:
    """The `edgedeploy-agent ... deploy` process working on this device root (ours: the test started it)."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(root).encode() in argv and b"deploy" in argv:
            return int(d.name)
    return None


def test_an_agent_killed_mid_deploy_is_reported_as_killed_not_as_a_lost_link(
    cli: Cli, looping: Enrolled, mnist_bundle: Path, tmp_path: Path
) -> None:
    device = looping
    assert push(cli, device, mnist_bundle).code == 0
    old = read_manifest(mnist_bundle).release_name
    v2 = padded_bundle(mnist_bundle, tmp_path / "v2.edb", 4096, version="9")
    result: list[Ran] = []
    # the health check waits for more frames than its timeout allows: the deploy runs when it is killed
    pushing = threading.Thread(
        target=lambda: result.append(push(cli, device, v2, "--min-inferences", "10000000", "--timeout", "120"))
    )
    pushing.start()
    deadline, pid = time.monotonic() + 120, None
    while time.monotonic() < deadline and pushing.is_alive():  # bounded wait for the health check to start
        pending = json.loads((device.root / "models" / "default" / "state.json").read_text())["pending"]
        if pending and pending["state"] == "health-check":
            pid = _deploy_pid(device.root)
            break
        time.sleep(0.01)
    assert pid is not None, "the deploy finished before it could be killed"
    os.kill(pid, signal.SIGKILL)  # the OOM killer, say; sshd and the link stay up
    pushing.join(timeout=120)
    r = result[0]
    assert_one_line_error(r, 4, "the agent was killed on the device while running `deploy` (the SSH link is up)")
    assert "connection lost" not in r.err
    assert f"read back: the device is on {old}" in r.err, r.err
    assert current(device) == old
    state = json.loads((device.root / "models" / "default" / "state.json").read_text())
    assert state["pending"] is None and state["history"][-1]["event"] == "recovered"

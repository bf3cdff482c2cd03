"""What a technician meets on a bad day, against a real sshd: every failure is one clear line and the
device keeps a working bundle."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from pathlib import Path

import paramiko
import pytest

from edgedeploy.errors import EdgeDeployError
from edgedeploy.inventory import Inventory
from edgedeploy.remote.connect import connected
from edgedeploy_agent.bundle import read_manifest
from tests.agent.bundles import make_bundle
from tests.helpers import Cli, agent, assert_one_line_error, mount_tmpfs
from tests.integration.conftest import AGENT, Enrolled, add_device
from tests.integration.netfleet import padded_bundle
from tests.integration.pushes import current, push_ok

pytestmark = pytest.mark.integration


def test_changed_host_key_is_refused_until_reenrolled(cli: Cli, device: Enrolled, mnist_bundle: Path) -> None:
    known = device.inventory.parent / "known_hosts"
    keys = paramiko.HostKeys(str(known))
    entry = f"[127.0.0.1]:{device.sshd.port}"
    del keys[entry]
    keys.add(entry, "ssh-ed25519", paramiko.Ed25519Key.from_private_key_file(str(device.sshd.client_key)))
    keys.save(str(known))  # now a different key is pinned: as if the device were replaced
    r = cli("push", device.name, str(mnist_bundle), *device.args())
    assert_one_line_error(r, 3, "HOST KEY CHANGED")
    assert "--replace" in r.err
    assert_one_line_error(cli("devices", "enroll", device.name, "--yes", *device.args()), 3, "is pinned")
    assert cli("devices", "enroll", device.name, "--yes", "--replace", *device.args()).code == 0
    push_ok(cli, device, mnist_bundle)


def test_unenrolled_device_is_refused(cli: Cli, sshd, tmp_path: Path, mnist_bundle: Path) -> None:
    dev = add_device(cli, sshd, tmp_path / "other" / "devices.toml", tmp_path / "root2")
    assert_one_line_error(cli("push", dev.name, str(mnist_bundle), *dev.args()), 3, "not pinned")


def test_wrong_enroll_fingerprint_pins_nothing(cli: Cli, sshd, tmp_path: Path) -> None:
    dev = add_device(cli, sshd, tmp_path / "f" / "devices.toml", tmp_path / "root3")
    r = cli("devices", "enroll", dev.name, "--fingerprint", "SHA256:AAAA", *dev.args())
    assert_one_line_error(r, 3, "you expected SHA256:AAAA")
    assert not (tmp_path / "f" / "known_hosts").exists()


def test_broken_bundle_rolls_back_to_the_previous_one(
    cli: Cli, device: Enrolled, mnist_bundle: Path, tmp_path: Path
) -> None:
    push_ok(cli, device, mnist_bundle)
    good = read_manifest(mnist_bundle).release_name
    broken = make_bundle(tmp_path / "broken", lib_bytes=b"\x7fELF but not a library")  # valid hashes
    r = cli("push", device.name, str(broken), *device.args())
    assert_one_line_error(r, 4, "failed its health check")
    assert "rolled back" in r.err and good in r.err
    assert current(device) == good
    facts = json.loads(cli("devices", "facts", device.name, "--json", *device.args()).out)
    assert facts["current_release"] == good and facts["healthy_release"] == good


def test_tampered_bundle_is_refused_by_host_and_device(
    cli: Cli, device: Enrolled, mnist_bundle: Path, tmp_path: Path
) -> None:
    push_ok(cli, device, mnist_bundle)
    raw = bytearray(mnist_bundle.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    bad = tmp_path / "tampered.edb"
    bad.write_bytes(bytes(raw))
    assert_one_line_error(cli("push", device.name, str(bad), *device.args()), 2, "tampered.edb")
    # the agent refuses it on its own too (a host that skipped the check, or a bad link)
    r = agent("--root", str(device.root), "--json", "deploy", str(bad))
    res = json.loads(r.out)
    assert r.code != 0 and res["ok"] is False and res["error"]["code"] == "bad-bundle"
    assert current(device) == read_manifest(mnist_bundle).release_name


def test_bundle_for_another_profile(cli: Cli, device: Enrolled, tmp_path: Path) -> None:
    arm = make_bundle(tmp_path / "arm", arch="aarch64", profile="xavier-agx")
    assert_one_line_error(
        cli("push", device.name, str(arm), *device.args()),
        2,
        "bundle is for profile xavier-agx, device dev1 is cpu-x86_64",
    )


def test_full_disk_is_detected_before_upload(cli: Cli, sshd, tmp_path: Path, mnist_bundle: Path) -> None:
    root = tmp_path / "small"
    root.mkdir()
    mount_tmpfs(root, "4m")
    try:
        dev = add_device(cli, sshd, tmp_path / "s" / "devices.toml", root)
        assert cli("devices", "enroll", dev.name, "--yes", *dev.args()).code == 0
        r = cli("push", dev.name, str(mnist_bundle), *dev.args())
        assert_one_line_error(r, 4, "not enough disk")
        assert not list((root / "incoming").iterdir())
    finally:
        subprocess.run(["umount", "-l", str(root)])


def test_session_killed_while_the_device_stages_leaves_nothing_behind(
    cli: Cli, device: Enrolled, mnist_bundle: Path, tmp_path: Path
) -> None:
    """The deploy dies with its SSH session mid-unpack (SIGKILL: no cleanup runs); the next contact's
    recovery removes releases/.tmp-<release> and the device stays on its previous release."""
    push_ok(cli, device, mnist_bundle)
    old = read_manifest(mnist_bundle).release_name
    big = padded_bundle(mnist_bundle, tmp_path / "big.edb", 64 << 20, version="9")  # unpacking takes a while
    upload = device.root / "incoming" / big.name
    shutil.copyfile(big, upload)  # the device is this machine: as if uploaded
    inv = Inventory.load(device.inventory)
    errors: list[Exception] = []

    def deploy_over_ssh() -> None:
        try:
            with connected(inv.get(device.name), inv.known_hosts) as t:
                t.run([AGENT, "--root", str(device.root), "--json", "deploy", str(upload)], timeout=120)
        except EdgeDeployError as e:  # the session is killed under it
            errors.append(e)

    session = threading.Thread(target=deploy_over_ssh)
    session.start()
    staging = device.root / "models" / "default" / "releases" / f".tmp-{read_manifest(big).release_name}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and session.is_alive():  # bounded wait for the unpack to start
        if staging.is_dir() and any(staging.iterdir()):
            break
        time.sleep(0.005)
    device.sshd.kill()  # the session and the agent command in it die
    session.join(timeout=60)
    assert staging.is_dir(), "the deploy finished before its session could be killed"
    assert (
        errors
        and json.loads((device.root / "models" / "default" / "state.json").read_text())["pending"]["state"] == "staged"
    )

    device.sshd.start()
    r = cli("devices", "facts", device.name, *device.args())  # facts report the interruption, change nothing
    assert r.code == 0, r.err
    assert "current_release" in r.out and old in r.out and "staged" in r.out  # a table without --json
    assert staging.exists()
    push_ok(cli, device, mnist_bundle)  # the next push recovers the device first, then deploys
    assert not staging.exists() and not list((device.root / "models" / "default" / "releases").glob(".tmp-*"))
    state = json.loads((device.root / "models" / "default" / "state.json").read_text())
    assert state["pending"] is None and "recovered" in [h["event"] for h in state["history"]]

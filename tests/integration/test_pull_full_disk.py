"""A full disk is a refusal (issue 40, item 3): a pull checks the bundle's size (the OCI manifest's sizes) against
the free space of the device root before the first byte, refuses with `no-space` naming both, keeps no `.part`
that cannot complete, and the watch survives a disk filled to the last byte (its own state write fails) and
deploys once there is room again. Real registry, real broker, a real watch with its root on a 40 MiB tmpfs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from edgedeploy.publish import RegistryClient, oci_manifest, publish
from edgedeploy.remote.blobs import bundle_blobs
from edgedeploy.remote.mqtt import Controller, MqttSettings, desired_payload
from edgedeploy_agent.bundle import read_manifest
from edgedeploy_agent.desired import DesiredHealth
from tests.conftest import require
from tests.helpers import Cli, agent
from tests.integration.netfleet import padded_bundle
from tests.integration.pullfleet import PUBLISHER, PullFleet, signed

pytestmark = pytest.mark.integration


def _mount_tmpfs(root: Path, size: str) -> None:
    """Mount a tmpfs over `root`, keeping what is in it (the device's config, keys, watch.json)."""
    keep = root.parent / f".{root.name}-keep"
    shutil.copytree(root, keep, symlinks=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(root)], capture_output=True)
    if r.returncode != 0:
        shutil.rmtree(keep)
        require("TMPFS", f"cannot mount a tmpfs here (root and mount(8) needed): {r.stderr.decode().strip()}")
    shutil.copytree(keep, root, symlinks=True, dirs_exist_ok=True)
    shutil.rmtree(keep)


def _fill(root: Path) -> Path:
    """Write a filler file until the disk refuses another byte."""
    filler = root / "filler"
    with open(filler, "wb", buffering=0) as f:
        block = b"\0" * (1 << 20)
        try:
            while True:
                f.write(block)
        except OSError:
            pass
        try:
            while True:
                f.write(b"\0" * 512)
        except OSError:
            pass
    return filler


def test_a_full_disk_is_a_refusal_and_the_watch_keeps_running(
    cli: Cli, pull_fleet: PullFleet, mnist_bundle: Path, tmp_path: Path, hermetic: Path
) -> None:
    fleet = pull_fleet
    dev = fleet.devices["dev2"]
    small = signed(cli, mnist_bundle, tmp_path / "small.edb")
    big = signed(cli, padded_bundle(mnist_bundle, tmp_path / "big.edb", 48 << 20, version="48m"), tmp_path / "b.edb")
    repo = f"{fleet.origin.address}/models/mnist"
    small_ref = publish(small, repo, user=PUBLISHER[0], password=PUBLISHER[1]).ref
    big_ref = publish(big, repo, user=PUBLISHER[0], password=PUBLISHER[1]).ref

    # an artifact whose manifest claims a 10 TiB layer (a blob the registry has, its size a lie)
    blobs = bundle_blobs(small)
    doc = json.loads(oci_manifest(blobs))
    doc["layers"][-1]["size"] = 10 << 40
    digest = RegistryClient(fleet.origin.address, "models/mnist", *PUBLISHER).put_manifest(
        "huge", json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    )
    huge_ref = f"{repo}@{digest}"

    _mount_tmpfs(dev.root, "40m")
    try:
        fleet.start("dev2")
        settings = MqttSettings(
            broker=fleet.broker.controller_address, password_file=str(hermetic / "config" / "mqtt-controller")
        )
        health = DesiredHealth(timeout_s=60)
        serial = [200]
        incoming = dev.root / "blobs" / "incoming"

        def send(c: Controller, ref: str, release: str) -> dict:
            serial[0] += 1
            s = serial[0]
            c.statuses.pop("dev2", None)
            c.publish_desired("dev2", desired_payload("rollout-1", "dev2", ref, release, "t", 0, s, health=health))
            return c.wait_status(
                "dev2",
                lambda st: st.get("state") in ("committed", "refused", "rolled-back") and st.get("serial") == s,
                120,
            )

        with Controller(settings, client_id="test-controller") as c:
            for ref, what in ((huge_ref, "10 TiB layer"), (big_ref, "48 MiB bundle on a 40 MiB disk")):
                free_before = shutil.disk_usage(dev.root).free
                st = send(c, ref, "x")
                assert (st["state"], st.get("code")) == ("refused", "no-space"), (what, st, dev.log())
                assert "needs" in st["message"] and "free" in st["message"], st
                assert not list(incoming.glob("*.part")), (what, list(incoming.iterdir()))
                # before the first byte: nothing of the big layers landed
                assert shutil.disk_usage(dev.root).free >= free_before - (1 << 20), what
                assert dev.proc is not None and dev.proc.poll() is None, dev.log()
            assert dev.current() is None

            # the disk full to the last byte: even the watch's own state write fails; it reports, not dies
            filler = _fill(dev.root)
            st = send(c, small_ref, read_manifest(small).release_name)
            assert (st["state"], st.get("code")) == ("refused", "no-space"), (st, dev.log())
            time.sleep(2)
            assert dev.proc is not None and dev.proc.poll() is None, dev.log()
            assert "Traceback" not in dev.log(), dev.log()

            # room again: the next document deploys
            os.unlink(filler)
            st = send(c, small_ref, read_manifest(small).release_name)
            assert st["state"] == "committed", (st, dev.log())
            assert dev.current() == read_manifest(small).release_name
    finally:
        fleet.stop("dev2")
        agent("--root", str(dev.root), "--json", "stop")  # the service runs from the tmpfs
        subprocess.run(["umount", "-l", str(dev.root)], capture_output=True)

"""A newer desired document pre-empts a download in progress (issue 40, item 6): a hostile registry endpoint
trickles one blob at 1 byte per 0.5 s (well under the 30 s read timeout, so the download never fails by itself);
a rollback sent meanwhile is acted on within seconds, the trickled blob's `.part` stays for a resume, and the
watch keeps running. Real broker, real registry behind the trickling proxy, a real `edgedeploy-agent watch`."""

from __future__ import annotations

import http.server
import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from edgedeploy.publish import publish
from edgedeploy.remote.blobs import bundle_blobs
from edgedeploy.remote.mqtt import Controller, MqttSettings, desired_payload
from edgedeploy_agent.bundle import read_manifest
from edgedeploy_agent.desired import DesiredHealth
from tests.helpers import Cli
from tests.integration.netfleet import padded_bundle
from tests.integration.pullfleet import PUBLISHER, LoopbackHTTP, PullFleet, signed, wait_for

pytestmark = pytest.mark.integration


class TrickleRegistry(LoopbackHTTP):
    """In front of a registry endpoint: every request passes through, except the body of blob `trickle`,
    sent one byte per `interval` s (headers at once, so the client's read timeout never fires)."""

    def __init__(self, upstream: str, interval: float = 0.5) -> None:
        self.upstream, self.interval = upstream, interval
        self.trickle: str | None = None
        self.trickled = 0  # bytes of the trickled blob sent
        self.closing = threading.Event()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a: object) -> None:
                return None

            def do_GET(self) -> None:
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("accept", "range")}
                try:
                    up = urllib.request.urlopen(urllib.request.Request(proxy.upstream + self.path, headers=headers))
                except urllib.error.HTTPError as e:
                    up = e
                body = up.read()
                self.send_response(up.status)
                for k, v in up.headers.items():
                    if k.lower() in ("content-type", "content-range", "docker-content-digest"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not (proxy.trickle and proxy.trickle in self.path and "/blobs/" in self.path):
                    self.wfile.write(body)
                    return
                try:
                    for i in range(len(body)):
                        if proxy.closing.wait(proxy.interval):
                            return
                        self.wfile.write(body[i : i + 1])
                        self.wfile.flush()
                        proxy.trickled += 1
                except OSError:
                    return  # the client went away

        super().__init__(Handler)

    def __exit__(self, *exc: object) -> None:
        self.closing.set()  # the trickling handler stops first
        super().__exit__(*exc)


def test_a_rollback_pre_empts_a_trickling_download(
    cli: Cli, pull_fleet: PullFleet, mnist_bundle: Path, tmp_path: Path, hermetic: Path
) -> None:
    fleet = pull_fleet
    dev = fleet.devices["dev1"]
    a = signed(cli, mnist_bundle, tmp_path / "a.edb")
    b = signed(cli, padded_bundle(mnist_bundle, tmp_path / "b-pad.edb", 256 << 10, version="pad"), tmp_path / "b.edb")
    repo = f"{fleet.origin.address}/models/mnist"
    ref_a = publish(a, repo, user=PUBLISHER[0], password=PUBLISHER[1]).ref
    ref_b = publish(b, repo, user=PUBLISHER[0], password=PUBLISHER[1]).ref
    release_a, release_b = read_manifest(a).release_name, read_manifest(b).release_name
    pad = max(bundle_blobs(b).blobs, key=lambda x: x.size).sha256  # b's own big blob (a lacks it)

    settings = MqttSettings(
        broker=fleet.broker.controller_address, password_file=str(hermetic / "config" / "mqtt-controller")
    )
    health = DesiredHealth(timeout_s=60)
    with TrickleRegistry(fleet.readonly.url) as registry:
        cfg_path = dev.root / "watch.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["registry_url"] = registry.url
        cfg_path.write_text(json.dumps(cfg))
        fleet.start("dev1")
        with Controller(settings, client_id="preempt-test") as c:

            def send(ref: str, release: str, rollout: str, serial: int, **kw: str) -> None:
                doc = desired_payload("rollout-1", "dev1", ref, release, rollout, 0, serial, health=health, **kw)  # type: ignore[arg-type]
                c.publish_desired("dev1", doc)

            def final(serial: int, timeout: float) -> dict:
                terminal = ("committed", "refused", "rolled-back")
                return c.wait_status(
                    "dev1", lambda st: st.get("state") in terminal and st.get("serial") == serial, timeout
                )

            send(ref_a, release_a, "r1", 301)
            st = final(301, 120)
            assert st["state"] == "committed" and dev.current() == release_a, (st, dev.log())

            registry.trickle = pad
            send(ref_b, release_b, "r2", 302)
            wait_for(lambda: registry.trickled >= 4, 60)  # b's big blob is trickling in

            started = time.monotonic()
            send(ref_a, release_a, "r2", 303, action="rollback")
            st = final(303, 30)
            took = time.monotonic() - started
            assert st["state"] == "committed", (st, dev.log())
            assert took < 8, f"the rollback waited {took:.1f} s behind the download"
            assert dev.current() == release_a
            part = dev.root / "blobs" / "incoming" / f"{pad}.part"
            assert part.exists() and 0 < part.stat().st_size < 256 << 10  # kept for a resume
            sent = registry.trickled
            time.sleep(2)
            assert registry.trickled <= sent + 1, "the pre-empted download still reads"
            assert dev.proc is not None and dev.proc.poll() is None, dev.log()
            assert "pre-empted" in dev.log(), dev.log()

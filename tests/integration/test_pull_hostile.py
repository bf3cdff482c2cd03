"""Hostile and unlucky MQTT messages against a real mosquitto (issue 40 items 1, 2, 7, 8): a device that writes
its status as deep nesting, as JSON that is not an object, as a huge string or as rich markup is `unreadable`
and nothing else (the controller's MQTT thread, `status --via mqtt`, `rollout --via mqtt` and its dry run go on
for the others, never exit 70); a deeply nested desired document is refused and never crash-loops the watch; a
refusal names its serial and ends the controller's wait at once; serials follow the devices, not a clock."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from edgedeploy.fleet_servers import CONTROLLER, LocalBroker, LocalRegistry, servers_available
from edgedeploy.publish import publish
from edgedeploy.remote.mqtt import Controller, MqttSettings, desired_payload
from edgedeploy.signing import generate_key, sign_bundle
from edgedeploy_agent.bundle import canonical_json, read_manifest
from edgedeploy_agent.desired import DesiredHealth, desired_topic, status_doc, status_topic
from tests.agent.bundles import make_bundle
from tests.helpers import Cli, require
from tests.integration.pullfleet import PUBLISHER, PullFleet, signed, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.fleet_servers]

HOSTILE_STATUSES = {
    "deep list": b"[" * 100000,
    "deep list within the size limit": b"[" * 60000,
    "a list": b"[1, 2]",
    "a string": b'"text"',
    "null": b"null",
    "a huge string": json.dumps({"device": "evil", "state": "idle", "release": "x" * (1 << 20)}).encode(),
    "wrong types": b'{"device": "evil", "state": "committed", "serial": "1", "progress": "all"}',
    "another device's name": status_doc("good", "committed", release="r1"),
    "not UTF-8": b'{"device": "evil", "state": "\xff"}',
}
# readable, but every text in it is rich markup that would raise in a table or a rollout line
MARKUP_STATUS = status_doc("evil", "refused", release="[/]", code="[bold", message="[/x] [link=", rollout="[/]")


class DeviceClient:
    """A device's broker account used by hand: it may write only its own status topic (the ACL)."""

    def __init__(self, broker: LocalBroker, name: str) -> None:
        self.name = name
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"{name}-by-hand", protocol=mqtt.MQTTv311)
        self.client.username_pw_set(name, broker.devices[name])
        self.client.connect(broker.host, broker.port)
        self.client.loop_start()

    def status(self, payload: bytes) -> None:
        self.client.publish(status_topic(self.name), payload, qos=1, retain=True).wait_for_publish(10)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def _controller(broker: LocalBroker, home: Path) -> MqttSettings:
    pw = home / "config" / "mqtt-controller"
    pw.parent.mkdir(parents=True, exist_ok=True)
    pw.write_text(broker.controller_password)
    return MqttSettings(broker=broker.controller_address, username=CONTROLLER, password_file=str(pw))


@pytest.fixture
def two_devices(hermetic: Path, tmp_path: Path) -> Iterator[tuple[LocalBroker, Path]]:
    """A real broker with devices `good` and `evil`, fleet.toml and an inventory naming both (tag lab)."""
    require("FLEET_SERVERS", servers_available())
    with LocalBroker({"good": "good-pw", "evil": "evil-pw"}, "ctl-pw") as broker:
        settings = _controller(broker, hermetic)
        generate_key("rollout-1")
        (hermetic / "config" / "fleet.toml").write_text(
            f'[mqtt]\nbroker = "{broker.controller_address}"\nusername = "{CONTROLLER}"\npassword_file = '
            f'"{settings.password_file}"\n[rollout]\nkey = "rollout-1"\nexpires_hours = 1\n'
        )
        inv = tmp_path / "devices.toml"
        inv.write_text(
            "".join(
                f'[devices.{n}]\nhost = "127.0.0.1"\nprofile = "cpu-x86_64"\ntags = ["lab"]\ntransport = "local"\n'
                for n in ("good", "evil")
            )
        )
        yield broker, inv


def test_one_device_cannot_blind_the_controller(
    cli: Cli, two_devices: tuple[LocalBroker, Path], hermetic: Path
) -> None:
    broker, inv = two_devices
    good, evil = DeviceClient(broker, "good"), DeviceClient(broker, "evil")
    args = ("--group", "lab", "--via", "mqtt", "--inventory", str(inv))
    try:
        with Controller(_controller(broker, hermetic), client_id="hostile-test") as c:
            for n, (what, payload) in enumerate([*HOSTILE_STATUSES.items(), ("markup", MARKUP_STATUS)]):
                evil.status(payload)
                good.status(status_doc("good", "committed", release=f"r{n}"))  # after the bad one: still read
                st = c.wait_status("good", lambda s, n=n: s.get("release") == f"r{n}", 10)  # type: ignore[misc]
                assert st.get("release") == f"r{n}", (what, c.statuses)
                bad = c.statuses["evil"]
                if what == "markup":
                    assert bad["state"] == "refused" and bad["release"] == "[/]", bad
                else:
                    assert bad["state"] == "unreadable" and bad["message"], (what, bad)
                    assert set(bad) == {"device", "state", "code", "message"}  # nothing the device wrote

                r = cli("status", *args, "--json")
                assert r.code == 5 and "Traceback" not in r.err, (what, r)  # one of two ok: partial, never 70
                shown = json.loads(r.out)["devices"]
                assert shown["good"]["state"] == "committed" and shown["evil"]["state"] in ("unreadable", "refused")
                if what in ("deep list", "a list", "a huge string", "markup"):  # the table too (each call ~1 s)
                    r = cli("status", *args)
                    assert r.code == 5 and "Traceback" not in r.err and "good" in r.out, (what, r)
        r = cli("status", *args)
        assert "[/]" in r.out, r.out  # the device's text shown as text
    finally:
        good.close()
        evil.close()


def test_rollout_plans_around_an_unreadable_device(
    cli: Cli, two_devices: tuple[LocalBroker, Path], hermetic: Path, tmp_path: Path
) -> None:
    """Dry run and a real rollout with one device unreadable: planned and failed on its own, exit 1 or 5, never 70."""
    broker, inv = two_devices
    generate_key("fleet-1")
    sign_bundle(make_bundle(tmp_path / "b"), "fleet-1", tmp_path / "s.edb")
    with LocalRegistry(tmp_path / "origin", users=dict([PUBLISHER])) as origin:
        publish(tmp_path / "s.edb", f"{origin.address}/models/toy", user=PUBLISHER[0], password=PUBLISHER[1])
        evil = DeviceClient(broker, "evil")
        try:
            args = (str(tmp_path / "s.edb"), "--group", "lab", "--via", "mqtt", "--inventory", str(inv))
            for payload in (b"[" * 100000, b"[1, 2]", b'"text"', MARKUP_STATUS):
                evil.status(payload)
                r = cli("rollout", *args, "--canary", "0", "--dry-run")
                assert r.code == 0 and "Traceback" not in r.err, r
                assert "evil" in r.out and "good" in r.out, r.out
            evil.status(b"[" * 60000)
            r = cli("rollout", *args, "--canary", "0", "--timeout", "1", "--pull-timeout", "1", "--json")
            assert r.code == 1 and "Traceback" not in r.err, r  # nobody runs a watch here: both time out
            devices = json.loads(r.out)["devices"]
            assert {n: d["code"] for n, d in devices.items()} == {"good": "timeout", "evil": "timeout"}, devices
        finally:
            evil.close()


def test_a_deep_desired_document_is_refused_without_a_crash_loop_and_serials_follow_the_device(
    cli: Cli, pull_fleet: PullFleet, mnist_bundle: Path, tmp_path: Path, hermetic: Path
) -> None:
    """Issue 40 #7 and #8: the retained deep document is refused on every start, the watch keeps running; a
    refusal names its serial (the rollout ends at once with the device's reason, not a timeout); a device
    that acted on a serial far ahead of this host's clock still takes this host's next rollout."""
    fleet = pull_fleet
    settings = MqttSettings(
        broker=fleet.broker.controller_address, password_file=str(hermetic / "config" / "mqtt-controller")
    )
    a, b = signed(cli, mnist_bundle, tmp_path / "a.edb"), signed(cli, mnist_bundle, tmp_path / "b.edb")
    refs = [
        publish(x, f"{fleet.origin.address}/models/mnist", user=PUBLISHER[0], password=PUBLISHER[1]).ref for x in (a, b)
    ]
    dev = fleet.start("dev1")
    with Controller(settings, client_id="deep-test") as c:
        assert c.wait_status("dev1", lambda s: s.get("state") == "idle", 30).get("state") == "idle", dev.log()
        for deep in (b"[" * 60000, b"[" * 100000, b'{"doc":' * 20000):
            c.client.publish(desired_topic("dev1"), deep, qos=1, retain=True).wait_for_publish(10)
            st = c.wait_status("dev1", lambda s: s.get("state") == "refused", 30)
            assert st.get("code") == "desired-refused" and "malformed" in st.get("message", ""), (st, dev.log())
            fleet.stop("dev1")  # a restart meets the same retained document
            c.statuses.pop("dev1", None)
            dev = fleet.start("dev1")
            st = c.wait_status("dev1", lambda s: s.get("state") == "refused", 30)
            assert st.get("code") == "desired-refused", (st, dev.log())
            time.sleep(1)
            assert dev.proc is not None and dev.proc.poll() is None, dev.log()  # still running, not restarting
            assert "Traceback" not in dev.log() and "RecursionError" not in dev.log()

        # a host whose clock is a year ahead signed for this device (the old scheme used Unix time as the serial)
        ahead = int(time.time()) + 365 * 86400
        c.publish_desired(
            "dev1", desired_payload("rollout-1", "dev1", refs[0], "", "t", 0, ahead, health=DesiredHealth())
        )
        st = c.wait_status("dev1", lambda s: s.get("serial") == ahead and s.get("state") == "committed", 120)
        assert st.get("state") == "committed" and st.get("floor") == ahead, (st, dev.log())

    # this host's rollout goes on from the device's serial, whatever this host's clock says
    r = cli(
        "rollout", str(b), "--devices", "dev1", "--via", "mqtt", "--canary", "0", "--json", *fleet.args(), timeout=240
    )
    assert r.code == 0, r.out + r.err + dev.log()
    assert dev.current() == read_manifest(b).release_name
    with Controller(settings, client_id="deep-test-2") as c:
        assert c.read_statuses(["dev1"])["dev1"]["serial"] == ahead + 1

    # desired state that expired on its way (or a controller clock far behind): refused with the serial it
    # names, so the rollout ends at once with the device's reason instead of waiting out --timeout
    fleet_toml = hermetic / "config" / "fleet.toml"
    fleet_toml.write_text(fleet_toml.read_text().replace("expires_hours = 1.0", "expires_hours = 0.0000001"))
    t0 = time.monotonic()
    r = cli(
        "rollout", str(a), "--devices", "dev1", "--via", "mqtt", "--canary", "0", "--timeout", "300",
        "--pull-timeout", "300", "--json", *fleet.args(), timeout=240,
    )  # fmt: skip
    took = time.monotonic() - t0
    assert r.code == 1, r.out + r.err
    d = json.loads(r.out)["devices"]["dev1"]
    assert d["code"] == "desired-refused" and "expired" in d["detail"] and took < 60, (d, took)
    assert dev.current() == read_manifest(b).release_name


def test_a_hostile_device_does_not_stop_a_rollout_to_the_others(
    cli: Cli, pull_fleet: PullFleet, mnist_bundle: Path, tmp_path: Path
) -> None:
    """Issue 40 #1 as the harness ran it: dev2's account writes deep nesting again and again while a real watch
    agent on dev1 takes the rollout; dev1 is committed, dev2 fails on its own."""
    fleet = pull_fleet
    bundle = signed(cli, mnist_bundle, tmp_path / "a.edb")
    publish(bundle, f"{fleet.origin.address}/models/mnist", user=PUBLISHER[0], password=PUBLISHER[1])
    dev = fleet.start("dev1")
    evil = DeviceClient(fleet.broker, "dev2")
    stop = threading.Event()

    def spam() -> None:
        payloads = [b"[" * 100000, b"[" * 60000, b"[1, 2]", b'"text"', MARKUP_STATUS.replace(b"evil", b"dev2")]
        n = 0
        while not stop.wait(0.2):
            evil.status(payloads[n % len(payloads)])
            n += 1

    spammer = threading.Thread(target=spam, daemon=True)
    spammer.start()
    try:
        wait_for(lambda: json.loads(cli("status", "--group", "lab", "--via", "mqtt", "--json", *fleet.args()).out)[
            "devices"]["dev1"] is not None, 30)  # fmt: skip
        r = cli("rollout", str(bundle), "--group", "lab", "--via", "mqtt", "--canary", "0", "--dry-run", *fleet.args())
        assert r.code == 0 and "Traceback" not in r.err, r
        r = cli(
            "rollout", str(bundle), "--group", "lab", "--via", "mqtt", "--canary", "0", "--timeout", "30",
            "--pull-timeout", "15", "--json", *fleet.args(), timeout=240,
        )  # fmt: skip
        assert r.code == 5, r.out + r.err + dev.log()  # partial: dev1 ok, dev2 not
        devices = json.loads(r.out)["devices"]
        assert devices["dev1"]["status"] == "committed" and devices["dev2"]["code"] == "timeout", devices
        assert dev.current() == read_manifest(bundle).release_name
        r = cli("status", "--group", "lab", "--via", "mqtt", "--json", *fleet.args())
        assert r.code == 5 and json.loads(r.out)["devices"]["dev1"]["state"] == "committed", r
    finally:
        stop.set()
        spammer.join(5)
        evil.close()


def test_a_status_topic_message_is_never_taken_for_another_device(
    two_devices: tuple[LocalBroker, Path], hermetic: Path
) -> None:
    """The controller reads the device from the topic and checks the document names it (the ACL lets a device
    write only its own topic; the document cannot claim another's)."""
    broker, _ = two_devices
    evil = DeviceClient(broker, "evil")
    try:
        with Controller(_controller(broker, hermetic), client_id="topic-test") as c:
            evil.status(canonical_json({"device": "good", "state": "committed", "release": "r9"}))
            st = c.wait_status("evil", lambda s: bool(s), 10)
            assert st["state"] == "unreadable" and "good" not in c.statuses, c.statuses
    finally:
        evil.close()

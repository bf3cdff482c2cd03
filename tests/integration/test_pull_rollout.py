"""Pull rollouts end to end: publish to a real registry, desired state through a real mosquitto, real
`edgedeploy-agent watch` processes pulling from a pull-through cache and deploying real bundles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgedeploy_agent.bundle import read_manifest
from tests.helpers import Cli, assert_one_line_error, require
from tests.integration.pullfleet import PUBLISHER, PullFleet, signed, wait_for

pytestmark = pytest.mark.integration


def test_publish_rollout_status_via_mqtt(
    cli: Cli, pull_fleet: PullFleet, mnist_bundle: Path, tmp_path: Path, hermetic: Path
) -> None:
    fleet = pull_fleet
    bundle = signed(cli, mnist_bundle, tmp_path / "signed.edb")
    release = read_manifest(bundle).release_name
    registry = f"{fleet.origin.address}/models/mnist"

    # publishing needs the push account; without it the registry refuses, in one line
    assert_one_line_error(cli("publish", str(bundle), "--registry", registry), 4, "401")
    assert_one_line_error(cli("publish", str(bundle), "--registry", "no-repo"), 2, "HOST:PORT/REPO")
    env = {"EDGEDEPLOY_REGISTRY_PASSWORD": PUBLISHER[1]}
    r = cli("publish", str(bundle), "--registry", registry, "--user", PUBLISHER[0], "--json", env=env)
    assert r.code == 0, r.err
    pub = json.loads(r.out)
    assert pub["ref"].startswith(f"{registry}@sha256:") and len(pub["uploaded"]) >= 3 and not pub["skipped"]
    again = json.loads(
        cli("publish", str(bundle), "--registry", registry, "--user", PUBLISHER[0], "--json", env=env).out
    )
    assert again["ref"] == pub["ref"] and not again["uploaded"]  # publish once: the registry has every blob

    for name in fleet.devices:
        fleet.start(name)
    r = cli("status", "--group", "lab", "--via", "mqtt", "--json", *fleet.args())
    wait_for(
        lambda: all(
            st and st["state"] == "idle"
            for st in json.loads(cli("status", "--group", "lab", "--via", "mqtt", "--json", *fleet.args()).out)[
                "devices"
            ].values()
        ),
        20,
    )

    r = cli("rollout", str(bundle), "--group", "lab", "--via", "mqtt", "--wave", "50%", "--dry-run", *fleet.args())
    assert r.code == 0 and "canary   dev1" in r.out and "wave 1   dev2" in r.out, r.out + r.err
    assert not list((hermetic / "state").glob("rollouts/*.json"))  # a dry run records (and publishes) nothing

    r = cli(
        "rollout", str(bundle), "--group", "lab", "--via", "mqtt", "--canary", "1", "--wave", "50%",
        "--max-fail", "10%", "--json", *fleet.args(), timeout=240,
    )  # fmt: skip
    assert r.code == 0, r.out + r.err + "".join(d.log() for d in fleet.devices.values())
    state = json.loads(r.out)
    assert state["options"]["via"] == "mqtt" and state["waves"] == [["dev1"], ["dev2"]]
    assert [p.stem for p in (hermetic / "state").glob("rollouts/*.json")] == [state["id"]]
    assert {n: d["status"] for n, d in state["devices"].items()} == {"dev1": "committed", "dev2": "committed"}
    assert all(d.current() == release for d in fleet.devices.values())

    r = cli("status", "--group", "lab", "--via", "mqtt", "--json", *fleet.args())
    assert r.code == 0, r.err
    statuses = json.loads(r.out)["devices"]
    assert {n: (st["state"], st["release"]) for n, st in statuses.items()} == {
        "dev1": ("committed", release),
        "dev2": ("committed", release),
    }
    r = cli("status", "--group", "lab", "--via", "mqtt", *fleet.args())
    assert r.code == 0 and "2 of 2 reported" in r.out and r.out.count("committed") == 2, r.out + r.err

    # a second bundle, then a fleet rollback over MQTT: each device goes back to the release it kept
    second = signed(cli, mnist_bundle, tmp_path / "second.edb")
    assert cli("publish", str(second), "--registry", registry, "--user", PUBLISHER[0], env=env).code == 0
    r = cli("rollout", str(second), "--group", "lab", "--via", "mqtt", "--canary", "0", *fleet.args(), timeout=240)
    assert r.code == 0, r.out + r.err
    assert all(d.current() == read_manifest(second).release_name for d in fleet.devices.values())
    r = cli("rollback", "--group", "lab", "--via", "mqtt", "--json", *fleet.args(), timeout=240)
    assert r.code == 0, r.out + r.err
    back = json.loads(r.out)  # the SSH fan-out's shape: {"succeeded": {device: result}, "failed": {...}}
    assert {n: st["outcome"] for n, st in back["succeeded"].items()} == {"dev1": "rolled-back", "dev2": "rolled-back"}
    assert back["failed"] == {}
    assert all(d.current() == release for d in fleet.devices.values())

    # the devices' endpoint (the pull-through cache) served the bytes, and it refuses pushes
    assert fleet.cache.requests().get("GET blobs", 0) >= 2 * 3
    assert fleet.cache.requests().get("PUT blobs", 0) == 0


# paho drops the socket of a failed TLS handshake without closing it (a ResourceWarning at garbage collection)
@pytest.mark.fleet_servers
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_broker_over_tls_with_a_fleet_ca(tmp_path: Path, hermetic: Path) -> None:
    """The agent and the controller reach the broker over TLS, checked against the fleet CA; without the CA
    the controller refuses the broker."""
    import subprocess

    from edgedeploy.errors import ConnectionFailed
    from edgedeploy.fleet_servers import LocalBroker, servers_available
    from edgedeploy.remote.mqtt import Controller, MqttSettings
    from tests.helpers import BIN, agent

    require("FLEET_SERVERS", servers_available())
    with LocalBroker({"dev1": "pw1"}, "ctl-pw", tls=True) as broker:
        assert broker.ca_file and broker.tls_port
        root = tmp_path / "dev1"
        assert agent("--root", str(root), "init", "--device-name", "dev1", "--service", "process").code == 0
        (tmp_path / "pw").write_text("pw1")
        tls = f"127.0.0.1:{broker.tls_port}"
        r = agent("--root", str(root), "watch-config", "--broker", tls, "--registry", "http://127.0.0.1:9",
                  "--password-file", str(tmp_path / "pw"), "--ca-file", str(broker.ca_file))  # fmt: skip
        assert r.code == 0, r.err
        watch = subprocess.Popen([str(BIN / "edgedeploy-agent"), "--root", str(root), "watch"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            (tmp_path / "ctl").write_text("ctl-pw")
            tls = f"127.0.0.1:{broker.controller_tls_port}"  # the controller's own TLS listener
            settings = MqttSettings(broker=tls, password_file=str(tmp_path / "ctl"), ca_file=str(broker.ca_file))
            with Controller(settings, client_id="tls-controller") as c:
                assert c.wait_status("dev1", lambda st: st.get("state") == "idle", 30).get("state") == "idle"
            with pytest.raises(ConnectionFailed):  # the system's CAs do not vouch for the fleet's broker
                untrusted = MqttSettings(
                    broker=tls, password_file=str(tmp_path / "ctl"), ca_file="/etc/ssl/certs/ca-certificates.crt"
                )
                with Controller(untrusted, client_id="tls-controller-2"):
                    pass
        finally:
            watch.terminate()
            watch.wait(10)
